package client

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// holdingPeer offers SPEC §6a, never answers an ACQUIRE of "held" (a
// waiter that stays queued), answers ABANDON RELEASED and grants the
// rest. Its connections are handed to the test by the owner of the held
// acquire.
func holdingPeer(t *testing.T, held chan<- *lockdtest.Conn) *peer {
	return startAbandonPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		switch {
		case f.op == codec.OpAcquire && f.key == "held":
			held <- c
		case f.op == codec.OpAbandon:
			c.Reply(codec.OpReleased, f.owner)
		default:
			grant(p, c, f)
		}
	})
}

// tick moves the fake clock by a third of the silence timeout and waits
// until every session's silence watch has run: re-armed for a later tick,
// or its session closed.
func tick(t *testing.T, c *Client, clk *fakeClock) {
	t.Helper()
	clk.Advance(silenceTick(c.cfg.SilenceTimeout))
	eventually(t, "the silence watches ran", func() bool { return watchesArmed(c, clk) })
}

// watchesArmed reports whether the silence watch of every open session of
// c is armed for a later instant: none is running or about to.
func watchesArmed(c *Client, clk *fakeClock) bool {
	var sessions []*session
	for i := range c.slots {
		if s := c.slots[i].session.Load(); s != nil {
			sessions = append(sessions, s)
		}
	}
	c.waits.mu.Lock()
	for s := range c.waits.all {
		sessions = append(sessions, s)
	}
	c.waits.mu.Unlock()
	for _, s := range sessions {
		if !s.alive() {
			continue
		}
		ft := s.silence.tick.(*fakeTimer)
		clk.mu.Lock()
		_, armed := clk.timers[ft]
		later := ft.when.After(clk.now)
		clk.mu.Unlock()
		if !armed || !later {
			return false
		}
	}
	return true
}

// A server that goes silent, PINGs included, while a waiting acquire is
// in flight: the session is closed once it has heard nothing for the
// silence timeout, long before the acquire's 30 s wait, the acquire ends
// Indeterminate (not ErrWaitElapsed) and is abandoned on another
// connection.
func TestSilenceTimeoutClosesTheSessionOfASilentServer(t *testing.T) {
	clk := newFakeClock()
	held := make(chan *lockdtest.Conn, 1)
	p := holdingPeer(t, held)
	c := newClient(t, p, clk, nil)
	if c.cfg.SilenceTimeout != 2*time.Second {
		t.Fatalf("default silence timeout %v, want 2 s", c.cfg.SilenceTimeout)
	}

	res := goAcquire(c, "held", waitFor(30*time.Second))
	await(t, held)
	p.muted.Store(true)
	eventually(t, "the silence watch is armed", func() bool { return clk.dueIn(silenceTick(c.cfg.SilenceTimeout)) })
	tick(t, c, clk) // nothing heard for a third: PING
	tick(t, c, clk) // two thirds
	if st := c.Stats(); st.SilentSessions != 0 {
		t.Fatalf("closed after two thirds of the silence timeout: %+v", st)
	}
	tick(t, c, clk) // the whole timeout, the PING unanswered
	// Every session to the muted server goes, idle ones included.
	if st := c.Stats(); st.SilentSessions == 0 {
		t.Fatalf("stats %+v: want the silent session closed", st)
	}
	r := await(t, res)
	if !errors.Is(r.Err, ErrIndeterminate) || errors.Is(r.Err, ErrWaitElapsed) {
		t.Fatalf("got %v, want ErrIndeterminate without ErrWaitElapsed", r.Err)
	}
	acq := p.seen(codec.OpAcquire)[0]
	if pings := p.seenOn(acq.conn, codec.OpPing); len(pings) != 1 {
		t.Fatalf("%d PINGs on the silent session, want 1", len(pings))
	}
	eventually(t, "the acquire is abandoned", func() bool { return c.Stats().AbandonsReleased == 1 })
	if ab := p.seen(codec.OpAbandon); len(ab) != 1 || ab[0].target != acq.owner || ab[0].conn == acq.conn {
		t.Fatalf("abandons %+v for acquire %+v", ab, acq)
	}
}

