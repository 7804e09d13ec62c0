package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// A release a leaderless server refuses (E unavailable) is retried with a
// backoff within its 5 s, not burnt through in a burst; and since such a
// release may still apply, its end is Indeterminate, never a claim about
// the lock.
func TestReleaseRefusedUnavailableBacksOffThenIsIndeterminate(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.op == codec.OpRelease {
			c.Error(f.owner, codec.Unavailable)
		}
	})
	c := newClient(t, p, clk, nil)
	done := goRelease(c, "held", 7)
	eventually(t, "the first refusal", func() bool { return len(p.seen(codec.OpRelease)) == 1 })
	eventually(t, "the retry waits on its backoff", func() bool { return clk.dueIn(releaseBackoffMin) })
	if n := len(p.seen(codec.OpRelease)); n != 1 {
		t.Fatalf("%d RELEASE frames before any time passed: retried without backoff", n)
	}
	err := advanceUntil(t, clk, releaseBackoffMax, done)
	if !errors.Is(err, ErrIndeterminate) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("release refused as unavailable until its deadline: %v, want ErrIndeterminate only", err)
	}
	if n := len(p.seen(codec.OpRelease)); n < 2 || n > int(IODeadline/releaseBackoffMin) {
		t.Fatalf("%d RELEASE frames within the 5 s", n)
	}
}

// A release that finds every session full waits for room within its 5 s
// instead of giving up at once.
func TestReleaseWaitsForRoomWhenEverySessionIsFull(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, grant)
	gate := newFirstWriteGate()
	c := newClient(t, p, clk, func(cfg *Config) {
		cfg.MaxInFlight = 1
		cfg.Dialer = hookDialer(gate.write)
	})
	first := goAcquire(c, "first", waitFor(0))
	eventually(t, "the writer holds the first frame", gate.entered.Load)
	other := goRelease(c, "other", 3) // takes the release reserve
	eventually(t, "the release is queued", func() bool { return queued(onlySession(c)) == 1 })

	full := goRelease(c, "held", 7)
	eventually(t, "the release waits on its backoff", func() bool { return clk.dueIn(releaseBackoffMin) })
	close(gate.open)
	await(t, first)
	await(t, other)
	if err := advanceUntil(t, clk, releaseBackoffMin, full); err != nil && !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release after room came back: %v", err)
	}
}

// A context already done must not reach a session's writer: the call ends
// as certainly not sent, and other calls on the session are untouched.
func TestDoneContextIsNeverSent(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, grant)
	c := newClient(t, p, clk, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 50 {
		if _, err := c.Acquire(ctx, "k", waitFor(5*time.Second)); !errors.Is(err, ErrTimeout) {
			t.Fatalf("acquire with a done context: %v, want ErrTimeout (not sent)", err)
		}
	}
	if n := len(p.seen(codec.OpAcquire)); n != 0 {
		t.Fatalf("%d ACQUIRE frames sent for a done context", n)
	}
}

// The call's one deadline is monotonic even when the context's deadline
// carries only a wall-clock reading (time.Unix, a deadline from an RPC).
func TestContextDeadlineIsRebasedOnTheMonotonicClock(t *testing.T) {
	c := &Client{clock: systemClock{}}
	c.requests.New = func() any { return &request{done: make(chan struct{}, 1), timer: systemClock{}.NewTimer()} }
	now := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), now.Round(0).Add(2*time.Second))
	defer cancel()
	req := c.newRequest(ctx, opAcquire, 1, "k", now, now.Add(10*time.Second))
	defer c.freeRequest(req)
	if req.deadline == req.deadline.Round(0) {
		t.Fatalf("deadline %v has no monotonic reading: a wall-clock step would move it", req.deadline)
	}
	if left := req.deadline.Sub(now); left != 2*time.Second {
		t.Fatalf("deadline %v after now, want the context's 2s", left)
	}
}

// Tokens are never 0 (SPEC §4): a grant of token 0 is a protocol error,
// never a Ticket whose release could claim NOT HELD without asking.
func TestGrantOfTokenZeroIsRefused(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.op == codec.OpAcquire {
			c.Acquired(f.owner, 0, 0)
		}
	})
	c := newClient(t, p, clk, nil)
	tk, err := c.Acquire(context.Background(), "k", waitFor(0))
	if !errors.Is(err, ErrIndeterminate) || tk.Token() != 0 {
		t.Fatalf("a grant of token 0: ticket %d, %v; want ErrIndeterminate", tk.Token(), err)
	}
}

// advanceUntil moves the fake clock by step each time the client is
// waiting on it for at most step — a backoff, or the last of the call's
// deadline — until ch delivers. The clock never runs ahead of the client.
func advanceUntil[T any](t *testing.T, clk *fakeClock, step time.Duration, ch <-chan T) T {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case v := <-ch:
			return v
		default:
		}
		if clk.dueWithin(step) {
			clk.Advance(step)
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
	t.Fatal("no result while the clock moved")
	panic("unreachable")
}
