package server

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/poll"
)

// Every row of SPEC §9 that single mode can produce, over real TCP: the
// exact reason, the owner it is attributed to, and whether the connection
// stays open.
func TestErrorTable(t *testing.T) {
	tests := []struct {
		name   string
		frames [][]byte
		owner  uint64
		reason codec.Reason
		open   bool
	}{
		{"unknown op", [][]byte{[]byte("Z\n")}, 0, codec.BadRequest, false},
		{"text where none is allowed", [][]byte{append(codec.AppendPing(nil, 5)[:9], "x\n"...)}, 0, codec.BadRequest, false},
		{"no LF within 192 bytes", [][]byte{bytes.Repeat([]byte{'A'}, 192)}, 0, codec.Oversized, false},
		{"empty key", [][]byte{codec.AppendAcquire(nil, 3, 30, 0, "")}, 3, codec.BadKey, true},
		{"key over 128 bytes", [][]byte{codec.AppendAcquire(nil, 3, 30, 0, strings.Repeat("k", 129))}, 3, codec.BadKey, true},
		{"43 three-byte runes", [][]byte{codec.AppendAcquire(nil, 3, 30, 0, strings.Repeat("한", 43))}, 3, codec.BadKey, true},
		{"key with a space", [][]byte{codec.AppendAcquire(nil, 3, 30, 0, "a b")}, 3, codec.BadKey, true},
		{"key not UTF-8", [][]byte{codec.AppendAcquire(nil, 3, 30, 0, "\xc3")}, 3, codec.BadKey, true},
		{"release with a bad key", [][]byte{codec.AppendRelease(nil, 3, 1, "")}, 3, codec.BadKey, true},
		{"lease 0", [][]byte{codec.AppendAcquire(nil, 3, 0, 0, "k")}, 3, codec.BadLease, true},
		{"lease 3601", [][]byte{codec.AppendAcquire(nil, 3, 3601, 0, "k")}, 3, codec.BadLease, true},
		{"owner 0 acquire", [][]byte{codec.AppendAcquire(nil, 0, 30, 0, "k")}, 0, codec.BadOwner, true},
		{"owner 0 release", [][]byte{codec.AppendRelease(nil, 0, 1, "k")}, 0, codec.BadOwner, true},
		{"owner 0 ping", [][]byte{codec.AppendPing(nil, 0)}, 0, codec.BadOwner, true},
		{"second HELLO", [][]byte{
			codec.AppendHello(nil, [16]byte{}, [32]byte{}, "t1"),
			codec.AppendHello(nil, [16]byte{}, [32]byte{}, "t1"),
		}, 0, codec.BadRequest, false},
		{"HELLO after a request", [][]byte{
			codec.AppendPing(nil, 1),
			codec.AppendHello(nil, [16]byte{}, [32]byte{}, "t1"),
		}, 0, codec.BadRequest, false},
		// SPEC §6a.
		{"second SESSION", [][]byte{codec.AppendSession(nil, 1, testClientID), codec.AppendSession(nil, 2, testClientID)}, 2, codec.BadRequest, false},
		{"SESSION after an ACQUIRE", [][]byte{codec.AppendAcquire(nil, 1, 30, 0, "k"), codec.AppendSession(nil, 2, testClientID)}, 2, codec.BadRequest, false},
		{"ABANDON before SESSION", [][]byte{codec.AppendAbandon(nil, 1, 5, "k")}, 1, codec.BadRequest, false},
		{"SESSION with text", [][]byte{append(codec.AppendSession(nil, 1, testClientID)[:25], "x\n"...)}, 0, codec.BadRequest, false},
		{"owner 0 SESSION", [][]byte{codec.AppendSession(nil, 0, testClientID)}, 0, codec.BadOwner, true},
		{"owner 0 ABANDON", [][]byte{codec.AppendSession(nil, 1, testClientID), codec.AppendAbandon(nil, 0, 5, "k")}, 0, codec.BadOwner, true},
		{"ABANDON of target 0", [][]byte{codec.AppendSession(nil, 1, testClientID), codec.AppendAbandon(nil, 2, 0, "k")}, 2, codec.BadOwner, true},
		{"ABANDON with a bad key", [][]byte{codec.AppendSession(nil, 1, testClientID), codec.AppendAbandon(nil, 2, 5, "a b")}, 2, codec.BadKey, true},
	}
	s := startServer(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, s)
			c.send(tt.frames...)
			for {
				r := c.recv()
				if r.Op == codec.OpError {
					if r.Reason != tt.reason || r.Owner != tt.owner {
						t.Fatalf("got E %v owner %d, want E %v owner %d", r.Reason, r.Owner, tt.reason, tt.owner)
					}
					break
				}
			}
			if tt.open {
				c.expectOpen()
			} else {
				c.expectClosed()
			}
		})
	}
}

