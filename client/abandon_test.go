package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// cutPeer offers SPEC §6a, closes the connection of every ACQUIRE of the
// key "cut" once it has it (the client cannot know whether it was
// granted), grants the other keys, and answers ABANDON with abandonAnswer
// (RELEASED unless set; 0 leaves it unanswered).
type cutPeer struct {
	*peer
	mu            sync.Mutex
	abandonAnswer byte
}

func startCutPeer(t *testing.T) *cutPeer {
	cp := &cutPeer{abandonAnswer: codec.OpReleased}
	cp.peer = startAbandonPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		switch {
		case f.op == codec.OpAcquire && f.key == "cut":
			c.Close()
		case f.op == codec.OpAbandon:
			cp.mu.Lock()
			op := cp.abandonAnswer
			cp.mu.Unlock()
			if op != 0 {
				c.Reply(op, f.owner)
			}
		default:
			grant(p, c, f)
		}
	})
	return cp
}

func (cp *cutPeer) answerAbandons(op byte) {
	cp.mu.Lock()
	cp.abandonAnswer = op
	cp.mu.Unlock()
}

// Every connection of a client declares the same client_id once, before
// anything else, where the GREETING offers SPEC §6a; another client
// declares another.
func TestSessionIsSentOncePerConnectionWhenTheGreetingOffersAbandon(t *testing.T) {
	clk := newFakeClock()
	p := startAbandonPeer(t, grant)
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2; cfg.WaitSpares = 1 })
	eventually(t, "the spare is connected", func() bool { return c.Stats().WaitSessionsIdle == 1 })
	for _, opts := range []AcquireOptions{waitFor(0), waitFor(5 * time.Second)} {
		tk, err := c.Acquire(context.Background(), "k", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(context.Background(), tk); err != nil {
			t.Fatal(err)
		}
	}
	// The waiting acquire took the spare, and the pool dialled another.
	eventually(t, "both wait sessions are idle", func() bool { return c.Stats().WaitSessionsIdle == 2 })
	other := newClient(t, p, clk, nil)

	p.mu.Lock()
	frames, conns := append([]frame(nil), p.frames...), p.conns
	p.mu.Unlock()
	perConn := map[int][]frame{}
	for _, f := range frames {
		perConn[f.conn] = append(perConn[f.conn], f)
	}
	// 2 shared, the spare the waiting acquire took and the one that
	// replaced it, and the other client's.
	if conns != 5 || len(perConn) != 5 {
		t.Fatalf("%d connections, %d with frames; want 5", conns, len(perConn))
	}
	ids := map[[codec.ClientIDLen]byte]int{}
	for conn, fs := range perConn {
		if fs[0].op != codec.OpSession {
			t.Errorf("connection %d began with %q, want SESSION", conn, fs[0].op)
		}
		if n := len(p.seenOn(conn, codec.OpSession)); n != 1 {
			t.Errorf("connection %d sent %d SESSIONs, want 1", conn, n)
		}
		ids[fs[0].clientID]++
	}
	if len(ids) != 2 || ids[*other.clientID] != 1 || ids[*c.clientID] != conns-1 {
		t.Fatalf("client_ids %v: want one per client, the same on all its connections", ids)
	}
	if *c.clientID == ([codec.ClientIDLen]byte{}) {
		t.Fatal("client_id is zero")
	}
}

// Without GREETING bit1 the client sends neither SESSION nor ABANDON,
// whatever other flag bits it does not know are set; an acquire cut
// after sending is left to its lease and its error says so.
func TestNoSessionOrAbandonWithoutTheGreetingBit(t *testing.T) {
	clk := newFakeClock()
	p := startFlagsPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.op == codec.OpAcquire && f.key == "cut" {
			c.Close()
			return
		}
		grant(p, c, f)
	}, nil, 0x80|0x04)
	c := newClient(t, p, clk, nil)

	_, err := c.Acquire(context.Background(), "cut", waitFor(0))
	if !errors.Is(err, ErrIndeterminate) || !strings.Contains(err.Error(), "left to its lease") {
		t.Fatalf("got %v, want ErrIndeterminate saying the grant is left to its lease", err)
	}
	if n := len(p.seen(codec.OpSession)) + len(p.seen(codec.OpAbandon)); n != 0 {
		t.Fatalf("%d SESSION or ABANDON frames sent to a server that does not offer them", n)
	}
	if st := c.Stats(); st.AbandonsSent+st.AbandonsGivenUp+st.AbandonsReleased+st.AbandonsNotHeld != 0 {
		t.Fatalf("stats %+v count abandons", st)
	}
}

