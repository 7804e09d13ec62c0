package server

import (
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

// keep sends a KEEP and returns the answer.
func (c *testConn) keep(owner, token uint64, lease uint16, key string) codec.Response {
	c.t.Helper()
	c.send(codec.AppendKeep(nil, owner, token, lease, key))
	return c.recv()
}

// expectRenewed checks a KEEP answer: A with the same token, waited_ms 0.
func (c *testConn) expectRenewed(owner, token uint64, lease uint16, key string) {
	c.t.Helper()
	r := c.keep(owner, token, lease, key)
	if r.Op != codec.OpAcquired || r.Owner != owner || r.Token != token || r.WaitedMs != 0 {
		c.t.Fatalf("KEEP answered %q owner %d token %d waited %d (reason %v), want A owner %d token %d waited 0",
			r.Op, r.Owner, r.Token, r.WaitedMs, r.Reason, owner, token)
	}
}

// A renewed lease ends lease_s after the KEEP, not after the grant: a
// waiter is handed the lock at the new end, and the old end hands nothing
// off (SPEC §5 KEEP).
func TestKeepMovesTheLeaseEnd(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.acquire(1, 10, 0, "k")
	token := holder.expect(codec.OpAcquired, 1).Token
	w := dial(t, s)
	w.acquire(2, 30, 60, "k")
	w.expectOpen()

	s.advance(8 * time.Second)
	holder.expectRenewed(3, token, 10, "k") // now ends at 18 s
	s.advance(2 * time.Second)              // the granted lease's end: 10 s
	w.expectOpen()
	holder.expectRenewed(4, token, 10, "k") // still current; now ends at 20 s
	s.advance(10*time.Second - time.Millisecond)
	w.expectOpen()
	s.advance(time.Millisecond)
	r := w.expect(codec.OpAcquired, 2)
	if r.Token <= token {
		t.Fatalf("token %d after %d", r.Token, token)
	}
	if r.WaitedMs != 20000 {
		t.Fatalf("waited_ms %d, want 20000", r.WaitedMs)
	}
}

// KEEP may shorten a lease: a waiter gets the lock at the shorter end.
func TestKeepMayShortenTheLease(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.acquire(1, 60, 0, "k")
	token := holder.expect(codec.OpAcquired, 1).Token
	w := dial(t, s)
	w.acquire(2, 30, 60, "k")
	w.expectOpen()
	holder.expectRenewed(3, token, 2, "k")
	s.advance(2 * time.Second)
	w.expect(codec.OpAcquired, 2)
}

// Every KEEP that is not for the current token of an unexpired lock in
// the connection's tenant is answered N, and changes nothing.
func TestKeepNotHeld(t *testing.T) {
	s := startServer(t, func(cfg *Config) {
		cfg.Auth = map[string][]byte{"alpha": []byte("a-secret"), "beta": []byte("b-secret")}
	})
	a := dial(t, s)
	a.hello("alpha", []byte("a-secret"))
	b := dial(t, s)
	b.hello("beta", []byte("b-secret"))

	for _, tt := range []struct {
		name string
		run  func(t *testing.T) codec.Response
	}{
		{"absent key", func(t *testing.T) codec.Response { return a.keep(10, 1, 30, "absent") }},
		{"expired lease", func(t *testing.T) codec.Response {
			a.acquire(11, 2, 0, "expired")
			tok := a.expect(codec.OpAcquired, 11).Token
			s.advance(2 * time.Second)
			r := a.keep(12, tok, 30, "expired")
			a.mustAcquire(24, "expired") // the N renewed nothing: the key is free
			return r
		}},
		{"old token", func(t *testing.T) codec.Response {
			old := a.mustAcquire(13, "old")
			a.send(codec.AppendRelease(nil, 14, old, "old"))
			a.expect(codec.OpReleased, 14)
			cur := a.mustAcquire(15, "old")
			r := a.keep(16, old, 30, "old")
			a.expectRenewed(17, cur, 30, "old") // the current token is untouched
			return r
		}},
		{"released", func(t *testing.T) codec.Response {
			tok := a.mustAcquire(18, "released")
			a.send(codec.AppendRelease(nil, 19, tok, "released"))
			a.expect(codec.OpReleased, 19)
			return a.keep(20, tok, 30, "released")
		}},
		{"other tenant", func(t *testing.T) codec.Response {
			tok := a.mustAcquire(21, "shared")
			r := b.keep(22, tok, 30, "shared")
			a.expectRenewed(23, tok, 30, "shared")
			return r
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.run(t)
			if r.Op != codec.OpNotHeld {
				t.Fatalf("got %q (reason %v), want N", r.Op, r.Reason)
			}
		})
	}
}

// Without waiters a lease ends lazily; a renewed one still ends at its new
// end, not the granted one.
func TestKeepWithoutWaiters(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.acquire(1, 5, 0, "k")
	token := holder.expect(codec.OpAcquired, 1).Token
	s.advance(4 * time.Second)
	holder.expectRenewed(2, token, 5, "k") // ends at 9 s
	s.advance(4 * time.Second)             // 8 s: past the granted end
	other := dial(t, s)
	other.acquire(3, 30, 0, "k")
	other.expect(codec.OpTimeout, 3)
	s.advance(time.Second)
	other.acquire(4, 30, 0, "k")
	if r := other.expect(codec.OpAcquired, 4); r.Token <= token {
		t.Fatalf("token %d after %d", r.Token, token)
	}
}

// Field errors of a KEEP keep the connection open (SPEC §9), and an owner
// in flight is dup_owner.
func TestKeepFieldErrors(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	token := holder.mustAcquire(1, "k")
	c := dial(t, s)
	c.acquire(2, 30, 60, "k") // queued: owner 2 is in flight
	c.expectOpen()
	for _, tt := range []struct {
		name   string
		frame  []byte
		owner  uint64
		reason codec.Reason
	}{
		{"lease 0", codec.AppendKeep(nil, 3, token, 0, "k"), 3, codec.BadLease},
		{"lease 3601", codec.AppendKeep(nil, 3, token, 3601, "k"), 3, codec.BadLease},
		{"empty key", codec.AppendKeep(nil, 3, token, 30, ""), 3, codec.BadKey},
		{"key with a space", codec.AppendKeep(nil, 3, token, 30, "a b"), 3, codec.BadKey},
		{"owner 0", codec.AppendKeep(nil, 0, token, 30, "k"), 0, codec.BadOwner},
		{"owner in flight", codec.AppendKeep(nil, 2, token, 30, "k"), 2, codec.DupOwner},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c.send(tt.frame)
			c.expectError(tt.owner, tt.reason)
			c.expectOpen()
		})
	}
	// None of them renewed: the lease still ends at 30 s.
	s.advance(30 * time.Second)
	c.expect(codec.OpAcquired, 2)
}