func TestMissingBytesAtEOF(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.send(codec.AppendAcquire(nil, 1, 30, 0, "k")[:6])
	if err := c.nc.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.expectError(0, codec.BadRequest)
	c.expectClosed()
}

func TestProgressTimeout(t *testing.T) {
	s := startServer(t, nil)
	stalled := dial(t, s)
	healthy := dial(t, s)
	stalled.send(codec.AppendAcquire(nil, 1, 30, 0, "k")[:4])
	healthy.send(codec.AppendPing(nil, 7)[:3])
	waitFor(t, func() bool { return s.stalledCount() == 2 })

	s.clock.Advance(ProgressTimeout - time.Millisecond)
	healthy.send(codec.AppendPing(nil, 7)[3:])
	healthy.expect(codec.OpPong, 7)

	// More bytes of the same frame do not restart its clock.
	stalled.send(codec.AppendAcquire(nil, 1, 30, 0, "k")[4:6])
	s.clock.Advance(time.Millisecond)
	stalled.expectError(0, codec.BadRequest)
	stalled.expectClosed()

	// Each frame has its own clock: a new frame started now is on time.
	healthy.send(codec.AppendPing(nil, 8)[:3])
	waitFor(t, func() bool { return s.stalledCount() == 1 })
	s.clock.Advance(ProgressTimeout - time.Millisecond)
	healthy.send(codec.AppendPing(nil, 8)[3:])
	healthy.expect(codec.OpPong, 8)
	if got := s.metrics.progressTimeouts.Load(); got != 1 {
		t.Fatalf("progress timeouts = %d, want 1", got)
	}
}

func (s *testServer) stalledCount() int {
	s.stalledMu.Lock()
	defer s.stalledMu.Unlock()
	return len(s.stalled)
}

func TestDupOwner(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.mustAcquire(1, "k")

	c := dial(t, s)
	c.acquire(5, 30, 10, "k") // queued: owner 5 is in flight
	c.acquire(5, 30, 10, "other")
	c.expectError(5, codec.DupOwner)
	c.send(codec.AppendPing(nil, 5))
	c.expectError(5, codec.DupOwner)
	c.expectOpen()

	// Once answered, the owner may be reused, and reuse gives no authority.
	s.advance(10 * time.Second)
	c.expect(codec.OpTimeout, 5)
	c.acquire(5, 30, 0, "k")
	c.expect(codec.OpTimeout, 5)
}

func TestAuthHandshake(t *testing.T) {
	secret := []byte("correct horse")
	s := startServer(t, func(cfg *Config) {
		cfg.Auth = map[string][]byte{"alpha": secret, "beta": []byte("other")}
	})

	t.Run("greeting says auth is required", func(t *testing.T) {
		c := dial(t, s)
		if c.greeting.Flags&codec.GreetingAuthRequired == 0 || c.greeting.Version != codec.Version ||
			string(c.greeting.NodeName) != "test-node" {
			t.Fatalf("greeting %+v", c.greeting)
		}
	})
	t.Run("request before WELCOME", func(t *testing.T) {
		c := dial(t, s)
		c.acquire(4, 30, 0, "k")
		c.expectError(4, codec.AuthRequired)
		c.expectClosed()
	})
	t.Run("field error before WELCOME is still auth_required", func(t *testing.T) {
		c := dial(t, s)
		c.acquire(4, 0, 0, "k")
		c.expectError(4, codec.AuthRequired)
		c.expectClosed()
	})
	t.Run("accepted and mutual", func(t *testing.T) {
		c := dial(t, s)
		if r := c.hello("alpha", secret); r.Op != codec.OpWelcome {
			t.Fatalf("got %q %v", r.Op, r.Reason)
		}
		c.mustAcquire(1, "k")
	})
	rejected := map[string]func(c *testConn) codec.Response{
		"wrong MAC":       func(c *testConn) codec.Response { return c.hello("alpha", []byte("wrong")) },
		"unknown tenant":  func(c *testConn) codec.Response { return c.hello("gamma", secret) },
		"bad tenant name": func(c *testConn) codec.Response { return c.hello("no/slash", secret) },
		"zero MAC": func(c *testConn) codec.Response {
			c.send(codec.AppendHello(nil, [16]byte{}, [32]byte{}, "alpha"))
			return c.recv()
		},
		"bad version": func(c *testConn) codec.Response {
			f := codec.AppendHello(nil, [16]byte{}, codec.ClientMAC(secret, c.greeting.ServerNonce, [16]byte{}, []byte("alpha")), "alpha")
			f[1] = 2
			c.send(f)
			return c.recv()
		},
	}
	for name, attempt := range rejected {
		t.Run(name, func(t *testing.T) {
			c := dial(t, s)
			if r := attempt(c); r.Op != codec.OpError || r.Reason != codec.AuthFailed {
				t.Fatalf("got %q %v, want E auth_failed", r.Op, r.Reason)
			}
			c.expectClosed()
		})
	}
	t.Run("replayed HELLO", func(t *testing.T) {
		first := dial(t, s)
		var nonce [16]byte
		mac := codec.ClientMAC(secret, first.greeting.ServerNonce, nonce, []byte("alpha"))
		hello := codec.AppendHello(nil, nonce, mac, "alpha")
		first.send(hello)
		first.expect(codec.OpWelcome, 0)
		second := dial(t, s)
		second.send(hello)
		second.expectError(0, codec.AuthFailed)
		second.expectClosed()
	})
	t.Run("tenants are isolated", func(t *testing.T) {
		a := dial(t, s)
		a.hello("alpha", secret)
		b := dial(t, s)
		b.hello("beta", []byte("other"))
		token := a.mustAcquire(1, "shared-name")
		b.send(codec.AppendRelease(nil, 2, token, "shared-name"))
		b.expect(codec.OpNotHeld, 2)
		b.mustAcquire(3, "shared-name") // beta's own key of the same name
		a.acquire(4, 30, 0, "shared-name")
		a.expect(codec.OpTimeout, 4) // alpha's lock was untouched
		a.send(codec.AppendRelease(nil, 5, token, "shared-name"))
		a.expect(codec.OpReleased, 5)
	})
}