// An acquire whose connection is cut after it was sent ends
// Indeterminate, and an ABANDON naming exactly its owner and key arrives
// on another connection of the client; RELEASED is counted.
func TestAcquireCutAfterSendingIsAbandonedOnAnotherConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts AcquireOptions
	}{
		{"immediate acquire on a shared session", waitFor(0)},
		{"waiting acquire on a wait session", waitFor(10 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			cp := startCutPeer(t)
			c := newClient(t, cp.peer, clk, func(cfg *Config) { cfg.Sessions = 2 })

			_, err := c.Acquire(context.Background(), "cut", tc.opts)
			if !errors.Is(err, ErrIndeterminate) || errors.Is(err, ErrWaitElapsed) {
				t.Fatalf("got %v, want ErrIndeterminate without ErrWaitElapsed", err)
			}
			if !strings.Contains(err.Error(), "ABANDON is queued") {
				t.Fatalf("%q does not say an ABANDON is queued", err)
			}
			eventually(t, "the ABANDON is answered", func() bool { return c.Stats().AbandonsReleased == 1 })
			acq, ab := cp.seen(codec.OpAcquire), cp.seen(codec.OpAbandon)
			if len(acq) != 1 || len(ab) != 1 {
				t.Fatalf("acquires %+v, abandons %+v; want one of each", acq, ab)
			}
			if ab[0].target != acq[0].owner || ab[0].key != "cut" || ab[0].owner == acq[0].owner || ab[0].conn == acq[0].conn {
				t.Fatalf("abandon %+v for acquire %+v: want its owner and key as target, a fresh owner, another connection", ab[0], acq[0])
			}
			if st := c.Stats(); st.AbandonsSent != 1 || st.AbandonsNotHeld != 0 || st.AbandonsGivenUp != 0 {
				t.Fatalf("stats %+v, want one abandon sent and answered RELEASED", st)
			}
		})
	}
}

// An ABANDON answered NOT HELD is done too, and counted apart.
func TestAbandonAnsweredNotHeldIsCounted(t *testing.T) {
	clk := newFakeClock()
	cp := startCutPeer(t)
	cp.answerAbandons(codec.OpNotHeld)
	c := newClient(t, cp.peer, clk, func(cfg *Config) { cfg.Sessions = 2 })
	if _, err := c.Acquire(context.Background(), "cut", waitFor(0)); !errors.Is(err, ErrIndeterminate) {
		t.Fatal(err)
	}
	eventually(t, "the ABANDON is answered", func() bool { return c.Stats().AbandonsNotHeld == 1 })
	if st := c.Stats(); st.AbandonsSent != 1 || st.AbandonsReleased != 0 || st.AbandonsGivenUp != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// No ABANDON follows an acquire certainly never sent (its deadline came
// while it waited in the client for a wait session), nor one whose
// ACQUIRED arrived, even when its connection is cut afterwards. The one
// ABANDON that comes is for the acquire cut in flight, queued last.
func TestNoAbandonForAnUnsentAcquireOrAnAnsweredOne(t *testing.T) {
	clk := newFakeClock()
	release := make(chan struct{})
	p := startAbandonPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		switch {
		case f.op == codec.OpAcquire && f.key == "held":
			go func() { <-release; c.Close() }()
		case f.op == codec.OpAcquire && f.key == "granted":
			grant(p, c, f)
			c.Close()
		case f.op == codec.OpAbandon:
			c.Reply(codec.OpReleased, f.owner)
		default:
			grant(p, c, f)
		}
	})
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2; cfg.WaitSessions = 1 })

	held := goAcquire(c, "held", waitFor(30*time.Second))
	eventually(t, "the server has the waiting acquire", func() bool { return len(p.seen(codec.OpAcquire)) == 1 })
	unsent := goAcquire(c, "unsent", waitFor(time.Second))
	eventually(t, "the second waits for the one wait session", func() bool { return clk.dueIn(time.Second) })
	clk.Advance(time.Second)
	if r := await(t, unsent); !errors.Is(r.Err, ErrTimeout) || errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("unsent acquire: %v, want ErrTimeout", r.Err)
	}

	tk, err := c.Acquire(context.Background(), "granted", waitFor(0))
	if err != nil {
		t.Fatalf("granted acquire: %v", err)
	}
	close(release)
	if r := await(t, held); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("cut acquire: %v", r.Err)
	}
	eventually(t, "the ABANDON is answered", func() bool { return c.Stats().AbandonsReleased == 1 })
	ab := p.seen(codec.OpAbandon)
	if len(ab) != 1 || ab[0].key != "held" || ab[0].target != p.seen(codec.OpAcquire)[0].owner {
		t.Fatalf("abandons %+v, want only the one of the acquire cut in flight", ab)
	}
	if tk.Token() == 0 {
		t.Fatal("no token")
	}
}

// holdAbandonsPeer cuts the connection of every ACQUIRE of "cut" and
// never answers ABANDON, but answers PING: a live server that is slow to
// give back.
func holdAbandonsPeer(t *testing.T) *cutPeer {
	cp := startCutPeer(t)
	cp.answerAbandons(0)
	return cp
}

