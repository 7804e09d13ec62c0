package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// heldPeer plays a server on which "hot" is held by somebody else for the
// whole test, so a waiting acquire of it is never answered before its
// wait runs out. Every other acquire is granted and every release
// released, but only once the test opens answers, so that those requests
// are in flight when a wait runs out.
type heldPeer struct {
	*peer
	answers chan struct{} // closed to let the held-back answers go
}

func startHeldPeer(t *testing.T) *heldPeer {
	h := &heldPeer{answers: make(chan struct{})}
	h.peer = startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.key == "hot" {
			return
		}
		go func() {
			<-h.answers
			grant(p, c, f)
		}()
	})
	return h
}

// A waiting acquire that runs out on a held lock ends Indeterminate with
// ErrWaitElapsed and closes its own session only: calls in flight at its
// deadline on the shared session and on other wait sessions get exactly
// the answers they would have got without it, each sent once.
func TestWaitThatRunsOutCostsOnlyItsOwnCall(t *testing.T) {
	clk := newFakeClock()
	h := startHeldPeer(t)
	c := newClient(t, h.peer, clk, func(cfg *Config) { cfg.WaitSpares = 2 })
	eventually(t, "the spares are connected", func() bool { return c.Stats().WaitSessionsIdle == 2 })

	runaway := goAcquire(c, "hot", waitFor(2*time.Second))
	eventually(t, "the server has the waiting acquire", func() bool { return len(h.seen(codec.OpAcquire)) == 1 })
	hotConn := h.seen(codec.OpAcquire)[0].conn

	const callers = 8
	var others []<-chan error
	for i := range callers {
		key := fmt.Sprintf("other-%d", i)
		opts := waitFor(0)
		if i%2 == 1 {
			opts = waitFor(30 * time.Second) // on a wait session of its own
		}
		done := make(chan error, 1)
		others = append(others, done)
		go func() {
			tk, err := c.Acquire(context.Background(), key, opts)
			if err == nil {
				err = c.Release(context.Background(), tk)
			}
			done <- err
		}()
	}
	eventually(t, "every other acquire is in flight", func() bool { return len(h.seen(codec.OpAcquire)) == 1+callers })

	clk.Advance(2 * time.Second)
	r := await(t, runaway)
	if !errors.Is(r.Err, ErrIndeterminate) || !errors.Is(r.Err, ErrWaitElapsed) {
		t.Fatalf("the wait that ran out: %v, want ErrIndeterminate and ErrWaitElapsed", r.Err)
	}
	eventually(t, "its session is closed", func() bool { return h.connEnded(hotConn) })
	close(h.answers)
	for i, done := range others {
		if err := await(t, done); err != nil {
			t.Errorf("caller %d: %v; want the answer it would have had alone", i, err)
		}
	}
	perKey := map[string]int{}
	for _, f := range h.seen(codec.OpAcquire) {
		perKey[f.key]++
	}
	for key, n := range perKey {
		if n != 1 {
			t.Errorf("%s sent %d times; no call but the one that ran out may be disturbed", key, n)
		}
	}
	h.mu.Lock()
	var closed []int
	for conn, ended := range h.ended {
		if ended {
			closed = append(closed, conn)
		}
	}
	h.mu.Unlock()
	if !slices.Equal(closed, []int{hotConn}) {
		t.Fatalf("closed connections %v, want only %d, the one the wait ran out on", closed, hotConn)
	}
	if st := c.Stats(); st.AbandonedSessions != 1 || st.Sessions != 1 {
		t.Fatalf("stats %+v: want one abandoned session and the shared one alive", st)
	}
}

