package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/server"
	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}

func startServer(t *testing.T, auth map[string][]byte) string {
	t.Helper()
	return startLockd(t, auth).Addr()
}

func startLockd(t *testing.T, auth map[string][]byte) *server.Server {
	t.Helper()
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Auth: auth, Engine: engine.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// deadAddr is a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// syncBuffer is written by a command's output copier while the test reads.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{} // closed by the next Write; nil until awaited
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written != nil {
		close(b.written)
		b.written = nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// awaitOutput blocks until the output contains s, written by a command
// that lockctl's run, ending on exited, supervises; it fails the test if
// run ends first.
func (b *syncBuffer) awaitOutput(t *testing.T, s string, exited <-chan int) {
	t.Helper()
	for {
		b.mu.Lock()
		if strings.Contains(b.buf.String(), s) {
			b.mu.Unlock()
			return
		}
		if b.written == nil {
			b.written = make(chan struct{})
		}
		written := b.written
		b.mu.Unlock()
		select {
		case <-written:
		case code := <-exited:
			t.Fatalf("lockctl ended (exit %d) before the command wrote %q; it wrote %q", code, s, b.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("the command did not write %q; it wrote %q", s, b.String()) // a hung test, not a deadline
		}
	}
}

type ctl struct {
	env     map[string]string
	stdin   io.Reader
	signals <-chan os.Signal // the signals lockctl is sent; none when nil
}

func (c ctl) run(args ...string) (code int, stdout, stderr string) {
	var out, errs syncBuffer
	lookup := func(name string) (string, bool) {
		v, ok := c.env[name]
		return v, ok
	}
	stdin := c.stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	code = run(context.Background(), args, lookup, proc{in: stdin, out: &out, err: &errs, signals: c.signals})
	return code, out.String(), errs.String()
}

func TestAcquireAndRelease(t *testing.T) {
	addr := startServer(t, nil)
	code, out, errs := ctl{}.run("acquire", "--addr", addr, "--lease", "1m", "jobs/nightly")
	token := strings.TrimSpace(out)
	if code != exitOK || token == "" {
		t.Fatalf("acquire: %d %q %q", code, out, errs)
	}
	if code, _, _ := (ctl{}).run("acquire", "--addr", addr, "jobs/nightly"); code != exitNotAcquired {
		t.Fatalf("acquire of a held key: exit %d, want %d", code, exitNotAcquired)
	}
	if code, _, errs := (ctl{}).run("release", "--addr", addr, "jobs/nightly", token); code != exitOK {
		t.Fatalf("release: %d %s", code, errs)
	}
	if code, _, _ := (ctl{}).run("release", "--addr", addr, "jobs/nightly", token); code != exitNotHeld {
		t.Fatalf("second release: exit %d, want %d", code, exitNotHeld)
	}
}

func TestWaitThatRunsOutOnAHeldLockIsNotAcquired(t *testing.T) {
	addr := startServer(t, nil)
	if code, _, errs := (ctl{}).run("acquire", "--addr", addr, "--lease", "1m", "held"); code != exitOK {
		t.Fatalf("first acquire: %d %s", code, errs)
	}
	for _, args := range [][]string{
		{"acquire", "--addr", addr, "--wait", "1s", "held"},
		{"exec", "--addr", addr, "--wait", "1s", "held", "--", "true"},
	} {
		code, _, errs := ctl{}.run(args...)
		if want := "lockctl: held is held; not acquired within 1s\n"; code != exitNotAcquired || errs != want {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", args[0], code, errs, exitNotAcquired, want)
		}
		code, _, errs = ctl{}.run(append([]string{args[0], "--verbose"}, args[1:]...)...)
		if code != exitNotAcquired || !strings.Contains(errs, "is held; not acquired within 1s") || !strings.Contains(errs, "indeterminate") {
			t.Errorf("%s --verbose: exit %d, stderr %q; want the plain line and the client's answer", args[0], code, errs)
		}
	}
}

func TestExecHoldsTheLockAndPassesTheToken(t *testing.T) {
	addr := startServer(t, nil)
	stdin, feed := io.Pipe()
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		lookup := func(string) (string, bool) { return "", false }
		done <- run(context.Background(),
			[]string{"exec", "--addr", addr, "k", "--", "sh", "-c", `echo "$LOCKD_KEY $LOCKD_TOKEN"; read line; exit 7`},
			lookup, proc{in: stdin, out: &out, err: io.Discard})
	}()
	out.awaitOutput(t, "\n", done)
	fields := strings.Fields(out.String())
	if len(fields) != 2 || fields[0] != "k" {
		t.Fatalf("command printed %q", out.String())
	}
	token, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil || token == 0 {
		t.Fatalf("LOCKD_TOKEN %q", fields[1])
	}

	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{addr}, Sessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := client.AcquireOptions{MinWorkBudget: client.Budget(0)}
	if _, err := c.Acquire(context.Background(), "k", opts); !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("the lock is not held while the command runs: %v", err)
	}

	feed.Write([]byte("go\n"))
	feed.Close()
	if code := <-done; code != 7 {
		t.Fatalf("exit %d, want the command's 7", code)
	}
	next, err := c.Acquire(context.Background(), "k", opts)
	if err != nil {
		t.Fatalf("the lock was not released after the command: %v", err)
	}
	if next.Token() <= token {
		t.Fatalf("token %d after %d", next.Token(), token)
	}
}

func TestExecTerminatesTheCommandBeforeTheLeaseLapses(t *testing.T) {
	addr := startServer(t, nil)
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--keepalive=false", "--lease", "1s", "--grace", "500ms", "k", "--", "sleep", "30")
	if code != exitLeaseEnded || !strings.Contains(errs, "SIGTERM") || !strings.Contains(errs, "status 143") {
		t.Fatalf("exit %d (%s), want %d after SIGTERM ended the command (143)", code, errs, exitLeaseEnded)
	}
	checkReleasedWhileHeld(t, errs)
}

// checkReleasedWhileHeld fails the test if exec's release, after the
// command ended, found the lease lapsed on the server: the server, not the
// test's clock, says whether the command was stopped before the lease
// ended.
func checkReleasedWhileHeld(t *testing.T, errs string) {
	t.Helper()
	if strings.Contains(errs, "was no longer held when it was released") {
		t.Fatalf("the lease lapsed before the command was stopped: %s", errs)
	}
}

func TestExecKillsACommandThatIgnoresSIGTERM(t *testing.T) {
	addr := startServer(t, nil)
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--keepalive=false", "--lease", "1s", "--grace", "300ms", "k", "--",
		"sh", "-c", `trap "" TERM; sleep 30`)
	if code != exitLeaseEnded || !strings.Contains(errs, "SIGKILL") || !strings.Contains(errs, "status 137") {
		t.Fatalf("exit %d (%s), want %d after SIGKILL ended the command (137)", code, errs, exitLeaseEnded)
	}
}

