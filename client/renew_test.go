package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// keepPeer grants acquires with a fresh token and answers every KEEP with
// keep(p, c, f).
func keepPeer(t *testing.T, keep answerFunc) *peer {
	return startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		switch f.op {
		case codec.OpAcquire:
			c.Acquired(f.owner, p.tokens.Add(1), 0)
		case codec.OpKeep:
			if keep != nil {
				keep(p, c, f)
			}
		}
	})
}

// stepUntil moves the fake clock in small steps until ch yields, for a
// call whose own timers (backoffs, ticks, deadlines) must all pass.
func stepUntil[T any](t *testing.T, clk *fakeClock, ch <-chan T) T {
	t.Helper()
	for range 100000 {
		select {
		case v := <-ch:
			return v
		case <-time.After(time.Millisecond):
			clk.Advance(100 * time.Millisecond)
		}
	}
	t.Fatal("no result")
	panic("unreachable")
}

func renewedAnswer(_ *peer, c *lockdtest.Conn, f frame) { c.Acquired(f.owner, f.token, 0) }

func acquireFor(t *testing.T, c *Client, lease time.Duration) Ticket {
	t.Helper()
	tk, err := c.Acquire(context.Background(), "k", AcquireOptions{Lease: lease, MinWorkBudget: Budget(0)})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func goRenew(tk *Ticket, lease time.Duration) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- tk.Renew(context.Background(), lease) }()
	return ch
}

// A correlated A moves the validity to the KEEP's send instant + lease
// minus the drift margin (SPEC §6), keeps the token, and moves Lost with
// it; a shorter lease moves it back.
func TestRenewMovesValidityToSendInstantPlusLease(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, renewedAnswer)
	c := newClient(t, p, clk, nil)
	tk := acquireFor(t, c, 10*time.Second)
	token, oldValid := tk.Token(), tk.ValidUntil()
	lost := tk.Lost()

	clk.Advance(4 * time.Second)
	sent := clk.Now()
	if err := tk.Renew(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	keeps := p.seen(codec.OpKeep)
	if len(keeps) != 1 || keeps[0].token != token || keeps[0].lease != 30 || keeps[0].key != "k" {
		t.Fatalf("KEEP frames %+v, want one for token %d, lease 30, key k", keeps, token)
	}
	want := sent.Add(30*time.Second - driftMargin(30*time.Second))
	if tk.Token() != token || !tk.ValidUntil().Equal(want) {
		t.Fatalf("renewed: token %d valid until %v, want token %d valid until %v", tk.Token(), tk.ValidUntil(), token, want)
	}
	// Past the old validity the watch is armed for the new one.
	clk.Advance(oldValid.Sub(clk.Now()))
	if !pending(lost) || !clk.dueIn(want.Sub(clk.Now())) {
		t.Fatal("Lost did not move with the renewal")
	}
	if tk.Lost() != lost {
		t.Fatal("Lost returned another channel after a renewal")
	}

	// KEEP may shorten the lease.
	sent = clk.Now()
	if err := tk.Renew(context.Background(), 1500*time.Millisecond); err != nil { // rounded up to 2 s
		t.Fatal(err)
	}
	if got := p.seen(codec.OpKeep)[1].lease; got != 2 {
		t.Fatalf("wire lease %d, want 2 (rounded up)", got)
	}
	want = sent.Add(2*time.Second - driftMargin(2*time.Second))
	if !tk.ValidUntil().Equal(want) {
		t.Fatalf("valid until %v, want %v", tk.ValidUntil(), want)
	}
	clk.Advance(want.Sub(clk.Now()) - time.Millisecond)
	if !pending(lost) {
		t.Fatal("lost before the shortened validity")
	}
	clk.Advance(time.Millisecond)
	eventually(t, "Lost at the shortened validity", func() bool { return !pending(lost) })
}

// N marks the ticket lost: ErrNotHeld, no validity left, Lost closed.
func TestRenewNotHeldMarksTheTicketLost(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) { c.Reply(codec.OpNotHeld, f.owner) })
	c := newClient(t, p, clk, nil)
	tk := acquireFor(t, c, 30*time.Second)
	copied := tk
	lost := copied.Lost()
	if err := tk.Renew(context.Background(), 30*time.Second); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("got %v, want ErrNotHeld", err)
	}
	if tk.Remaining() != 0 || !tk.ValidUntil().IsZero() {
		t.Fatalf("a lost ticket keeps validity: remaining %v", tk.Remaining())
	}
	if pending(lost) || pending(tk.Lost()) {
		t.Fatal("Lost not closed by NOT HELD")
	}
}

// No answer within 5 s of the call is Indeterminate and leaves the old
// validity in force, never assumed extended; so does E unavailable.
func TestRenewWithoutAnswerKeepsTheOldValidity(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, nil)
	c := newClient(t, p, clk, nil)
	tk := acquireFor(t, c, 30*time.Second)
	before := tk.ValidUntil()
	res := goRenew(&tk, 30*time.Second)
	eventually(t, "the server has the KEEP", func() bool { return len(p.seen(codec.OpKeep)) == 1 })
	clk.Advance(IODeadline - time.Millisecond)
	if !pending(res) {
		t.Fatal("the renewal ended before 5 s")
	}
	clk.Advance(time.Millisecond)
	if err := await(t, res); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate", err)
	}
	if !tk.ValidUntil().Equal(before) {
		t.Fatalf("validity moved without an answer: %v, was %v", tk.ValidUntil(), before)
	}

	p2 := keepPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) { c.Error(f.owner, codec.Unavailable) })
	c2 := newClient(t, p2, clk, nil)
	tk2 := acquireFor(t, c2, 30*time.Second)
	before = tk2.ValidUntil()
	// The retries' backoffs are on the fake clock.
	if err := stepUntil(t, clk, goRenew(&tk2, 30*time.Second)); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate", err)
	}
	if len(p2.seen(codec.OpKeep)) < 2 {
		t.Fatal("an unavailable KEEP was not retried")
	}
	if !tk2.ValidUntil().Equal(before) {
		t.Fatal("validity moved on E unavailable")
	}
}

