package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

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
		go func() { done <- run(ctx, srv.Addr(), out) }()
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