func TestAuthOffHelloOptional(t *testing.T) {
	s := startServer(t, nil)
	plain := dial(t, s)
	if plain.greeting.Flags&codec.GreetingAuthRequired != 0 {
		t.Fatal("auth off must not set the auth flag")
	}
	token := plain.mustAcquire(1, "k") // tenant "default"

	named := dial(t, s)
	r := named.hello("default", nil)
	if r.Op != codec.OpWelcome || r.ServerMAC != [32]byte{} {
		t.Fatalf("auth-off WELCOME must carry 32 zero bytes: %+v", r)
	}
	named.send(codec.AppendRelease(nil, 2, token, "k"))
	named.expect(codec.OpReleased, 2)

	other := dial(t, s)
	other.hello("other", nil)
	other.mustAcquire(3, "k")
}

func TestRefusesExposedAddressWithoutAuth(t *testing.T) {
	for _, tt := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Listen: "127.0.0.1:7420"}, true},
		{Config{Listen: "[::1]:7420"}, true},
		{Config{Listen: "localhost:7420"}, true},
		{Config{Listen: "0.0.0.0:7420"}, false},
		{Config{Listen: ":7420"}, false},
		{Config{Listen: "10.1.2.3:7420"}, false},
		{Config{Listen: "0.0.0.0:7420", InsecureNoAuth: true}, true},
		{Config{Listen: "0.0.0.0:7420", Auth: map[string][]byte{"t": {1}}}, true},
	} {
		if err := exposureError(tt.cfg); (err == nil) != tt.ok {
			t.Errorf("%+v: err = %v", tt.cfg, err)
		}
	}
	if _, err := Start(Config{Listen: "0.0.0.0:0"}); err == nil || !strings.Contains(err.Error(), "insecure-no-auth") {
		t.Fatalf("Start on 0.0.0.0 without auth: %v", err)
	}
}

func TestFIFOAcrossConnections(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	token := holder.mustAcquire(1, "fifo")

	waiters := make([]*testConn, 4)
	for i := range waiters {
		waiters[i] = dial(t, s)
		waiters[i].acquire(uint64(10+i), 30, 60, "fifo")
		// Each waiter is queued before the next one asks.
		waiters[i].expectOpen()
	}
	owner, tok := uint64(2), token
	releaser := holder
	for i, w := range waiters {
		releaser.send(codec.AppendRelease(nil, owner, tok, "fifo"))
		releaser.expect(codec.OpReleased, owner)
		r := w.expect(codec.OpAcquired, uint64(10+i))
		if r.Token <= tok {
			t.Fatalf("token %d after %d: tokens must only grow", r.Token, tok)
		}
		releaser, owner, tok = w, uint64(20+i), r.Token
	}
}

