package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"golang.org/x/sys/unix"
)

// execWithNoFile, in the environment of this test binary, makes it a
// launcher instead: it sets its own RLIMIT_NOFILE to "soft:hard" and
// execs the arguments, so that lockd starts under that limit.
const execWithNoFile = "LOCKD_TEST_EXEC_WITH_NOFILE"

func TestMain(m *testing.M) {
	if limit, ok := os.LookupEnv(execWithNoFile); ok {
		os.Exit(launchWithNoFile(limit, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func launchWithNoFile(limit string, argv []string) int {
	softText, hardText, _ := strings.Cut(limit, ":")
	soft, err1 := strconv.ParseUint(softText, 10, 64)
	hard, err2 := strconv.ParseUint(hardText, 10, 64)
	if err1 != nil || err2 != nil || len(argv) == 0 {
		fmt.Fprintf(os.Stderr, "%s=%q: want soft:hard and a command\n", execWithNoFile, limit)
		return 2
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: soft, Max: hard}); err != nil {
		fmt.Fprintln(os.Stderr, "setrlimit:", err)
		return 2
	}
	env := slicesWithout(os.Environ(), execWithNoFile+"=")
	if err := syscall.Exec(argv[0], argv, env); err != nil {
		fmt.Fprintln(os.Stderr, "exec:", err)
	}
	return 2
}

func slicesWithout(env []string, prefix string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, prefix) {
			out = append(out, kv)
		}
	}
	return out
}

// logLine is what the descriptor tests read from lockd's JSON log.
type logLine struct {
	Level, Message, Listen, Admin string
	NoFileLimit                   uint64 `json:"nofile_limit"`
	ConnCap                       int    `json:"conn_cap"`
	MaxConns                      int    `json:"max_conns"`
}

// watchedLockd is a lockd child whose log lines arrive on a channel.
type watchedLockd struct {
	cmd   *exec.Cmd
	lines chan logLine
	exit  chan error
	// capLine and serving are its start-up lines.
	capLine, serving logLine
}

// startWatched runs `lockd serve` (through the launcher when nofile is
// not empty) and waits for it to serve.
func startWatched(t *testing.T, nofile string, args ...string) *watchedLockd {
	t.Helper()
	argv := append([]string{buildLockd(t), "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", ""}, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	if nofile != "" {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(self, argv...)
		cmd.Env = append(os.Environ(), execWithNoFile+"="+nofile)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &watchedLockd{cmd: cmd, lines: make(chan logLine, 1024), exit: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				l.Message = sc.Text()
			}
			w.lines <- l
		}
		close(w.lines)
		w.exit <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range w.lines {
		}
		<-w.exit
	})
	for w.serving.Message == "" {
		l := w.next(t)
		switch {
		case strings.HasPrefix(l.Message, "connection cap"):
			w.capLine = l
		case l.Message == "lockd serving":
			w.serving = l
		}
	}
	if w.capLine.Message == "" {
		t.Fatal("lockd logged no connection cap before serving")
	}
	return w
}

func (w *watchedLockd) next(t *testing.T) logLine {
	t.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			t.Fatalf("lockd exited: %v", <-w.exit)
		}
		return l
	case <-time.After(30 * time.Second):
		t.Fatal("lockd logged nothing for 30 s")
	}
	panic("unreachable")
}

// greeted dials the client port and reports whether the greeting came.
func greeted(t *testing.T, addr string) (net.Conn, bool) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, false
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var r codec.Response
	if err := codec.NewResponseReader(nc, 256).Next(&r); err != nil || r.Op != codec.OpGreeting {
		nc.Close()
		return nil, false
	}
	return nc, true
}

