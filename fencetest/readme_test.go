package fencetest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client/fence"
	"github.com/lockd/lockd/internal/pgtest"
)

// readmeRecipe is the README's Fencing section's two blocks: the psql
// script (its file name from its first line) and the lockctl command.
func readmeRecipe(t *testing.T) (scriptName, script, command string) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Fencing\n")
	if !ok {
		t.Fatal("README.md has no Fencing section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	m := regexp.MustCompile("(?s)```sql\n(-- ([a-z-]+\\.sql):.*?)```\n.*?```sh\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("README.md's Fencing section has no ```sql block naming its file followed by a ```sh block")
	}
	return m[2], m[1], m[3]
}

// The README's lockctl exec and psql recipe, run as written: A's psql is
// held at a gate (a psql earlier on PATH waits on a FIFO, then runs the
// real one) while A's lockctl and command are stopped with SIGSTOP past
// their 2 s lease; B runs the recipe and pays the invoice; A's psql is
// continued and refused by the fence; then A's lockctl is continued.
func TestPauseREADMERecipe(t *testing.T) {
	scriptName, script, command := readmeRecipe(t)
	pg := pgtest.Start(t)
	db := pg.Open(t)
	if err := fence.NewSQL(db, fence.Postgres).Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE invoices (id integer PRIMARY KEY, state text NOT NULL, paid_by bigint); INSERT INTO invoices VALUES (42, 'open', NULL)`); err != nil {
		t.Fatal(err)
	}
	addr := startSingle(t)
	bin := binaries(t)
	realPsql := filepath.Join(pg.BinDir, "psql")

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, scriptName), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	gate, ready := filepath.Join(dir, "gate"), filepath.Join(dir, "ready")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	gated := filepath.Join(dir, "gated")
	if err := os.Mkdir(gated, 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := fmt.Sprintf("#!/bin/sh\necho \"$LOCKD_TOKEN $$\" > %[1]s.tmp && mv %[1]s.tmp %[1]s\nread line < %[2]s\nexec %[3]s \"$@\"\n", ready, gate, realPsql)
	if err := os.WriteFile(filepath.Join(gated, "psql"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	recipe := func(path, lease, wait string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", command)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append(pg.Env(), "PATH="+path+":"+os.Getenv("PATH"),
			"LOCKD_ADDR="+addr, "LOCKD_LEASE="+lease, "LOCKD_WAIT="+wait)...)
		// Its own process group: lockctl and the shell stop together.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}

	var outA bytes.Buffer
	a := recipe(gated+":"+bin+":"+pg.BinDir, "2s", "10s")
	a.Stdout, a.Stderr = &outA, &outA
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait returns once A's shell exits, though its command's group
	// may still hold the output pipe.
	a.WaitDelay = time.Second
	var errA error
	exitedA := make(chan struct{})
	go func() { errA = a.Wait(); close(exitedA) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-a.Process.Pid, syscall.SIGKILL)
		<-exitedA
		// lockctl, killed, leaves its command's group behind: end it too.
		if b, err := os.ReadFile(ready); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 {
				if pid, err := strconv.Atoi(f[1]); err == nil {
					_ = syscall.Kill(-pid, syscall.SIGKILL)
					_ = syscall.Kill(-pid, syscall.SIGCONT)
				}
			}
		}
	})

	tokenA, psqlA := waitReady(t, ready, &outA)
	commandGroup, err := syscall.Getpgid(psqlA)
	if err != nil {
		t.Fatal(err)
	}
	for _, group := range []int{a.Process.Pid, commandGroup} {
		if err := syscall.Kill(-group, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	b := recipe(bin+":"+pg.BinDir, "10s", "20s")
	outB, err := runWithin(ctx, b)
	if err != nil {
		t.Fatalf("B's recipe: %v\n%s", err, outB)
	}
	state, paidBy, mark := invoice(t, db)
	if state != "paid" || paidBy <= tokenA || mark != paidBy {
		t.Fatalf("after B: invoice %s, paid by %d, mark %d; want paid by B, with a token above A's %d", state, paidBy, mark, tokenA)
	}
	tokenB := paidBy

	// A's psql goes first: the fence, not lockctl's lease timer, must stop it.
	if err := syscall.Kill(-commandGroup, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	g, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = g.WriteString("go\n")
	g.Close()
	waitExited(t, psqlA)
	if err := syscall.Kill(-a.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exitedA:
		t.Logf("A's recipe after its pause: %v\n%s", errA, outA.String())
		var exit *exec.ExitError
		if !errors.As(errA, &exit) || !strings.Contains(outA.String(), `no rows returned for \gset`) {
			t.Errorf("A's recipe after its pause: %v; want a failure of psql's fence\n%s", errA, outA.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("A's lockctl did not exit within 20 s of being continued\n%s", outA.String())
	}
	if state, paidBy, mark := invoice(t, db); state != "paid" || paidBy != tokenB || mark != tokenB {
		t.Errorf("after A: invoice %s, paid by %d, mark %d; want B's token %d (A's was %d)", state, paidBy, mark, tokenB, tokenA)
	}
}

func invoice(t *testing.T, db *sql.DB) (state string, paidBy, mark uint64) {
	t.Helper()
	var paid sql.NullInt64
	if err := db.QueryRow(`SELECT state, paid_by, (SELECT token FROM lockd_fences WHERE key = 'invoice/42') FROM invoices WHERE id = 42`).Scan(&state, &paid, &mark); err != nil {
		t.Fatal(err)
	}
	return state, uint64(paid.Int64), mark
}

// waitReady waits up to 20 s for the gated psql's "TOKEN PID" in ready.
func waitReady(t *testing.T, ready string, out *bytes.Buffer) (token uint64, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(ready)
		if err == nil {
			fields := strings.Fields(string(b))
			if len(fields) == 2 {
				token, err1 := strconv.ParseUint(fields[0], 10, 64)
				pid, err2 := strconv.Atoi(fields[1])
				if err1 == nil && err2 == nil {
					return token, pid
				}
			}
			t.Fatalf("the gated psql wrote %q", b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's psql did not start within 20 s (lockctl: %s)", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitExited waits up to 10 s until pid has exited (gone, or a zombie
// its stopped parent has not reaped).
func waitExited(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the command name's closing parenthesis.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("A's psql (pid %d) did not exit within 10 s of its gate opening", pid)
}

// runWithin runs cmd to completion and returns its combined output.
func runWithin(ctx context.Context, cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return out.Bytes(), ctx.Err()
	}
}