// A slow but live server — one that holds a waiting ACQUIRE for longer
// than the silence timeout but answers PING — keeps its session: the
// acquire is granted when the server gets to it.
func TestPingKeepsASlowButLiveServersSessionOpen(t *testing.T) {
	clk := newFakeClock()
	held := make(chan *lockdtest.Conn, 1)
	p := holdingPeer(t, held)
	c := newClient(t, p, clk, func(cfg *Config) { cfg.SilenceTimeout = 900 * time.Millisecond })

	res := goAcquire(c, "held", waitFor(30*time.Second))
	conn := await(t, held)
	eventually(t, "the silence watch is armed", func() bool { return clk.dueIn(silenceTick(c.cfg.SilenceTimeout)) })
	for range 15 { // five silence timeouts
		tick(t, c, clk)
		// A live server answers a PING sent at this tick before the next.
		eventually(t, "the PING is answered", func() bool { return !pingInFlight(c) })
	}
	if st := c.Stats(); st.SilentSessions != 0 || st.AbandonedSessions != 0 {
		t.Fatalf("stats %+v: a live server's session was closed", st)
	}
	acq := p.seen(codec.OpAcquire)[0]
	pings := p.seenOn(acq.conn, codec.OpPing)
	if len(pings) < 5 {
		t.Fatalf("%d PINGs in five silence timeouts", len(pings))
	}
	if err := conn.Acquired(acq.owner, 7, uint32((5 * c.cfg.SilenceTimeout).Milliseconds())); err != nil {
		t.Fatal(err)
	}
	r := await(t, res)
	if r.Err != nil || r.Ticket.Token() != 7 {
		t.Fatalf("got %v, %v; want the grant", r.Ticket, r.Err)
	}
}

// pingInFlight reports whether a wait session of c has a PING unanswered.
func pingInFlight(c *Client) bool {
	c.waits.mu.Lock()
	defer c.waits.mu.Unlock()
	for s := range c.waits.all {
		s.mu.Lock()
		inFlight := s.silence.pingOwner != 0
		s.mu.Unlock()
		if inFlight {
			return true
		}
	}
	return false
}

// A release on a session whose server went silent follows its own rules:
// the silence timeout closes that session, and the release, which may be
// repeated, is sent again on another session within its 5 s.
func TestReleaseOnASilentSessionIsRetriedElsewhere(t *testing.T) {
	clk := newFakeClock()
	var releases atomic.Int32
	p := startAbandonPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.op == codec.OpRelease && releases.Add(1) > 1 {
			c.Reply(codec.OpReleased, f.owner)
		}
	})
	p.muted.Store(true)
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2 })

	done := goRelease(c, "k", 7)
	eventually(t, "the server has the release", func() bool { return len(p.seen(codec.OpRelease)) == 1 })
	eventually(t, "the silence watch is armed", func() bool { return clk.dueIn(silenceTick(c.cfg.SilenceTimeout)) })
	for range 3 {
		tick(t, c, clk)
	}
	if err := await(t, done); err != nil {
		t.Fatalf("release: %v, want RELEASED from the retry", err)
	}
	rel := p.seen(codec.OpRelease)
	if st := c.Stats(); st.SilentSessions == 0 || len(rel) != 2 || rel[0].conn == rel[1].conn {
		t.Fatalf("stats %+v, releases %+v: want the silent session closed and the release sent again on another", st, rel)
	}
}

// TestProtocolDocStatesTheSilenceTimeout: docs/protocol.md states the
// silence timeout's default and floor that Config applies.
func TestProtocolDocStatesTheSilenceTimeout(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("`Config.SilenceTimeout` (default %g s, at least %d ms)", defaultSilenceTimeout.Seconds(), minSilenceTimeout.Milliseconds()),
		fmt.Sprintf("silence timeout (default %g s, an", defaultSilenceTimeout.Seconds()),
	} {
		if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), want) {
			t.Errorf("docs/protocol.md does not say %q", want)
		}
	}
}
