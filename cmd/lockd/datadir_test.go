package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine/tokenfile"
)

// buildLockd builds the lockd binary, for tests that run it as a child
// process.
func buildLockd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lockd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// lockdProcess is a `lockd serve` child process that has started serving.
type lockdProcess struct {
	cmd    *exec.Cmd
	listen string
	// startLog is what it logged up to its "lockd serving" line.
	startLog string
}

// startLockd runs `lockd serve` in workDir on free loopback ports and
// waits until it serves; it is killed when the test ends.
func startLockd(t *testing.T, bin, workDir string, args ...string) *lockdProcess {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--admin", ""}, args...)...)
	cmd.Dir = workDir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p := &lockdProcess{cmd: cmd}
	var log strings.Builder
	lines := bufio.NewScanner(stderr)
	for p.listen == "" && lines.Scan() {
		log.Write(lines.Bytes())
		log.WriteByte('\n')
		var line struct{ Listen, Message string }
		if json.Unmarshal(lines.Bytes(), &line) == nil && line.Message == "lockd serving" {
			p.listen = line.Listen
		}
	}
	if p.listen == "" {
		t.Fatalf("lockd did not start serving:\n%s", log.String())
	}
	p.startLog = log.String()
	go io.Copy(io.Discard, stderr)
	return p
}

// kill9 kills the process the way a crash does: no drain, no cleanup.
func (p *lockdProcess) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := p.cmd.Wait(); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("lockd did not die of SIGKILL: %v", err)
	}
}

// refusedStart runs `lockd serve` expecting it to refuse to start, and
// returns what it said.
func refusedStart(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--admin", ""}, args...)...)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
		t.Fatalf("lockd serve %q: %v, want a refused start\n%s", args, err, out)
	}
	return string(out)
}

// protoConn speaks the client protocol in bare frames.
type protoConn struct {
	t     *testing.T
	nc    net.Conn
	rr    *codec.ResponseReader
	owner uint64
}