// With every compensation worker busy and the queue full, the next
// acquire to give back is left to its lease at once: counted given up,
// and its error says so. The others are given up 5 s after their
// enqueue without an answer.
func TestAbandonQueueFullIsGivenUp(t *testing.T) {
	clk := newFakeClock()
	cp := holdAbandonsPeer(t)
	c := newClient(t, cp.peer, clk, func(cfg *Config) { cfg.CompensationQueue = 1 })
	const calls = compensationWorkers + 2

	errs := make(chan error, calls)
	for range calls {
		go func() {
			_, err := c.Acquire(context.Background(), "cut", waitFor(0))
			errs <- err
		}()
	}
	// Each is cut, on the server or on its way there, after it may have
	// left.
	full := 0
	for range calls {
		err := await(t, errs)
		if !errors.Is(err, ErrIndeterminate) {
			t.Fatal(err)
		}
		if strings.Contains(err.Error(), "compensation queue was full") {
			full++
		}
	}
	// The ABANDONs are never answered: each worker holds one until its
	// 5 s are over, one more waits in the queue, and the last is refused.
	if st := c.Stats(); full != 1 || st.AbandonsGivenUp != 1 {
		t.Fatalf("%d errors say the queue was full, stats %+v; want 1", full, st)
	}
	eventually(t, "every worker has its ABANDON on the server", func() bool {
		targets := map[uint64]bool{}
		for _, f := range cp.seen(codec.OpAbandon) {
			targets[f.target] = true
		}
		return len(targets) == compensationWorkers
	})
	clk.Advance(IODeadline)
	eventually(t, "every abandon is given up", func() bool { return c.Stats().AbandonsGivenUp == calls })
	// The one queued behind the workers had its 5 s too, spent waiting.
	if st := c.Stats(); st.AbandonsSent != compensationWorkers || st.AbandonsReleased+st.AbandonsNotHeld != 0 {
		t.Fatalf("stats %+v, want %d sent and none answered", st, compensationWorkers)
	}
}

// An ABANDON has 5 s from its enqueue, retries and reconnects included:
// one whose connection is cut is sent again on the next, and given up
// when the 5 s are over, not 5 s after the retry.
func TestAbandonHasFiveSecondsFromEnqueueRetriesIncluded(t *testing.T) {
	clk := newFakeClock()
	var cutOnce sync.Once
	p := startAbandonPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		switch f.op {
		case codec.OpAcquire:
			c.Close()
		case codec.OpAbandon:
			cutOnce.Do(func() { c.Close() }) // the first is lost; the retry is held
		}
	})
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2 })
	if _, err := c.Acquire(context.Background(), "cut", waitFor(0)); !errors.Is(err, ErrIndeterminate) {
		t.Fatal(err)
	}
	eventually(t, "the ABANDON is retried", func() bool { return len(p.seen(codec.OpAbandon)) == 2 })
	clk.Advance(IODeadline - time.Millisecond)
	if st := c.Stats(); st.AbandonsGivenUp != 0 {
		t.Fatalf("given up before 5 s: %+v", st)
	}
	clk.Advance(time.Millisecond)
	eventually(t, "the abandon is given up", func() bool { return c.Stats().AbandonsGivenUp == 1 })
	ab := p.seen(codec.OpAbandon)
	if ab[0].target != ab[1].target || ab[0].owner == 0 || ab[0].conn == ab[1].conn {
		t.Fatalf("abandons %+v: want the same target on two connections", ab)
	}
	if st := c.Stats(); st.AbandonsSent != 1 {
		t.Fatalf("stats %+v: an abandon is counted sent once, however often retried", st)
	}
}

// The end of a grant the client never saw, against lockdtest.Locks: the
// ACQUIRED is lost on a connection that then goes silent; the silence
// timeout closes it, the ABANDON releases the grant, and the key is free
// for the next caller at once, not after its 30 s lease.
func TestGrantTheClientNeverSawIsGivenBackAndTheKeyIsFree(t *testing.T) {
	clk := newFakeClock()
	locks := &lockdtest.Locks{}
	srv, err := lockdtest.Start(locks.Serve)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	stall := &stallingDialer{}
	c := newClient(t, &peer{srv: srv}, clk, func(cfg *Config) {
		cfg.WaitSpares = 1
		cfg.Dialer = stall.dial
	})
	eventually(t, "the spare is connected", func() bool { return c.Stats().WaitSessionsIdle == 1 })
	stall.stallConn(1) // the wait session hears nothing from now on

	res := goAcquire(c, "k", waitFor(30*time.Second))
	eventually(t, "the writer has sent the acquire", func() bool { return clk.dueIn(silenceTick(c.cfg.SilenceTimeout)) })
	for i := 0; c.Stats().SilentSessions == 0; i++ {
		if i == 10 {
			t.Fatal("the silent session was not closed")
		}
		clk.Advance(silenceTick(c.cfg.SilenceTimeout))
		eventually(t, "the tick ran", func() bool {
			return c.Stats().SilentSessions == 1 || clk.dueIn(silenceTick(c.cfg.SilenceTimeout))
		})
	}
	if r := await(t, res); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate", r.Err)
	}
	eventually(t, "the ABANDON released the grant", func() bool { return c.Stats().AbandonsReleased == 1 })
	tk, err := c.Acquire(context.Background(), "k", waitFor(0))
	if err != nil {
		t.Fatalf("the key is still held after the abandon: %v", err)
	}
	if tk.Token() != 2 {
		t.Fatalf("token %d, want 2: the lost grant had 1", tk.Token())
	}
}