// TestExecSignalledAtTheLeaseIsDistinctEvenIfTheCommandExitsZero: a
// command that handles SIGTERM by exiting 0 did not finish its work, and
// the script running lockctl must be able to tell.
func TestExecSignalledAtTheLeaseIsDistinctEvenIfTheCommandExitsZero(t *testing.T) {
	addr := startServer(t, nil)
	code, _, errs := ctl{}.run("exec", "--addr", addr, "--keepalive=false", "--lease", "1s", "--grace", "500ms", "k", "--",
		"sh", "-c", `trap "exit 0" TERM; sleep 30 & wait`)
	if code != exitLeaseEnded || !strings.Contains(errs, "status 0") {
		t.Fatalf("exit %d (%s), want %d although the command exited 0", code, errs, exitLeaseEnded)
	}
}

// TestExecKillsWhatTheCommandLeftRunningBeforeItReleases: a command that
// backgrounds a process and exits must not leave that process running
// without the lock. The server checks, when the RELEASE arrives, that the
// background process is gone.
func TestExecKillsWhatTheCommandLeftRunningBeforeItReleases(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	atRelease := make(chan error, 1)
	srv, err := lockdtest.Start(func(c *lockdtest.Conn) {
		if c.Handshake(nil) != nil {
			return
		}
		c.Serve(func(c *lockdtest.Conn, req *codec.Request) {
			switch req.Op {
			case codec.OpAcquire:
				c.QueueAcquired(req.Owner, 1, 0)
			case codec.OpRelease:
				atRelease <- processGone(pidFile)
				c.QueueReply(codec.OpReleased, req.Owner)
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	t.Cleanup(func() { killPIDFile(pidFile) })

	// Files, as a shell gives lockctl: with a buffer, os/exec would copy
	// through a pipe and wait for the background process to close it.
	output, err := os.Create(filepath.Join(t.TempDir(), "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer output.Close()
	code := run(context.Background(), []string{"exec", "--addr", srv.Addr(), "k", "--",
		"sh", "-c", `sleep 600 & echo $! > "$0"; exit 0`, pidFile},
		func(string) (string, bool) { return "", false }, proc{in: strings.NewReader(""), out: output, err: output})
	if code != exitOK {
		text, _ := os.ReadFile(output.Name())
		t.Fatalf("exit %d (%s), want the command's 0", code, text)
	}
	select {
	case err := <-atRelease:
		if err != nil {
			t.Fatalf("at the release: %v", err)
		}
	default:
		t.Fatal("lockctl exited without releasing")
	}
}

// processGone reports whether the process whose pid is in file no longer
// exists (nor lingers unreaped).
func processGone(file string) error {
	text, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(text)))
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("the command's background process %d still exists (kill 0: %v)", pid, err)
	}
	return nil
}

func killPIDFile(file string) {
	if text, err := os.ReadFile(file); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(text))); err == nil && pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestExecOfAMissingCommandReleasesTheLock(t *testing.T) {
	addr := startServer(t, nil)
	if code, _, _ := (ctl{}).run("exec", "--addr", addr, "k", "--", "/nonexistent/command"); code != exitNotFound {
		t.Fatalf("exit %d, want %d", code, exitNotFound)
	}
	if code, _, errs := (ctl{}).run("acquire", "--addr", addr, "k"); code != exitOK {
		t.Fatalf("the lock was left held: %d %s", code, errs)
	}
}

func TestSettingsFromTheEnvironment(t *testing.T) {
	secret := []byte("a shared secret of the t1 tenant")
	addr := startServer(t, map[string][]byte{"t1": secret})
	env := map[string]string{"LOCKD_ADDR": addr, "LOCKD_TENANT": "t1", "LOCKD_SECRET": hex.EncodeToString(secret)}
	if code, _, errs := (ctl{env: env}).run("acquire", "a"); code != exitOK {
		t.Fatalf("LOCKD_SECRET: %d %s", code, errs)
	}

	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env = map[string]string{"LOCKD_ADDR": addr, "LOCKD_TENANT": "t1", "LOCKD_SECRET": "00", "LOCKD_SECRET_FILE": file}
	if code, _, errs := (ctl{env: env}).run("acquire", "b"); code != exitOK {
		t.Fatalf("LOCKD_SECRET_FILE over LOCKD_SECRET: %d %s", code, errs)
	}
	if code, _, _ := (ctl{env: env}).run("acquire", "--secret-file", "/nonexistent", "c"); code != exitFailure {
		t.Fatal("--secret-file must win over LOCKD_SECRET_FILE")
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := (ctl{env: env}).run("acquire", "c"); code != exitFailure || !strings.Contains(errs, "chmod 600 "+file) {
		t.Fatalf("a secret file others can read must be refused with the fix: %d %s", code, errs)
	}
	env["LOCKD_SECRET_FILE"] = ""
	if code, _, errs := (ctl{env: env}).run("acquire", "c"); code != exitFailure || !strings.Contains(errs, "authentication") {
		t.Fatalf("wrong secret: %d %s", code, errs)
	}
}

func TestAddressesAreRepeatableCommaListsThatReplaceTheDefaults(t *testing.T) {
	lookup := func(env map[string]string) func(string) (string, bool) {
		return func(name string) (string, bool) {
			v, ok := env[name]
			return v, ok
		}
	}
	cases := []struct {
		env  map[string]string
		args []string
		want []string
	}{
		{nil, nil, []string{"127.0.0.1:7420"}},
		{map[string]string{"LOCKD_ADDR": "x:1,y:2"}, nil, []string{"x:1", "y:2"}},
		{map[string]string{"LOCKD_ADDR": "x:1"}, []string{"--addr", "a:1,b:2", "--addr", "c:3"}, []string{"a:1", "b:2", "c:3"}},
	}
	for _, tc := range cases {
		o, _, _, err := parseFlags("acquire", append(tc.args, "k"), lookup(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(o.addrs.addrs, tc.want) {
			t.Errorf("env %v args %v: addresses %v, want %v", tc.env, tc.args, o.addrs.addrs, tc.want)
		}
	}

	addr := startServer(t, nil)
	if code, _, errs := (ctl{}).run("acquire", "--addr", deadAddr(t)+","+addr, "k"); code != exitOK {
		t.Fatalf("failover to the second address: %d %s", code, errs)
	}
}

func TestUsageErrors(t *testing.T) {
	addr := startServer(t, nil)
	cases := [][]string{
		{},
		{"lock"},
		{"acquire"},
		{"acquire", "--addr", addr, "a", "b"},
		{"release", "--addr", addr, "k"},
		{"release", "--addr", addr, "k", "not-a-number"},
		{"exec", "--addr", addr, "k"},
		{"exec", "--addr", addr, "k", "--"},
		{"exec", "--addr", addr, "--grace", "30s", "k", "--", "true"},
		{"acquire", "--addr", addr, "--lease", "2h", "k"},
		{"acquire", "--addr", addr, "--budget", "31s", "k"},
		{"acquire", "--addr", addr, "bad key"},
		{"acquire", "--lease", "soon", "k"},
	}
	for _, args := range cases {
		if code, _, _ := (ctl{}).run(args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}

func TestExecChildDoesNotInheritTheSecret(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "LOCKD_SECRET=00ff", "LOCKD_SECRET_FILE=/etc/s", "HOME=/root"})
	want := []string{"PATH=/bin", "LOCKD_SECRET_FILE=/etc/s", "HOME=/root"}
	if !slices.Equal(got, want) {
		t.Fatalf("child environment %q, want %q", got, want)
	}
}
