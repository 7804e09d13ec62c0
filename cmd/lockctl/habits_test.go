package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// running is a lockctl started in the background, its stdout read line
// by line.
type running struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *syncBuffer
	done   chan struct{}
}

func (b binary) start(t *testing.T, args ...string) *running {
	t.Helper()
	r := &running{cmd: exec.Command(string(b), args...), lines: make(chan string, 64), stderr: &syncBuffer{}, done: make(chan struct{})}
	r.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	r.cmd.Stderr = r.stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		scan := bufio.NewScanner(out)
		for scan.Scan() {
			r.lines <- scan.Text()
		}
		close(r.lines)
	}()
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() { _ = r.cmd.Process.Kill(); <-r.done })
	return r
}

// next is the next line lockctl printed; a hung test fails after 30 s.
func (r *running) next(t *testing.T) string {
	t.Helper()
	select {
	case line, ok := <-r.lines:
		if !ok {
			<-r.done
			t.Fatalf("lockctl exited (%v) before printing a line: %s", r.cmd.ProcessState, r.stderr.String())
		}
		return line
	case <-time.After(30 * time.Second):
		t.Fatalf("lockctl printed no line: %s", r.stderr.String())
	}
	return ""
}

// stop sends sig and returns the exit status.
func (r *running) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("lockctl did not exit after %v: %s", sig, r.stderr.String())
	}
	return r.cmd.ProcessState.ExitCode()
}

// tryAcquire is one immediate attempt at key: nil when granted (and
// released again), client.ErrTimeout when held.
func tryAcquire(t *testing.T, addr, key string) error {
	t.Helper()
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{addr}, Sessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ticket, err := c.Acquire(context.Background(), key, client.AcquireOptions{MinWorkBudget: client.Budget(0)})
	if err == nil {
		err = c.Release(context.Background(), ticket)
		if err != nil {
			t.Fatalf("release %s: %v", key, err)
		}
	}
	return err
}

// The command line habits of flock(1) and etcdctl users, through the
// built binary.
func TestCommandLineHabits(t *testing.T) {
	bin := buildBinary(t)
	addr, admin := startInspectable(t, nil)

	t.Run("global flags before the command", func(t *testing.T) {
		code, out, errs := bin.run(t, "--addr", addr, "acquire", "--lease", "1m", "early")
		if _, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64); code != exitOK || err != nil {
			t.Fatalf("lockctl --addr X acquire K: exit %d %q %q", code, out, errs)
		}
		token := strings.TrimSpace(out)
		code, out, errs = bin.run(t, "--admin", admin, "--json", "status", "early")
		if code != exitOK || !strings.Contains(out, `"held":true`) {
			t.Fatalf("lockctl --admin X --json status K: exit %d %q %q", code, out, errs)
		}
		if code, _, errs = bin.run(t, "--addr="+addr, "release", "early", token); code != exitOK {
			t.Fatalf("lockctl --addr=X release K TOKEN: exit %d %q", code, errs)
		}
	})

	t.Run("unknown command: one line and a pointer to the help", func(t *testing.T) {
		code, out, errs := bin.run(t, "--addr", addr, "aquire", "k")
		if code != exitUsage || out != "" || errs != "lockctl: unknown command \"aquire\"; run 'lockctl --help' for the commands\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
		}
	})

	t.Run("one wait range in seconds, defaults in every help", func(t *testing.T) {
		for _, command := range []string{"acquire", "exec", "elect"} {
			args := []string{command, "--addr", addr, "--wait", "300s", "k"}
			if command != "acquire" {
				args = append(args, "--", "true")
			}
			code, _, errs := bin.run(t, args...)
			if code != exitUsage || !strings.Contains(errs, "--wait 300s: want 0s..255s") {
				t.Errorf("%s --wait 300s: exit %d %q, want the range 0s..255s", command, code, errs)
			}
			_, help, _ := bin.run(t, command, "--help")
			for _, block := range strings.Split(help, "\n  --")[1:] {
				name, _, _ := strings.Cut(block, " ")
				if strings.HasPrefix(block, name+" duration") && !strings.Contains(block, "default") {
					t.Errorf("%s --help: --%s states no default", command, block)
				}
				if name == "wait" && !strings.Contains(block, "0s..255s") {
					t.Errorf("%s --help: --%s states no range", command, block)
				}
			}
		}
		_, help, _ := bin.run(t, "elect", "--help")
		if !strings.Contains(help, "default 255s") {
			t.Errorf("elect --help does not state --wait's default 255s:\n%s", help)
		}
	})

	t.Run("argument errors", func(t *testing.T) {
		code, _, errs := bin.run(t, "release", "--addr", addr, "k", "abc")
		if code != exitUsage || strings.Contains(errs, "strconv") || !strings.Contains(errs, `token "abc": want the number lockctl acquire printed`) {
			t.Errorf("release k abc: exit %d %q", code, errs)
		}
		code, _, errs = bin.run(t, "acquire", "--addr", addr)
		if code != exitUsage || !strings.HasPrefix(errs, "lockctl acquire: acquire needs 1 argument\n") {
			t.Errorf("acquire without a key: exit %d %q", code, errs)
		}
	})

	t.Run("elect --wait 0 is one attempt", func(t *testing.T) {
		code, out, errs := bin.run(t, "acquire", "--addr", addr, "--lease", "1m", "svc/taken")
		if code != exitOK {
			t.Fatalf("acquire: %d %s", code, errs)
		}
		code, _, errs = bin.run(t, "elect", "--addr", addr, "--wait", "0", "svc/taken", "--", "true")
		if code != exitNotAcquired || errs != "lockctl: svc/taken has a leader; not elected\n" {
			t.Fatalf("elect --wait 0 on a held name: exit %d %q", code, errs)
		}
		if code, _, errs := bin.run(t, "release", "--addr", addr, "svc/taken", strings.TrimSpace(out)); code != exitOK {
			t.Fatalf("release: %d %s", code, errs)
		}
	})
}