// KEEP passes no admission gate (SPEC §5, §8): with the keys, waiters or
// in-flight gate closed, the holder still renews. (The in-flight gate is
// checked first, so it gets a configuration of its own.)
func TestKeepPassesClosedGates(t *testing.T) {
	for _, tt := range []struct {
		name                    string
		keys, waiters, inflight int
		closed                  func(engine.Stats) bool
	}{
		{"keys and waiters", 10, 10, 100, func(st engine.Stats) bool { return !st.KeysGate.Open && !st.WaitersGate.Open }},
		{"in-flight", 100, 100, 10, func(st engine.Stats) bool { return !st.InflightGate.Open }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t, func(cfg *Config) {
				cfg.Engine.MaxKeys, cfg.Engine.MaxWaiters, cfg.Engine.MaxInflight = tt.keys, tt.waiters, tt.inflight
			})
			c := dial(t, s)
			var tokens []uint64
			for i := range 9 { // 90 % of the keys limit
				tokens = append(tokens, c.mustAcquire(uint64(i+1), keyN(i)))
			}
			w := dial(t, s)
			for i := range 9 { // 90 % of the waiters and in-flight limits
				w.acquire(uint64(50+i), 30, 120, keyN(0))
			}
			w.acquire(99, 30, 120, keyN(0))
			w.expect(codec.OpBusy, 99)
			c.acquire(100, 30, 0, keyN(9))
			c.expect(codec.OpBusy, 100)
			st := s.Engine().Stats()
			if !tt.closed(st) {
				t.Fatalf("gates should be closed: %+v", st)
			}
			for i, tok := range tokens {
				c.expectRenewed(uint64(200+i), tok, 60, keyN(i))
			}
			after := s.Engine().Stats()
			if after.Keys != st.Keys || after.Waiters != st.Waiters || after.Inflight != st.Inflight ||
				after.KeysGate != st.KeysGate || after.WaitersGate != st.WaitersGate || after.InflightGate != st.InflightGate {
				t.Fatalf("KEEP touched the gates: before %+v after %+v", st, after)
			}
			// The renewal holds: the waiters get keyN(0) at 60 s, not 30 s.
			s.advance(30 * time.Second)
			w.expectOpen()
			s.advance(30 * time.Second)
			w.expect(codec.OpAcquired, 50)
		})
	}
}

// A KEEP answer is counted under its own op and result.
func TestKeepMetrics(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	token := c.mustAcquire(1, "k")
	c.expectRenewed(2, token, 30, "k")
	c.keep(3, token+1, 30, "k")
	if got := s.metrics.results[opKeep][resultRenewed].Load(); got != 1 {
		t.Fatalf("keep/renewed = %d, want 1", got)
	}
	if got := s.metrics.results[opKeep][resultNotHeld].Load(); got != 1 {
		t.Fatalf("keep/not_held = %d, want 1", got)
	}
	if got := s.metrics.requests[opKeep].Load(); got != 2 {
		t.Fatalf("keep requests = %d, want 2", got)
	}
}