func TestWaitExpiryAnswersTimeout(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.mustAcquire(1, "k")
	c := dial(t, s)
	c.acquire(2, 30, 0, "k")
	c.expect(codec.OpTimeout, 2) // wait 0: one immediate attempt
	c.acquire(3, 30, 3, "k")
	c.expectOpen()
	s.advance(3*time.Second - time.Millisecond)
	c.expectOpen() // still queued
	s.advance(time.Millisecond)
	c.expect(codec.OpTimeout, 3)
}

func TestLeaseExpiryHandsOffWithWaitedMs(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.acquire(1, 2, 0, "k")
	first := holder.expect(codec.OpAcquired, 1)

	s.advance(500 * time.Millisecond)
	w := dial(t, s)
	w.acquire(2, 30, 10, "k")
	w.expectOpen()
	s.advance(1500 * time.Millisecond) // the holder's lease ends now
	r := w.expect(codec.OpAcquired, 2)
	if r.WaitedMs != 1500 {
		t.Fatalf("waited_ms = %d, want 1500", r.WaitedMs)
	}
	if r.Token <= first.Token {
		t.Fatalf("token %d not above %d", r.Token, first.Token)
	}
	holder.send(codec.AppendRelease(nil, 3, first.Token, "k"))
	holder.expect(codec.OpNotHeld, 3) // the expired token is no longer current
}

func TestLockOutlivesItsConnection(t *testing.T) {
	s := startServer(t, nil)
	a := dial(t, s)
	token := a.mustAcquire(1, "k")
	a.nc.Close()

	b := dial(t, s)
	b.acquire(2, 30, 0, "k")
	b.expect(codec.OpTimeout, 2)
	b.send(codec.AppendRelease(nil, 3, token, "k"))
	b.expect(codec.OpReleased, 3)
	b.mustAcquire(4, "k")
}

func TestWaiterDroppedWithItsConnection(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	token := holder.mustAcquire(1, "k")
	gone := dial(t, s)
	gone.acquire(2, 30, 60, "k")
	gone.expectOpen()
	next := dial(t, s)
	next.acquire(3, 30, 60, "k")
	next.expectOpen()
	gone.nc.Close()
	waitFor(t, func() bool { return s.Engine().Stats().Waiters == 1 })

	holder.send(codec.AppendRelease(nil, 4, token, "k"))
	holder.expect(codec.OpReleased, 4)
	next.expect(codec.OpAcquired, 3)
}

// waitFor polls a condition that another goroutine makes true; it is not
// a timing assertion, only a bounded wait for an asynchronous close.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	if !poll.Until(ioTimeout, 2*time.Millisecond, cond) {
		t.Fatal("condition not reached")
	}
}

func TestPipelinedBurstInOneWrite(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	const n = 500
	var burst []byte
	for i := range n {
		burst = codec.AppendAcquire(burst, uint64(i+1), 30, 0, "burst/"+string(rune('a'+i%26))+strings.Repeat("x", i%40))
	}
	if len(burst) < 2*ReadBufferCap {
		t.Fatalf("burst of %d bytes must span several reads", len(burst))
	}
	c.send(burst)
	seen := make(map[uint64]bool, n)
	for range n {
		r := c.recv()
		if r.Op != codec.OpAcquired && r.Op != codec.OpTimeout {
			t.Fatalf("unexpected %q", r.Op)
		}
		if seen[r.Owner] {
			t.Fatalf("owner %d answered twice", r.Owner)
		}
		seen[r.Owner] = true
	}
	c.expectOpen()
}

func TestResponsesBatchedPerWrite(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	const n = 640
	var burst []byte
	for i := range n {
		burst = codec.AppendPing(burst, uint64(i+1))
	}
	before := s.metrics.writes.Load()
	c.send(burst)
	for i := range n {
		c.expect(codec.OpPong, uint64(i+1))
	}
	writes := s.metrics.writes.Load() - before
	// At most 64 responses per write, so at least n/64 writes; far fewer
	// writes than responses, or batching is not happening.
	if writes < n/ResponseBatch || writes > n/16 {
		t.Fatalf("%d responses took %d writes", n, writes)
	}
}

func TestFramesSplitAtEveryByte(t *testing.T) {
	s := startServer(t, nil)
	var stream []byte
	stream = codec.AppendAcquire(stream, 0x0A, 30, 0x0A, "split/é")
	stream = codec.AppendPing(stream, 0x0A0A)
	stream = codec.AppendRelease(stream, 0x0B, 1, "split/none")
	for cut := 1; cut < len(stream); cut++ {
		c := dial(t, s)
		c.send(stream[:cut])
		c.send(stream[cut:])
		r := c.expect(codec.OpAcquired, 0x0A)
		c.expect(codec.OpPong, 0x0A0A)
		c.expect(codec.OpNotHeld, 0x0B)
		c.send(codec.AppendRelease(nil, 0x0C, r.Token, "split/é"))
		c.expect(codec.OpReleased, 0x0C)
		c.nc.Close()
	}
}