// The pool replaces the closed session in the background, and the next
// waiting acquire rides a spare that was connected before the call: it
// never waits for a dial and a handshake.
func TestSparesRefillOffTheCallersPath(t *testing.T) {
	clk := newFakeClock()
	h := startHeldPeer(t)
	close(h.answers)
	var dials atomic.Int32
	allowDials := make(chan struct{}, 16)
	c := newClient(t, h.peer, clk, func(cfg *Config) {
		cfg.WaitSpares = 2
		cfg.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 3 { // the shared session and the two spares go through
				select {
				case <-allowDials:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
	})
	eventually(t, "the spares are connected", func() bool { return c.Stats().WaitSessionsIdle == 2 })

	res := goAcquire(c, "hot", waitFor(time.Second))
	eventually(t, "the server has the waiting acquire", func() bool { return len(h.seen(codec.OpAcquire)) == 1 })
	clk.Advance(time.Second)
	if r := await(t, res); !errors.Is(r.Err, ErrWaitElapsed) {
		t.Fatalf("got %v, want ErrWaitElapsed", r.Err)
	}
	// Replacing the two sessions now taken or closed waits for allowDials:
	// the next waiting acquire must not need them.
	if _, err := c.Acquire(context.Background(), "k", waitFor(10*time.Second)); err != nil {
		t.Fatalf("the next waiting acquire, with one spare still connected: %v", err)
	}
	allowDials <- struct{}{}
	eventually(t, "the pool is back to two spares", func() bool { return c.Stats().WaitSessionsIdle == 2 })
	if st := c.Stats(); st.Reconnects != 1 || st.WaitSessions != 2 {
		t.Fatalf("stats %+v: want one reconnect for the one closed session, and two open", st)
	}
}

// A flood of waiting acquires on a lock that stays held never opens more
// than Sessions + WaitSessions connections; the calls that found no wait
// session end ErrTimeout, certainly unsent, and each one that ran out on
// the wire costs at most one reconnect.
func TestTimeoutFloodStaysWithinTheConnectionBound(t *testing.T) {
	clk := newFakeClock()
	h := startHeldPeer(t)
	const limit, callers = 4, 20
	c := newClient(t, h.peer, clk, func(cfg *Config) {
		cfg.WaitSessions = limit
		cfg.WaitSpares = 2
	})
	results := make([]<-chan result, callers)
	for i := range results {
		results[i] = goAcquire(c, "hot", waitFor(2*time.Second))
	}
	eventually(t, "every wait session carries one and the others wait for one", func() bool {
		return len(h.seen(codec.OpAcquire)) == limit && waitingForSession(c) == callers-limit
	})
	h.mu.Lock()
	maxOpen := h.maxOpen
	h.mu.Unlock()
	clk.Advance(2 * time.Second)
	ranOut, timedOut := 0, 0
	for _, res := range results {
		switch r := await(t, res); {
		case errors.Is(r.Err, ErrWaitElapsed) && errors.Is(r.Err, ErrIndeterminate):
			ranOut++
		case errors.Is(r.Err, ErrTimeout) && !errors.Is(r.Err, ErrIndeterminate):
			timedOut++
		default:
			t.Fatalf("unexpected outcome %v", r.Err)
		}
	}
	if ranOut != limit || timedOut != callers-limit || len(h.seen(codec.OpAcquire)) != limit {
		t.Fatalf("%d ran out on the wire, %d timed out in the client, %d sent; want %d, %d, %d",
			ranOut, timedOut, len(h.seen(codec.OpAcquire)), limit, callers-limit, limit)
	}
	// Callers still waiting in the client as their deadline came may have
	// had sessions dialled for them: the pool holds the spares or more,
	// never more than its limit.
	eventually(t, "the pool is back to its spares", func() bool { return c.Stats().WaitSessionsIdle >= 2 })
	st := c.Stats()
	if maxOpen > 1+limit || st.WaitSessions > limit || st.Reconnects > uint64(ranOut) || st.AbandonedSessions != uint64(ranOut) {
		t.Fatalf("%d connections open at once (bound %d); stats %+v", maxOpen, 1+limit, st)
	}
}

func waitingForSession(c *Client) int {
	c.waits.mu.Lock()
	defer c.waits.mu.Unlock()
	return len(c.waits.waiting)
}

// Wait sessions beyond the spares that nobody needs for a minute close.
func TestIdleWaitSessionsBeyondTheSparesClose(t *testing.T) {
	clk := newFakeClock()
	g := startGatePeer(t)
	c := newClient(t, g.peer, clk, func(cfg *Config) { cfg.WaitSpares = 1 })
	eventually(t, "the spare is connected", func() bool { return c.Stats().WaitSessionsIdle == 1 })
	var results []<-chan result
	var frames []frame
	for i := range 3 {
		results = append(results, goAcquire(c, fmt.Sprintf("k%d", i), waitFor(10*time.Second)))
		frames = append(frames, await(t, g.frames))
	}
	for _, f := range frames {
		g.Acquired(f)
	}
	for _, res := range results {
		if r := await(t, res); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	eventually(t, "the pool holds three idle and one spare", func() bool { return c.Stats().WaitSessionsIdle == 4 })
	clk.Advance(waitIdleTimeout)
	eventually(t, "the idle sessions beyond the spare are closed", func() bool {
		st := c.Stats()
		return st.WaitSessions == 1 && st.WaitSessionsIdle == 1
	})
	if st := c.Stats(); st.Reconnects != 0 {
		t.Fatalf("closing idle sessions is no reason to reconnect: %+v", st)
	}
}

// TestDeadlineHeapMatchesASortedModel drives the heap with random pushes
// and removals and checks its earliest against a model.
func TestDeadlineHeapMatchesASortedModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Unix(1000, 0)
	var h deadlineHeap
	var model []*request
	for step := range 20000 {
		if len(model) < 64 && (len(model) == 0 || rng.IntN(2) == 0) {
			req := &request{deadline: base.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)}
			h.push(req)
			model = append(model, req)
		} else {
			i := rng.IntN(len(model))
			h.remove(model[i])
			if model[i].heapIndex != notInHeap {
				t.Fatalf("step %d: a removed request keeps index %d", step, model[i].heapIndex)
			}
			model = slices.Delete(model, i, i+1)
		}
		if len(h) != len(model) {
			t.Fatalf("step %d: %d in the heap, %d in the model", step, len(h), len(model))
		}
		if len(model) == 0 {
			continue
		}
		least := slices.MinFunc(model, func(a, b *request) int { return a.deadline.Compare(b.deadline) })
		if !h.earliest().deadline.Equal(least.deadline) {
			t.Fatalf("step %d: earliest %v, want %v", step, h.earliest().deadline, least.deadline)
		}
		for i, req := range h {
			if req.heapIndex != i {
				t.Fatalf("step %d: request at %d thinks it is at %d", step, i, req.heapIndex)
			}
		}
	}
}

// Close ends every wait session, idle or busy, with the shared ones.
func TestCloseEndsWaitSessions(t *testing.T) {
	clk := newFakeClock()
	h := startHeldPeer(t)
	c, err := dial(context.Background(), Config{Addrs: []string{h.srv.Addr()}, Sessions: 1, WaitSpares: 2}, clk)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the spares are connected", func() bool { return c.Stats().WaitSessionsIdle == 2 })
	res := goAcquire(c, "hot", waitFor(30*time.Second))
	eventually(t, "the server has the waiting acquire", func() bool { return len(h.seen(codec.OpAcquire)) == 1 })
	closeClient(t, c, clk)
	if r := await(t, res); !errors.Is(r.Err, ErrIndeterminate) || errors.Is(r.Err, ErrWaitElapsed) {
		t.Fatalf("in flight at Close: %v, want ErrIndeterminate, not a wait that ran out", r.Err)
	}
	eventually(t, "every connection is closed", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.ended) == h.conns
	})
}