func (p *lockdProcess) dial(t *testing.T) *protoConn {
	t.Helper()
	nc, err := net.Dial("tcp", p.listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &protoConn{t: t, nc: nc, rr: codec.NewResponseReader(nc, 4096)}
	if r := c.recv(); r.Op != codec.OpGreeting {
		t.Fatalf("first frame %q, want the greeting", r.Op)
	}
	return c
}

func (c *protoConn) recv() codec.Response {
	c.t.Helper()
	var r codec.Response
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.rr.Next(&r); err != nil {
		c.t.Fatal(err)
	}
	return r
}

func (c *protoConn) exchange(frame []byte, want byte) codec.Response {
	c.t.Helper()
	if _, err := c.nc.Write(frame); err != nil {
		c.t.Fatal(err)
	}
	r := c.recv()
	if r.Op != want || r.Owner != c.owner {
		c.t.Fatalf("got %q owner %d (reason %v), want %q owner %d", r.Op, r.Owner, r.Reason, want, c.owner)
	}
	return r
}

// acquire takes the free key for leaseSeconds, without waiting, and
// returns its token.
func (c *protoConn) acquire(key string, leaseSeconds uint16) uint64 {
	c.t.Helper()
	c.owner++
	return c.exchange(codec.AppendAcquire(nil, c.owner, leaseSeconds, 0, key), codec.OpAcquired).Token
}

func (c *protoConn) release(key string, token uint64) {
	c.t.Helper()
	c.owner++
	c.exchange(codec.AppendRelease(nil, c.owner, token, key), codec.OpReleased)
}

// The report this guards against: k1 taken and released five times, taken
// again with a 60 s lease, lockd killed -9 and started again — and the next
// holder got token 1. Each life here is killed in the middle of its first
// block of reserved tokens, with the default data dir.
func TestKillNineMidBlockRestartsAboveEveryIssuedToken(t *testing.T) {
	bin := buildLockd(t)
	work := t.TempDir()
	keys := []string{"k1", "orders/42", "invoice/7", "nightly-report", "a", "b", "c", "d", "e", "f"}
	var before uint64 // the highest token of every life so far
	for life := range 3 {
		p := startLockd(t, bin, work)
		c := p.dial(t)
		highest := before
		issued := func(key string, token uint64) {
			if token <= before {
				t.Fatalf("life %d, %s: token %d, want above every earlier token (%d)", life, key, token, before)
			}
			highest = max(highest, token)
		}
		for range 5 {
			token := c.acquire("k1", 60)
			issued("k1", token)
			c.release("k1", token)
		}
		// Held at the kill; the restart forgets it, so every key is free.
		for _, key := range keys {
			issued(key, c.acquire(key, 60))
		}
		p.kill9(t)
		before = highest
	}
	if _, err := os.Stat(filepath.Join(work, "lockd.data", tokenfile.Name)); err != nil {
		t.Fatalf("the default data dir holds no token mark: %v", err)
	}
}

func TestDataDirRefusalsAndVolatileMode(t *testing.T) {
	bin := buildLockd(t)
	dir := filepath.Join(t.TempDir(), "data")
	p := startLockd(t, bin, t.TempDir(), "--data-dir", dir)
	token := p.dial(t).acquire("k", 30)
	p.kill9(t)

	out := refusedStart(t, bin, "--data-dir", dir, "--first-token", strconv.FormatUint(token, 10))
	if !strings.Contains(out, "--first-token "+strconv.FormatUint(token, 10)+" is below the token mark") ||
		!strings.Contains(out, filepath.Join(dir, tokenfile.Name)) {
		t.Fatalf("--first-token below the mark:\n%s", out)
	}

	mark, err := tokenfile.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := mark.Reserved() + 5
	mark.Close()
	p = startLockd(t, bin, t.TempDir(), "--data-dir", dir, "--first-token", strconv.FormatUint(first, 10))
	if got := p.dial(t).acquire("k", 30); got != first {
		t.Fatalf("--first-token %d above the mark: token %d", first, got)
	}
	p.kill9(t)

	if err := os.WriteFile(filepath.Join(dir, tokenfile.Name), []byte("lockd token-mark v1 next=31"), 0o644); err != nil {
		t.Fatal(err)
	}
	out = refusedStart(t, bin, "--data-dir", dir)
	if !strings.Contains(out, filepath.Join(dir, tokenfile.Name)+" is damaged") || !strings.Contains(out, "--first-token") {
		t.Fatalf("a damaged mark:\n%s", out)
	}

	work := t.TempDir()
	p = startLockd(t, bin, work, "--data-dir", "")
	if !strings.Contains(p.startLog, "running volatile") {
		t.Fatalf("a volatile start does not say so:\n%s", p.startLog)
	}
	if got := p.dial(t).acquire("k", 30); got != 1 {
		t.Fatalf("volatile: first token %d", got)
	}
	if entries, err := os.ReadDir(work); err != nil || len(entries) != 0 {
		t.Fatalf("a volatile lockd wrote into its working directory: %v %v", entries, err)
	}
}

func TestDataDirFlag(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	o, err := parseServeOptions(nil, none)
	if err != nil || o.server.DataDir != "lockd.data" || o.server.Engine.FirstToken != 0 {
		t.Fatalf("defaults: data dir %q, first token %d, %v", o.server.DataDir, o.server.Engine.FirstToken, err)
	}
	if o, err = parseServeOptions([]string{"--data-dir", ""}, none); err != nil || o.server.DataDir != "" {
		t.Fatalf("--data-dir '': %q %v", o.server.DataDir, err)
	}
	// The single-mode default is never a cluster node's Raft directory.
	cluster := []string{"--cluster", "--node-id", "1", "--peers", "1=127.0.0.1:7451,2=127.0.0.1:7452,3=127.0.0.1:7453"}
	if _, err := parseServeOptions(cluster, none); err == nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("--cluster without --data-dir: %v", err)
	}
	o, err = parseServeOptions(append(cluster, "--data-dir", "node1"), none)
	if err != nil || o.clusterCfg.DataDir != "node1" {
		t.Fatalf("--cluster --data-dir node1: %q %v", o.clusterCfg.DataDir, err)
	}
}