func TestAdmissionGatesOverTCP(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Engine.MaxKeys = 20 })
	c := dial(t, s)
	tokens := make([]uint64, 0, 18)
	for i := range 18 { // 90 % of 20
		tokens = append(tokens, c.mustAcquire(uint64(i+1), keyN(i)))
	}
	c.acquire(100, 30, 0, keyN(18))
	c.expect(codec.OpBusy, 100)
	// Releases are never gated, and an existing key is not a new key.
	c.send(codec.AppendRelease(nil, 101, tokens[0], keyN(0)))
	c.expect(codec.OpReleased, 101)
	c.acquire(102, 30, 0, keyN(1))
	c.expect(codec.OpTimeout, 102)
	for i := 1; i <= 2; i++ { // down to 15 = 75 %: still closed
		c.send(codec.AppendRelease(nil, uint64(110+i), tokens[i], keyN(i)))
		c.expect(codec.OpReleased, uint64(110+i))
	}
	c.acquire(103, 30, 0, keyN(18))
	c.expect(codec.OpBusy, 103)
	c.send(codec.AppendRelease(nil, 120, tokens[3], keyN(3))) // 14 < 75 %
	c.expect(codec.OpReleased, 120)
	c.acquire(104, 30, 0, keyN(18))
	c.expect(codec.OpAcquired, 104)

	st := s.Engine().Stats()
	if st.KeysGate.Refused != 2 {
		t.Fatalf("keys gate refused %d, want 2", st.KeysGate.Refused)
	}
}

func keyN(i int) string { return "gate/" + strings.Repeat("k", i+1) }

func TestPerConnectionInflightLimit(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.MaxConnInflight = 2 })
	holder := dial(t, s)
	holder.mustAcquire(1, "k")
	c := dial(t, s)
	c.acquire(2, 30, 60, "k")
	c.acquire(3, 30, 60, "k")
	c.acquire(4, 30, 60, "k")
	c.expect(codec.OpBusy, 4)
	c.expectOpen()
}

func TestShutdownAnswersWaiters(t *testing.T) {
	s := startServer(t, nil)
	holder := dial(t, s)
	holder.mustAcquire(1, "k")
	w := dial(t, s)
	w.acquire(2, 30, 60, "k")
	w.expectOpen()

	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	w.expectError(2, codec.ShuttingDown)
	w.expectClosed()
	if err := <-done; err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Fatal("a closed server still accepts connections")
	}
}

func TestMaxConns(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.MaxConns = 2 })
	dial(t, s)
	dial(t, s)
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	extra := newTestConn(t, nc)
	extra.expectClosed()
	if got := s.metrics.connsRejected.Load(); got != 1 {
		t.Fatalf("rejected %d connections, want 1", got)
	}
}

func TestTokenExhausted(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Engine.FirstToken = ^uint64(0) })
	c := dial(t, s)
	r := c.mustAcquire(1, "k")
	if r != ^uint64(0) {
		t.Fatalf("token %d", r)
	}
	c.send(codec.AppendRelease(nil, 2, r, "k"))
	c.expect(codec.OpReleased, 2)
	c.acquire(3, 30, 0, "k")
	c.expectError(3, codec.TokenExhausted)
	c.expectOpen()
}

// A grant that reaches a connection while it closes is never written
// after the closing E; the server releases it so the lock is not stranded
// until its lease ends.
func TestGrantToClosingConnectionIsReleased(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	token := c.mustAcquire(1, "k")
	c.acquire(2, 30, 10, "k")
	c.expectOpen()
	// The release hands the lock to owner 2 on this same connection, and
	// the broken frame after it closes the connection in the same pass.
	c.send(append(codec.AppendRelease(nil, 3, token, "k"), "Z\n"...))
	c.expect(codec.OpReleased, 3)
	c.expectError(0, codec.BadRequest)
	c.expectClosed()

	waitFor(t, func() bool { return s.backend.Stats().UndeliveredQueued == 1 })
	other := dial(t, s)
	waitFor(t, func() bool {
		other.acquire(4, 30, 0, "k")
		return other.recv().Op == codec.OpAcquired
	})
}

// exposureError is CheckExposure's problems as the one error Start
// returns.
func exposureError(cfg Config) error { return errors.Join(CheckExposure(cfg)...) }