// acquire --hold keeps the lock past its lease, renewing it, until
// SIGTERM, then releases it and exits 0, as etcdctl lock NAME does.
func TestAcquireHoldUntilSignalled(t *testing.T) {
	bin := buildBinary(t)
	addr := startServer(t, nil)
	holder := bin.start(t, "acquire", "--hold", "--addr", addr, "--lease", "2s", "held")
	if token, err := strconv.ParseUint(holder.next(t), 10, 64); err != nil || token == 0 {
		t.Fatalf("acquire --hold printed no token: %v %s", err, holder.stderr.String())
	}
	// Renewed past two leases; the server's clock lets an unrenewed
	// lease lapse within 2 s.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if err := tryAcquire(t, addr, "held"); !errors.Is(err, client.ErrTimeout) {
			t.Fatalf("while lockctl holds it: %v, want the lock held", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if code := holder.stop(t, syscall.SIGTERM); code != exitOK {
		t.Fatalf("after SIGTERM: exit %d (%s), want 0", code, holder.stderr.String())
	}
	if err := tryAcquire(t, addr, "held"); err != nil {
		t.Fatalf("after lockctl released it: %v", err)
	}
}

// elect --listen prints the leader's term at the start and at every
// change, without campaigning, and exits 0 on SIGINT.
func TestElectListen(t *testing.T) {
	bin := buildBinary(t)
	addr, admin := startInspectable(t, nil)
	listener := bin.start(t, "elect", "--listen", "--admin", admin, "svc/leader")
	if line := listener.next(t); line != "no leader" {
		t.Fatalf("first line %q, want no leader", line)
	}
	code, out, errs := bin.run(t, "acquire", "--addr", addr, "--lease", "1m", "svc/leader")
	if code != exitOK {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	term := strings.TrimSpace(out)
	if line := listener.next(t); line != "term "+term {
		t.Fatalf("after a leader took the name: %q, want term %s", line, term)
	}
	if code, _, errs := bin.run(t, "release", "--addr", addr, "svc/leader", term); code != exitOK {
		t.Fatalf("release: %d %s", code, errs)
	}
	if line := listener.next(t); line != "no leader" {
		t.Fatalf("after the leader resigned: %q, want no leader", line)
	}
	if code := listener.stop(t, syscall.SIGINT); code != exitOK {
		t.Fatalf("after SIGINT: exit %d (%s)", code, listener.stderr.String())
	}
	if err := tryAcquire(t, addr, "svc/leader"); err != nil {
		t.Fatalf("the listener took the name: %v", err)
	}
}

// exec against a server that dies after the grant: the failed renewal is
// reported, the command is stopped before the lease may lapse (124), and
// the release waits at most until the lease has surely lapsed instead of
// ending "outcome indeterminate".
func TestExecWhenTheServerDies(t *testing.T) {
	bin := buildBinary(t)
	// The first KEEP ends the connection, and the server with it.
	died := make(chan struct{})
	var dying sync.Once
	srv, err := lockdtest.Start(func(c *lockdtest.Conn) {
		if c.Handshake(nil) != nil {
			return
		}
		c.Serve(func(c *lockdtest.Conn, req *codec.Request) {
			switch req.Op {
			case codec.OpAcquire:
				c.QueueAcquired(req.Owner, 1, 0)
			case codec.OpKeep:
				dying.Do(func() { close(died) })
				c.Close()
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	stop, closed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(closed)
		select {
		case <-died:
		case <-stop:
		}
		srv.Close()
	}()
	t.Cleanup(func() { close(stop); <-closed })
	code, _, errs := bin.run(t, "exec", "--addr", srv.Addr(), "--lease", "3s", "--grace", "1s", "k", "--", "sleep", "60")
	if code != exitLeaseEnded || !strings.Contains(errs, "SIGTERM") {
		t.Fatalf("exit %d (%s), want %d after SIGTERM", code, errs, exitLeaseEnded)
	}
	if !strings.Contains(errs, `renewing the lease of "k"`) {
		t.Errorf("the failed renewal was not reported: %s", errs)
	}
	if strings.Contains(errs, "indeterminate") || !(strings.Contains(errs, "nothing is held") || strings.Contains(errs, "nothing to release")) {
		t.Errorf("the release did not end with the lease: %s", errs)
	}
}
