package client

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// armedWriteGate holds the first write made after it is armed until open
// is closed.
type armedWriteGate struct {
	armed, entered atomic.Bool
	open           chan struct{}
}

func (g *armedWriteGate) write(c *hookedConn, b []byte) (int, error) {
	if g.armed.Load() && g.entered.CompareAndSwap(false, true) {
		select {
		case <-g.open:
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	return c.Conn.Write(b)
}

// A context that many calls share is watched instead of selected on by
// each call; when it ends, its calls end under the same rules as one that
// selects (SPEC §6): queued ones certainly unsent, one that may have left
// Indeterminate with its session closed, and a call under another context
// queued on that session moves to the next one.
func TestSharedContextEndsItsCallsLikeTheirDeadline(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.key != "sent" {
			grant(p, c, f)
		}
	})
	gate := &armedWriteGate{open: make(chan struct{})}
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Dialer = hookDialer(gate.write) })

	ctx, cancel := context.WithCancel(context.Background())
	cycle := func(ctx context.Context) {
		t.Helper()
		tk, err := c.Acquire(ctx, "warm", waitFor(0))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	// One request's context, an acquire and a release, is not watched.
	oneRequest, endRequest := context.WithCancel(context.Background())
	cycle(oneRequest)
	endRequest()
	cycle(ctx)
	if c.watch.Load() != nil {
		t.Fatal("a context of two calls is watched")
	}
	for range watchAfter / 2 {
		cycle(ctx)
	}
	if w := c.watch.Load(); w == nil || w.done != ctx.Done() {
		t.Fatalf("a context %d calls in a row came with is not watched", watchAfter)
	}

	gate.armed.Store(true)
	sent := goAcquireCtx(ctx, c, "sent", waitFor(0))
	eventually(t, "the writer holds the frame", gate.entered.Load)
	stillQueued := goAcquireCtx(ctx, c, "queued", waitFor(0))
	other := goAcquire(c, "other", waitFor(0))
	eventually(t, "two requests are queued", func() bool { return queued(onlySession(c)) == 2 })

	cancel()
	if r := await(t, stillQueued); !errors.Is(r.Err, ErrTimeout) || !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("queued when its context ended: %v, want ErrTimeout, not sent", r.Err)
	}
	if r := await(t, sent); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("taken by the writer when its context ended: %v, want ErrIndeterminate", r.Err)
	}
	if r := await(t, other); r.Err != nil {
		t.Fatalf("queued under another context: %v, want it moved to a new session and acquired", r.Err)
	}
	close(gate.open)
	if st := c.Stats(); st.AbandonedSessions != 1 || st.ProtocolErrors != 0 {
		t.Fatalf("AbandonedSessions %d, ProtocolErrors %d; want 1 and 0", st.AbandonedSessions, st.ProtocolErrors)
	}
	for _, f := range p.seen(codec.OpAcquire) {
		if f.key == "queued" {
			t.Fatal("the acquire queued when its context ended reached the server")
		}
	}

	// An ended context's watch gives way to the next shared one.
	next, cancelNext := context.WithCancel(context.Background())
	defer cancelNext()
	for range watchAfter / 2 {
		if _, err := c.Acquire(next, "again", waitFor(0)); err != nil {
			t.Fatal(err)
		}
		if err := c.ReleaseToken(next, "again", p.tokens.Load()); err != nil {
			t.Fatal(err)
		}
	}
	if w := c.watch.Load(); w == nil || w.done != next.Done() {
		t.Fatal("the next shared context is not watched once the first one ended")
	}
}

// A call whose watched context ended before its request entered a session,
// which the watch's end therefore missed, ends it itself instead of
// waiting for an answer that does not come.
func TestWatchedContextEndedBeforeTheRequestEntered(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.key != "late" {
			grant(p, c, f)
		}
	})
	c := newClient(t, p, clk, nil)
	ctx, cancel := context.WithCancel(context.Background())
	for range watchAfter {
		if _, err := c.Acquire(ctx, "warm", waitFor(0)); err != nil {
			t.Fatal(err)
		}
	}
	w := c.watch.Load()
	if w == nil || w.done != ctx.Done() {
		t.Fatal("the context is not watched")
	}
	// The context ends between the call's check of it and its enqueue.
	w.ended.Store(true)
	req := c.newRequest(ctx, opAcquire, 99, "late", clk.Now(), clk.Now().Add(IODeadline))
	defer c.freeRequest(req)
	req.immediate, req.watch = true, w
	s, err := c.pick(ctx, req, c.cfg.MaxInFlight)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	outs := make(chan outcome, 1)
	go func() { outs <- c.await(ctx, s, req) }()
	if out := await(t, outs); out != outExpired && out != outLost {
		t.Fatalf("outcome %v, want the request ended by its context", out)
	}
}