// Out-of-range leases fail before anything is sent.
func TestRenewRefusesBadLeasesBeforeSending(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, renewedAnswer)
	c := newClient(t, p, clk, nil)
	tk := acquireFor(t, c, 30*time.Second)
	for _, lease := range []time.Duration{0, -time.Second, 3600*time.Second + 1} {
		if err := tk.Renew(context.Background(), lease); !errors.Is(err, ErrUnsupportedDuration) {
			t.Fatalf("lease %v: %v, want ErrUnsupportedDuration", lease, err)
		}
	}
	var zero Ticket
	if err := zero.Renew(context.Background(), time.Second); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("zero Ticket: %v", err)
	}
	if n := len(p.seen(codec.OpKeep)); n != 0 {
		t.Fatalf("%d KEEPs sent for refused renewals", n)
	}
}

// A KEEP answered with another token breaks the protocol: that session
// closes, the validity does not move on that answer, and the retry on
// another session is what renews.
func TestRenewAnsweredWithAnotherTokenIsAProtocolError(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if len(p.seen(codec.OpKeep)) == 1 {
			c.Acquired(f.owner, f.token+1, 0)
			return
		}
		c.Acquired(f.owner, f.token, 0)
	})
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2 })
	tk := acquireFor(t, c, 30*time.Second)
	token := tk.Token()
	if err := tk.Renew(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	keeps := p.seen(codec.OpKeep)
	if len(keeps) != 2 || keeps[0].conn == keeps[1].conn || tk.Token() != token {
		t.Fatalf("KEEPs %+v, token %d: want a retry on the other session, token %d", keeps, tk.Token(), token)
	}
	if got := c.Stats().ProtocolErrors; got != 1 {
		t.Fatalf("protocol errors %d, want 1", got)
	}
}

// KeepAlive renews at every interval with the ticket's lease, keeping the
// lock past its granted validity, until the context ends.
func TestKeepAliveRenewsUntilCancelled(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, renewedAnswer)
	c := newClient(t, p, clk, nil)
	tk := acquireFor(t, c, 3*time.Second)
	lost := tk.Lost()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	kept := tk
	go func() { done <- kept.KeepAlive(ctx, time.Second) }()
	for i := range 9 {
		eventually(t, "KeepAlive waits for its next tick", func() bool { return clk.dueIn(time.Second) })
		clk.Advance(time.Second)
		eventually(t, "the renewal reached the server", func() bool { return len(p.seen(codec.OpKeep)) == i+1 })
	}
	if !pending(lost) {
		t.Fatal("the lock was lost although every renewal was confirmed")
	}
	for _, f := range p.seen(codec.OpKeep) {
		if f.lease != 3 || f.token != tk.Token() {
			t.Fatalf("KEEP %+v, want lease 3 and token %d", f, tk.Token())
		}
	}
	cancel()
	if err := await(t, done); err != nil {
		t.Fatalf("KeepAlive after cancel: %v", err)
	}
	if kept.ValidUntil().Sub(tk.ValidUntil()) < 8*time.Second {
		t.Fatalf("renewed validity %v, granted %v", kept.ValidUntil(), tk.ValidUntil())
	}
}

// KeepAlive returns ErrNotHeld at the first NOT HELD.
func TestKeepAliveStopsAtNotHeld(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) { c.Reply(codec.OpNotHeld, f.owner) })
	c := newClient(t, p, clk, nil)
	tk := acquireFor(t, c, 30*time.Second)
	done := make(chan error, 1)
	go func() { done <- tk.KeepAlive(context.Background(), 10*time.Second) }()
	eventually(t, "KeepAlive waits for its tick", func() bool { return clk.dueIn(10 * time.Second) })
	clk.Advance(10 * time.Second)
	if err := await(t, done); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("got %v, want ErrNotHeld", err)
	}
}

// A renewal without an answer does not end KeepAlive while validity
// remains: it tries again, and returns the first failure only once the
// lease lapsed unconfirmed.
func TestKeepAliveReportsTheFirstFailureWhenTheLeaseLapses(t *testing.T) {
	clk := newFakeClock()
	p := keepPeer(t, nil)
	c := newClient(t, p, clk, nil)
	tk := acquireFor(t, c, 10*time.Second)
	lost := tk.Lost()
	done := make(chan error, 1)
	go func() { done <- tk.KeepAlive(context.Background(), 2*time.Second) }()
	err := stepUntil(t, clk, done)
	if !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("got %v, want the first renewal's ErrIndeterminate", err)
	}
	if n := len(p.seen(codec.OpKeep)); n < 2 {
		t.Fatalf("%d renewals: KeepAlive gave up after the first failure", n)
	}
	if pending(lost) || tk.Remaining() != 0 {
		t.Fatal("KeepAlive returned before the validity ran out")
	}
}