func healthz(client *http.Client, admin string) (int, string, error) {
	resp, err := client.Get("http://" + admin + "/healthz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestDescriptorLimitNeverStopsTheClientPort: under a descriptor limit
// far below --max-conns, more connections than the limit (never sending
// HELLO) and a full admin cap leave the client port serving: the cap
// fitted under the limit closes the excess, accept never runs out of
// descriptors, and once the flood goes a new client is served.
func TestDescriptorLimitNeverStopsTheClientPort(t *testing.T) {
	const limit = 1024
	w := startWatched(t, fmt.Sprintf("%d:%d", limit, limit), "--drain-grace", "0")
	capLine := w.capLine
	if capLine.NoFileLimit != limit || capLine.MaxConns != 65536 || capLine.ConnCap <= 0 || capLine.ConnCap >= limit-64 {
		t.Fatalf("connection cap line: %+v; want the limit %d and a cap below it less the admin connections", capLine, limit)
	}
	if capLine.Level != "info" {
		t.Errorf("a cap below the default --max-conns is routine, an info: %+v", capLine)
	}

	var admins []net.Conn
	for range 64 + 16 { // past --admin-max-conns
		nc, err := net.Dial("tcp", w.serving.Admin)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		admins = append(admins, nc)
	}
	served := 0
	var flood []net.Conn
	for range limit + 100 {
		nc, ok := greeted(t, w.serving.Listen)
		if ok {
			served++
			flood = append(flood, nc)
		}
	}
	if served != capLine.ConnCap {
		t.Errorf("%d connections were served, want the logged cap %d", served, capLine.ConnCap)
	}
	for _, nc := range append(flood, admins...) {
		nc.Close()
	}

	// Closed connections leave the count as their loops notice; a new
	// client gets in once they have.
	deadline := time.Now().Add(10 * time.Second)
	for {
		nc, ok := greeted(t, w.serving.Listen)
		if ok {
			nc.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("after the flood no client is served: the client port stopped")
		}
	}
	if code, body, err := healthz(http.DefaultClient, w.serving.Admin); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz after the flood: %d %q %v", code, body, err)
	}
}

// TestClientPortStoppingFailsHealthzAndExitsNonZero: when gnet's reactor
// stops anyway (here: the descriptor limit is cut below what is open
// while lockd runs, so an accept fails), /healthz answers 503 and lockd
// exits 1 for its supervisor to restart it.
func TestClientPortStoppingFailsHealthzAndExitsNonZero(t *testing.T) {
	w := startWatched(t, "", "--drain-grace", "2s")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	if code, _, err := healthz(client, w.serving.Admin); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz: %d %v", code, err)
	}
	// Keep descriptors 0..9: the process has more open, so the next
	// accept fails with EMFILE.
	var old unix.Rlimit
	if err := unix.Prlimit(w.cmd.Process.Pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	if err := unix.Prlimit(w.cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 10, Max: old.Max}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	if nc, err := net.Dial("tcp", w.serving.Listen); err == nil {
		defer nc.Close()
	}
	for {
		if l := w.next(t); strings.HasPrefix(l.Message, "the client port stopped") {
			if l.Level != "error" {
				t.Errorf("logged at %s: %+v", l.Level, l)
			}
			break
		}
	}
	// The kept-alive admin connection needs no new descriptor.
	if code, body, err := healthz(client, w.serving.Admin); err != nil || code != http.StatusServiceUnavailable || body != "client port stopped\n" {
		t.Fatalf("/healthz once the client port stopped: %d %q %v; want 503", code, body, err)
	}
	for range w.lines {
	}
	var exit *exec.ExitError
	if err := <-w.exit; !errors.As(err, &exit) || exit.ExitCode() != exitFailure {
		t.Fatalf("lockd must exit %d once its client port stopped: %v", exitFailure, err)
	}
	w.exit <- nil // for the cleanup
}

// TestDescriptorLimitWithoutRoomRefusesToStart: a limit that cannot hold
// the reserve and one client connection stops lockd before it listens,
// exit status 1, naming the limit and how to raise it.
func TestDescriptorLimitWithoutRoomRefusesToStart(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, buildLockd(t), "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", "")
	cmd.Env = append(os.Environ(), execWithNoFile+"=256:256")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("lockd under a 256 descriptor limit: %v, want exit status 1; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), "descriptor limit 256 leaves no room for client connections") || !strings.Contains(string(out), "ulimit -n") {
		t.Fatalf("want the limit named and how to raise it; output:\n%s", out)
	}
	if strings.Contains(string(out), "lockd serving") {
		t.Fatalf("lockd served under a limit without room:\n%s", out)
	}
}
