package client

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// stoppablePeer grants every acquire and answers PING until muted, then
// answers nothing at all: a node stopped (SIGSTOP) whose kernel still
// holds its connections.
func stoppablePeer(t *testing.T) *peer {
	return startAbandonPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if !p.muted.Load() {
			grant(p, c, f)
		}
	})
}

// sharedTicks moves the fake clock a third of the silence timeout and
// waits until every session's watch has run and live has answered the
// PINGs it was sent.
func sharedTicks(t *testing.T, c *Client, clk *fakeClock, live *peer) {
	t.Helper()
	tick(t, c, clk)
	eventually(t, "the live server answered its PINGs", func() bool {
		return len(live.seen(codec.OpPing)) == pingsAnswered(c, live)
	})
}

// pingsAnswered counts the PINGs the shared sessions to p no longer wait
// for: all of them, unless one is in flight.
func pingsAnswered(c *Client, p *peer) int {
	sent := len(p.seen(codec.OpPing))
	for i := range c.slots {
		s := c.slots[i].session.Load()
		if s == nil || s.addr != p.srv.Addr() {
			continue
		}
		s.mu.Lock()
		if s.silence.pingOwner != 0 {
			sent--
		}
		s.mu.Unlock()
	}
	return sent
}

// A server that stops while its session is idle is found out by the
// silence watch's PINGs, not by the next request sent to it: calls pass
// its session by once a PING went unanswered for a tick, the session is
// closed after the silence timeout with no request on it, and its slot
// dials the server that still answers. No request ever waits on the
// stopped server.
func TestAStoppedServerIsFoundOutWhileItsSessionIsIdle(t *testing.T) {
	clk := newFakeClock()
	stopped, live := stoppablePeer(t), stoppablePeer(t)
	c := newClient(t, stopped, clk, func(cfg *Config) {
		cfg.Addrs = []string{stopped.srv.Addr(), live.srv.Addr()}
		cfg.Sessions = 2
	})
	stopped.muted.Store(true)

	sharedTicks(t, c, clk, live) // a third quiet: PING
	sharedTicks(t, c, clk, live) // the PING unanswered for a tick: quiet
	for range 4 {
		if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != nil {
			t.Fatalf("acquire while one server is quiet: %v", err)
		}
	}
	if n := len(stopped.seen(codec.OpAcquire)); n != 0 {
		t.Fatalf("%d acquires sent to the quiet server, want 0", n)
	}
	if st := c.Stats(); st.SilentSessions != 0 {
		t.Fatalf("stats %+v: closed before the silence timeout", st)
	}
	sharedTicks(t, c, clk, live) // the whole timeout
	eventually(t, "the slot dials again", func() bool { return c.Stats().Sessions == 2 && c.Stats().Reconnects == 1 })
	if st := c.Stats(); st.SilentSessions != 1 {
		t.Fatalf("stats %+v: want the idle session to the stopped server closed", st)
	}
	for range 4 {
		if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != nil {
			t.Fatalf("acquire after the quiet session closed: %v", err)
		}
	}
	if n := len(stopped.seen(codec.OpAcquire)); n != 0 {
		t.Fatalf("%d acquires sent to the stopped server, want 0", n)
	}
}

// The wait pool dials round its addresses, so that a stopped node holds
// only its share of the spare wait sessions, not all of them.
func TestWaitSessionsAreSpreadOverTheAddresses(t *testing.T) {
	a, b := stoppablePeer(t), stoppablePeer(t)
	c := newClient(t, a, newFakeClock(), func(cfg *Config) {
		cfg.Addrs = []string{a.srv.Addr(), b.srv.Addr()}
		cfg.WaitSpares = 4
	})
	eventually(t, "the spares are connected", func() bool { return c.Stats().WaitSessionsIdle == 4 })
	onA, onB := 0, 0
	c.waits.mu.Lock()
	for _, s := range c.waits.idle {
		if s.addr == a.srv.Addr() {
			onA++
		} else {
			onB++
		}
	}
	c.waits.mu.Unlock()
	if onA != 2 || onB != 2 {
		t.Fatalf("%d spare wait sessions on one server, %d on the other; want 2 and 2", onA, onB)
	}
}

// A server whose kernel accepts the connection but which never sends its
// GREETING (a stopped node) is given up after the silence timeout, not
// the whole DialTimeout, and the dial moves on to the next address.
func TestAHandshakeThatHearsNothingEndsAtTheSilenceTimeout(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- conn // held open, never written to
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		for range len(accepted) {
			(<-accepted).Close()
		}
	})
	live := stoppablePeer(t)
	done := make(chan *Client, 1)
	go func() {
		c, err := dial(context.Background(), Config{
			Addrs: []string{silent.Addr().String(), live.srv.Addr()}, Sessions: 1, WaitSpares: -1,
			SilenceTimeout: minSilenceTimeout, DialTimeout: time.Hour,
		}, systemClock{})
		if err != nil {
			t.Errorf("dial: %v", err)
		}
		done <- c
	}()
	c := await(t, done) // a DialTimeout of an hour would not end in await's bound
	if c == nil {
		return
	}
	defer c.Close()
	if s := onlySession(c); s == nil || s.addr != live.srv.Addr() {
		t.Fatalf("session %+v, want one to the server that answers", s)
	}
}
