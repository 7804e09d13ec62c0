package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/server"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitFor(t *testing.T, out *lockedBuffer, s string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), s); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", s, out.String())
		}
	}
}

// Two instances of the example: one leads; when it stops it resigns, and
// the other takes over with the next term.
func TestExampleElectsOneLeaderAtATime(t *testing.T) {
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	start := func(out *lockedBuffer) (context.CancelFunc, <-chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run(ctx, []string{srv.Addr()}, out) }()
		return cancel, done
	}
	var first, second lockedBuffer
	stopFirst, firstDone := start(&first)
	waitFor(t, &first, "leader, term 1\n")
	stopSecond, secondDone := start(&second)
	defer func() { stopSecond(); <-secondDone }()
	waitFor(t, &second, "campaigning for examples/leader\n")
	waitFor(t, &first, "term 1: working as the leader\n")
	if strings.Contains(second.String(), "leader, term") {
		t.Fatalf("two leaders at once: %q", second.String())
	}
	stopFirst()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, &first, "term 1: resigned\n")
	waitFor(t, &second, fmt.Sprintf("leader, term %d\n", 2))
}

// The built program takes an address list as lockctl does, and SIGTERM
// (a service manager's stop) ends it like Ctrl-C: it resigns, exits 0,
// and the name is free at once.
func TestExampleBinaryResignsOnSIGTERM(t *testing.T) {
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	bin := filepath.Join(t.TempDir(), "elect")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	var out lockedBuffer
	cmd := exec.Command(bin, "--addr", dead+","+srv.Addr())
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill(); <-done }()
	waitFor(t, &out, "working as the leader\n")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit after SIGTERM:\n%s", out.String())
	}
	waitFor(t, &out, ": resigned\n")
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{srv.Addr()}, Sessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Acquire(context.Background(), "examples/leader", client.AcquireOptions{MinWorkBudget: client.Budget(0)}); err != nil {
		t.Fatalf("the name is still held after the resignation: %v", err)
	}
}
