package client

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// definiteErrors are every error a call may end with; anything else would
// leave the caller unable to tell whether it holds the lock.
var definiteErrors = []error{
	ErrTimeout, ErrBusy, ErrUnavailable, ErrTokenExhausted, ErrShuttingDown,
	ErrIndeterminate, ErrNotHeld, ErrNotConnected, ErrClosed, ErrProtocol, ErrBadKey,
}

// FuzzClientAnswers feeds arbitrary server bytes to the client's response
// path (decoding, correlation by owner, the delivery gate) after a valid
// greeting, in answer to one ACQUIRE of owner 1. Whatever arrives, the
// call ends by its context with a Ticket of a real token or with one of the
// client's typed errors, and Close leaves nothing running.
func FuzzClientAnswers(f *testing.F) {
	f.Add(codec.AppendAcquired(nil, 1, 7, 0))
	f.Add(codec.AppendAcquired(nil, 1, 0, 0))
	f.Add(codec.AppendAcquired(nil, 2, 7, 0))
	f.Add(codec.AppendOwnerOnly(nil, codec.OpTimeout, 1))
	f.Add(codec.AppendOwnerOnly(nil, codec.OpBusy, 1))
	f.Add(codec.AppendOwnerOnly(nil, codec.OpReleased, 1))
	f.Add(codec.AppendError(nil, 1, codec.Unavailable))
	f.Add(codec.AppendError(nil, 0, codec.BadRequest))
	f.Add(codec.AppendAcquired(nil, 1, 7, ^uint32(0)))
	f.Add([]byte("Z\n"))
	f.Add(codec.AppendAcquired(nil, 1, 7, 0)[:9])

	var answer atomic.Pointer[[]byte]
	srv, err := lockdtest.Start(func(c *lockdtest.Conn) {
		if _, err := c.Greet(false); err != nil {
			return
		}
		var req codec.Request
		if c.ReadRequest(&req) != nil {
			return
		}
		_, _ = c.Write(*answer.Load())
		for c.ReadRequest(&req) == nil {
			if req.Op == codec.OpRelease { // a compensation: done at once
				_ = c.Reply(codec.OpNotHeld, req.Owner)
			}
		}
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Close() })

	f.Fuzz(func(t *testing.T, data []byte) {
		answer.Store(&data)
		c, err := Dial(context.Background(), Config{Addrs: []string{srv.Addr()}, Sessions: 1})
		if err != nil {
			t.Fatal(err)
		}
		// The context ends the call whatever the bytes were; the guard
		// below only catches a call that never returns.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		var r result
		select {
		case r = <-goAcquireCtx(ctx, c, "k", AcquireOptions{Lease: time.Minute, MinWorkBudget: Budget(0)}):
		case <-time.After(20 * time.Second):
			t.Fatal("Acquire did not return although its 200 ms context ended long ago")
		}
		switch {
		case r.Err == nil && r.Ticket.Token() == 0:
			t.Fatal("a Ticket without a token")
		case r.Err != nil && !isDefinite(r.Err):
			t.Fatalf("untyped error: %v", r.Err)
		}
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case <-closed:
		case <-time.After(2 * IODeadline):
			t.Fatal("Close did not return")
		}
	})
}

func isDefinite(err error) bool {
	for _, sentinel := range definiteErrors {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}
