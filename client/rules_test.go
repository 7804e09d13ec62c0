package client

import (
	"context"
	"errors"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

func TestDurationsRoundUpToWholeSeconds(t *testing.T) {
	p := startPeer(t, grant)
	c := newClient(t, p, newFakeClock(), nil)
	cases := []struct {
		opts      AcquireOptions
		lease     uint16
		wireWait  uint8
		immediate bool
	}{
		{AcquireOptions{Lease: 1500 * time.Millisecond, MinWorkBudget: Budget(0)}, 2, 0, true},
		{AcquireOptions{Lease: time.Nanosecond, MinWorkBudget: Budget(0)}, 1, 0, true},
		{AcquireOptions{Lease: 3600 * time.Second, Wait: 255 * time.Second, MinWorkBudget: Budget(250 * time.Second)}, 3600, 255, false},
		{AcquireOptions{Wait: 1200 * time.Millisecond, MinWorkBudget: Budget(0)}, 30, 2, false},
		{AcquireOptions{Lease: 2 * time.Second, MinWorkBudget: Budget(1500 * time.Millisecond)}, 2, 0, true},
	}
	for i, tc := range cases {
		key := "k" + string(rune('a'+i))
		tk, err := c.Acquire(context.Background(), key, tc.opts)
		if err != nil && !errors.Is(err, ErrIndeterminate) {
			t.Fatalf("case %d: %v", i, err)
		}
		if err == nil {
			c.Release(context.Background(), tk)
		}
		got := p.seen(codec.OpAcquire)
		f := got[len(got)-1]
		if f.key != key || f.lease != tc.lease || f.wait != tc.wireWait {
			t.Errorf("case %d: wire lease %d wait %d, want %d and %d", i, f.lease, f.wait, tc.lease, tc.wireWait)
		}
	}
}

func TestDefaultLeaseIs30Seconds(t *testing.T) {
	p := startPeer(t, grant)
	c := newClient(t, p, newFakeClock(), nil)
	if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != nil {
		t.Fatal(err)
	}
	if f := p.seen(codec.OpAcquire)[0]; f.lease != 30 {
		t.Fatalf("wire lease %d, want 30", f.lease)
	}
}

func TestOutOfRangeDurationsFailBeforeSending(t *testing.T) {
	p := startPeer(t, grant)
	c := newClient(t, p, newFakeClock(), nil)
	cases := []struct {
		name string
		opts AcquireOptions
		want error
	}{
		{"lease over 3600 s", AcquireOptions{Lease: 3601 * time.Second, MinWorkBudget: Budget(0)}, ErrUnsupportedDuration},
		{"lease rounds up past 3600 s", AcquireOptions{Lease: 3600*time.Second + 1, MinWorkBudget: Budget(0)}, ErrUnsupportedDuration},
		{"negative lease", AcquireOptions{Lease: -time.Second, MinWorkBudget: Budget(0)}, ErrUnsupportedDuration},
		{"wait over 255 s", AcquireOptions{Wait: 256 * time.Second, MinWorkBudget: Budget(0)}, ErrUnsupportedDuration},
		{"wait rounds up past 255 s", AcquireOptions{Wait: 255*time.Second + 1, MinWorkBudget: Budget(0)}, ErrUnsupportedDuration},
		{"negative wait", AcquireOptions{Wait: -1, MinWorkBudget: Budget(0)}, ErrUnsupportedDuration},
		{"budget missing", AcquireOptions{Lease: time.Minute}, ErrUnsupportedDuration},
		{"budget over 250 s", AcquireOptions{Lease: time.Hour, MinWorkBudget: Budget(251 * time.Second)}, ErrUnsupportedDuration},
		{"budget rounds up past 250 s", AcquireOptions{Lease: time.Hour, MinWorkBudget: Budget(250*time.Second + 1)}, ErrUnsupportedDuration},
		{"negative budget", AcquireOptions{MinWorkBudget: Budget(-1)}, ErrUnsupportedDuration},
		{"budget over lease", AcquireOptions{Lease: 10 * time.Second, MinWorkBudget: Budget(11 * time.Second)}, ErrInsufficientLease},
		{"budget rounds up past lease", AcquireOptions{Lease: time.Second, MinWorkBudget: Budget(time.Second + 1)}, ErrInsufficientLease},
		{"budget over default lease", AcquireOptions{MinWorkBudget: Budget(31 * time.Second)}, ErrInsufficientLease},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.Acquire(context.Background(), "k", tc.opts); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if n := len(p.seen(codec.OpAcquire)); n != 0 {
		t.Fatalf("%d acquires reached the server", n)
	}
}

func TestKeyRules(t *testing.T) {
	p := startPeer(t, grant)
	c := newClient(t, p, newFakeClock(), nil)
	bad := map[string]string{
		"empty":         "",
		"129 bytes":     strings.Repeat("k", 129),
		"space":         "a b",
		"CR":            "k\r",
		"LF":            "a\nb",
		"invalid UTF-8": "k\xff",
		"43 × 한":        strings.Repeat("한", 43),
	}
	for name, key := range bad {
		if _, err := c.Acquire(context.Background(), key, waitFor(0)); !errors.Is(err, ErrBadKey) {
			t.Errorf("acquire %s: got %v, want ErrBadKey", name, err)
		}
		if err := c.ReleaseToken(context.Background(), key, 1); !errors.Is(err, ErrBadKey) {
			t.Errorf("release %s: got %v, want ErrBadKey", name, err)
		}
	}
	if n := len(p.seen(codec.OpAcquire)) + len(p.seen(codec.OpRelease)); n != 0 {
		t.Fatalf("%d frames with bad keys reached the server", n)
	}
	good := []string{strings.Repeat("k", 128), strings.Repeat("é", 64), strings.Repeat("한", 42), "a\tb"}
	for _, key := range good {
		tk, err := c.Acquire(context.Background(), key, waitFor(0))
		if err != nil {
			t.Fatalf("acquire %q: %v", key, err)
		}
		if tk.Key() != key {
			t.Fatalf("ticket key %q", tk.Key())
		}
	}
}

// A waiting acquire that waited in the client for a wait session carries
// only its remaining time on the wire, rounded up.
func TestWireWaitIsRemainingTimeAtSend(t *testing.T) {
	clk := newFakeClock()
	g := startGatePeer(t)
	c := newClient(t, g.peer, clk, func(cfg *Config) { cfg.WaitSessions = 1 })

	first := goAcquire(c, "first", waitFor(30*time.Second))
	f := await(t, g.frames)
	second := goAcquire(c, "second", waitFor(10*time.Second))
	eventually(t, "the second call waits for the only wait session", func() bool { return clk.dueIn(10 * time.Second) })
	clk.Advance(3*time.Second + 500*time.Millisecond)
	g.conn.Acquired(f.owner, 1, 0)
	f2 := await(t, g.frames)
	g.conn.Acquired(f2.owner, 2, 0)

	for _, ch := range []<-chan result{first, second} {
		if r := await(t, ch); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if f.wait != 30 || f2.key != "second" || f2.wait != 7 {
		t.Fatalf("wire waits %d and %d, want first 30 and second ceil(6.5 s) = 7", f.wait, f2.wait)
	}
	if f2.conn != f.conn {
		t.Fatalf("the second acquire used connection %d; the first's wait session %d was free again", f2.conn, f.conn)
	}
}

// Requests that end while still in the client were certainly never sent:
// ErrTimeout, and nothing else is disturbed — neither the wait session a
// waiting acquire is queued for, nor the shared session a request is
// queued on behind a write.
func TestDeadlineWhileQueuedLocallyIsTimeoutNotSent(t *testing.T) {
	t.Run("waiting for a wait session", func(t *testing.T) {
		clk := newFakeClock()
		g := startGatePeer(t)
		c := newClient(t, g.peer, clk, func(cfg *Config) { cfg.WaitSessions = 1 })

		first := goAcquire(c, "first", waitFor(30*time.Second))
		f := await(t, g.frames)
		second := goAcquire(c, "second", waitFor(2*time.Second))
		eventually(t, "the second call waits for the wait session", func() bool { return clk.dueIn(2 * time.Second) })
		clk.Advance(2 * time.Second)
		if r := await(t, second); !errors.Is(r.Err, ErrTimeout) || errors.Is(r.Err, ErrIndeterminate) {
			t.Fatalf("queued request at its deadline: %v, want ErrTimeout", r.Err)
		}
		g.conn.Acquired(f.owner, 1, 0)
		if r := await(t, first); r.Err != nil {
			t.Fatalf("the wait session must stay usable: %v", r.Err)
		}
		if n := len(g.seen(codec.OpAcquire)); n != 1 {
			t.Fatalf("%d acquires sent; the one that timed out in the client must not be", n)
		}
	})
	t.Run("queued behind a write", func(t *testing.T) {
		clk := newFakeClock()
		p := startPeer(t, grant)
		gate := newFirstWriteGate()
		c := newClient(t, p, clk, func(cfg *Config) { cfg.Dialer = hookDialer(gate.write) })

		first := goAcquire(c, "first", waitFor(0))
		eventually(t, "the writer holds the first frame", gate.entered.Load)
		second := goAcquireCtx(withFakeDeadline(clk, 2*time.Second), c, "second", waitFor(0))
		eventually(t, "the second request is queued", func() bool { return queued(onlySession(c)) == 1 })
		clk.Advance(2 * time.Second)
		if r := await(t, second); !errors.Is(r.Err, ErrTimeout) || errors.Is(r.Err, ErrIndeterminate) {
			t.Fatalf("queued request at its deadline: %v, want ErrTimeout", r.Err)
		}
		close(gate.open)
		if r := await(t, first); r.Err != nil {
			t.Fatalf("the session must stay usable: %v", r.Err)
		}
		for _, f := range p.seen(codec.OpAcquire) {
			if f.key == "second" {
				t.Fatal("a request that timed out in the local queue was sent")
			}
		}
	})
}

func TestDeadlineWaitingForASessionIsTimeoutNotSent(t *testing.T) {
	for _, wait := range []time.Duration{0, 3 * time.Second} {
		t.Run(wait.String(), func(t *testing.T) {
			clk := newFakeClock()
			p := startPeer(t, grant)
			block := make(chan struct{})
			c := newClient(t, p, clk, func(cfg *Config) {
				first := true
				cfg.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
					if first {
						first = false
						return (&net.Dialer{}).DialContext(ctx, network, addr)
					}
					select {
					case <-block:
					case <-ctx.Done():
					}
					return nil, errors.New("test: no reconnect")
				}
			})
			defer close(block)
			onlySession(c).fail(errors.New("test: session lost"))
			eventually(t, "no session is ready", func() bool { return c.Stats().Sessions == 0 })

			bound := wait
			if wait == 0 {
				bound = IODeadline
			}
			res := goAcquire(c, "k", waitFor(wait))
			eventually(t, "the call waits on its deadline", func() bool { return clk.dueIn(bound) })
			clk.Advance(bound)
			if r := await(t, res); !errors.Is(r.Err, ErrTimeout) || errors.Is(r.Err, ErrIndeterminate) {
				t.Fatalf("got %v, want ErrTimeout", r.Err)
			}
			if n := len(p.seen(codec.OpAcquire)); n != 0 {
				t.Fatalf("%d acquires sent", n)
			}
		})
	}
}

func TestDeadlineAfterSendIsIndeterminateAndClosesThatSession(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, nil)
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2 })

	res := goAcquire(c, "k", waitFor(2*time.Second))
	eventually(t, "the server has the frame", func() bool { return len(p.seen(codec.OpAcquire)) == 1 })
	sentOn := p.seen(codec.OpAcquire)[0].conn
	clk.Advance(2 * time.Second)

	if r := await(t, res); !errors.Is(r.Err, ErrIndeterminate) || !errors.Is(r.Err, ErrWaitElapsed) {
		t.Fatalf("got %v, want ErrIndeterminate and ErrWaitElapsed", r.Err)
	}
	eventually(t, "the session that sent is closed", func() bool { return p.connEnded(sentOn) })
	if sentOn < 2 || p.connEnded(0) || p.connEnded(1) {
		t.Fatalf("sent on connection %d; the shared sessions 0 and 1 must carry no waiting acquire and stay open", sentOn)
	}
}

func TestImmediateAcquireHasWireWaitZeroAndFiveSecondIODeadline(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, nil)
	c := newClient(t, p, clk, nil)

	res := goAcquire(c, "k", waitFor(0))
	eventually(t, "the server has the frame", func() bool { return len(p.seen(codec.OpAcquire)) == 1 })
	if f := p.seen(codec.OpAcquire)[0]; f.wait != 0 {
		t.Fatalf("wire wait %d, want 0", f.wait)
	}
	clk.Advance(IODeadline - time.Millisecond)
	if !pending(res) {
		t.Fatal("an immediate acquire ended before its 5 s I/O deadline")
	}
	clk.Advance(time.Millisecond)
	if r := await(t, res); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate", r.Err)
	}
	eventually(t, "the session is closed", func() bool { return p.connEnded(0) })
}

func TestUnsentAttemptMovesToAnotherSessionWithTheSameOwner(t *testing.T) {
	for _, wait := range []time.Duration{0, 20 * time.Second} {
		t.Run(wait.String(), func(t *testing.T) {
			clk := newFakeClock()
			p := startPeer(t, grant)
			var failed sync.Once
			var failedOwner uint64
			c := newClient(t, p, clk, func(cfg *Config) {
				cfg.Sessions = 2
				cfg.Dialer = hookDialer(func(hc *hookedConn, b []byte) (int, error) {
					refuse := false
					failed.Do(func() {
						refuse = true
						failedOwner = ownerOf(b)
					})
					if refuse {
						clk.Advance(4 * time.Second)
						return 0, errors.New("test: write refused")
					}
					return hc.Conn.Write(b)
				})
			})
			tk, err := c.Acquire(context.Background(), "k", waitFor(wait))
			if err != nil {
				t.Fatal(err)
			}
			sent := p.seen(codec.OpAcquire)
			if len(sent) != 1 || sent[0].owner != failedOwner {
				t.Fatalf("server saw %+v; want one frame with the first attempt's owner %d", sent, failedOwner)
			}
			wantWait := uint8(0)
			if wait > 0 {
				wantWait = 16 // 20 s minus the 4 s the failed attempt took
			}
			if sent[0].wait != wantWait {
				t.Fatalf("retry wire wait %d, want %d", sent[0].wait, wantWait)
			}
			if tk.Token() == 0 {
				t.Fatal("zero token")
			}
		})
	}
}

func ownerOf(frame []byte) uint64 {
	var owner uint64
	for _, b := range frame[1:9] {
		owner = owner<<8 | uint64(b)
	}
	return owner
}

func TestPartialWriteRetriesOnlyFramesThatNeverLeft(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.key == "two" {
			grant(p, c, f)
		}
	})
	gate := newFirstWriteGate()
	var firstConnWrites atomic.Int32
	c := newClient(t, p, clk, func(cfg *Config) {
		cfg.Dialer = hookDialer(func(hc *hookedConn, b []byte) (int, error) {
			if hc.index == 0 && firstConnWrites.Add(1) == 2 {
				// The batch [one, two]: exactly the first frame gets out.
				frameLen := 1 + 11 + len("one") + 1
				hc.Conn.Write(b[:frameLen])
				return frameLen, errors.New("test: connection reset")
			}
			return gate.write(hc, b)
		})
	})
	held := goAcquire(c, "held", waitFor(0))
	eventually(t, "the writer holds the first frame", gate.entered.Load)
	one := goAcquire(c, "one", waitFor(0))
	eventually(t, "one is queued", func() bool { return queued(onlySession(c)) == 1 })
	two := goAcquire(c, "two", waitFor(0))
	eventually(t, "two is queued", func() bool { return queued(onlySession(c)) == 2 })
	close(gate.open)

	if r := await(t, one); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("the frame that left: %v, want ErrIndeterminate", r.Err)
	}
	if r := await(t, held); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("the unanswered frame of the failed session: %v, want ErrIndeterminate", r.Err)
	}
	if r := await(t, two); r.Err != nil {
		t.Fatalf("the frame that never left must move to the next session: %v", r.Err)
	}
	count := map[string][]int{}
	eventually(t, "the server has read the frame that left", func() bool {
		clear(count)
		for _, f := range p.seen(codec.OpAcquire) {
			count[f.key] = append(count[f.key], f.conn)
		}
		return len(count["one"]) > 0
	})
	if len(count["one"]) != 1 || len(count["two"]) != 1 || count["two"][0] == 0 {
		t.Fatalf("connections per key %v: one once on the first, two once on the next", count)
	}
}

func TestAcquireIsNeverRetransmittedOnceSent(t *testing.T) {
	cases := map[string]answerFunc{
		"server closes without answering": func(_ *peer, c *lockdtest.Conn, f frame) { c.Close() },
		"server closes mid-frame": func(_ *peer, c *lockdtest.Conn, f frame) {
			c.Write(codec.AppendAcquired(nil, f.owner, 1, 0)[:7])
			c.Close()
		},
	}
	for name, answer := range cases {
		t.Run(name, func(t *testing.T) {
			p := startPeer(t, answer)
			c := newClient(t, p, newFakeClock(), func(cfg *Config) { cfg.Sessions = 2 })
			_, err := c.Acquire(context.Background(), "k", waitFor(10*time.Second))
			if !errors.Is(err, ErrIndeterminate) {
				t.Fatalf("got %v, want ErrIndeterminate", err)
			}
			if n := len(p.seen(codec.OpAcquire)); n != 1 {
				t.Fatalf("the acquire was sent %d times", n)
			}
		})
	}
}

// gatePeer hands each ACQUIRE to the test, which answers it on conn when
// its clock is where it wants it, and answers every RELEASE at once.
type gatePeer struct {
	*peer
	frames chan frame
	conn   *lockdtest.Conn // the connection of the last frame handed over

	connsMu sync.Mutex
	conns   map[uint64]*lockdtest.Conn // by owner
}

func startGatePeer(t *testing.T) *gatePeer {
	g := &gatePeer{frames: make(chan frame, 4), conns: make(map[uint64]*lockdtest.Conn)}
	g.peer = startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.op == codec.OpRelease {
			c.Reply(codec.OpReleased, f.owner)
			return
		}
		g.connsMu.Lock()
		g.conns[f.owner] = c
		g.connsMu.Unlock()
		g.conn = c
		g.frames <- f
	})
	return g
}

// Acquired grants the acquire f, on the connection it came on.
func (g *gatePeer) Acquired(f frame) {
	g.connsMu.Lock()
	c := g.conns[f.owner]
	g.connsMu.Unlock()
	c.Acquired(f.owner, g.tokens.Add(1), 0)
}

// expectCompensated checks the delivery gate's outcome for the grant the
// acquire f got: the call ended Indeterminate, the exact token was
// released on the shared session, and the session the grant came on
// stayed open.
func (g *gatePeer) expectCompensated(t *testing.T, c *Client, f frame, res <-chan result, token uint64) {
	t.Helper()
	if r := await(t, res); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate", r.Err)
	}
	eventually(t, "the compensating release is answered", func() bool { return c.Stats().CompensationsDone == 1 })
	rel := g.seen(codec.OpRelease)
	if len(rel) != 1 || rel[0].key != "k" || rel[0].token != token || rel[0].conn != 0 {
		t.Fatalf("releases %+v, want token %d of k on the shared session", rel, token)
	}
	if g.connEnded(f.conn) || g.connEnded(0) || c.Stats().Sessions != 1 {
		t.Fatal("a session was closed")
	}
}

func TestGrantFoundAfterTheDeadlineIsCompensated(t *testing.T) {
	clk := newFakeClock()
	g := startGatePeer(t)
	c := newClient(t, g.peer, clk, nil)

	res := goAcquire(c, "k", waitFor(2*time.Second))
	f := await(t, g.frames)
	// The answer is correlated, but the caller only reaches the gate
	// after its deadline: its timer fires late.
	clk.Jump(2 * time.Second)
	g.conn.Acquired(f.owner, 77, 0)
	g.expectCompensated(t, c, f, res, 77)
}

func TestGrantWithLessValidityThanTheBudgetIsCompensated(t *testing.T) {
	clk := newFakeClock()
	g := startGatePeer(t)
	c := newClient(t, g.peer, clk, nil)

	opts := AcquireOptions{Lease: 10 * time.Second, Wait: 30 * time.Second, MinWorkBudget: Budget(5 * time.Second)}
	res := goAcquire(c, "k", opts)
	f := await(t, g.frames)
	clk.Advance(6 * time.Second) // the grant comes 6 s after the send
	g.conn.Acquired(f.owner, 9, 0)
	g.expectCompensated(t, c, f, res, 9)
}

func TestTimeoutAndBusyAreDefinitive(t *testing.T) {
	cases := map[byte]error{codec.OpTimeout: ErrTimeout, codec.OpBusy: ErrBusy}
	for op, want := range cases {
		for _, wait := range []time.Duration{0, 5 * time.Second} {
			t.Run(string(op)+"/"+wait.String(), func(t *testing.T) {
				p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) { c.Reply(op, f.owner) })
				c := newClient(t, p, newFakeClock(), nil)
				_, err := c.Acquire(context.Background(), "k", waitFor(wait))
				if err != want {
					t.Fatalf("got %v, want exactly %v", err, want)
				}
				sent := p.seen(codec.OpAcquire)
				if len(sent) != 1 {
					t.Fatalf("sent %d times", len(sent))
				}
				st := c.Stats()
				if p.connEnded(sent[0].conn) || st.Sessions != 1 || st.CompensationsQueued != 0 {
					t.Fatalf("a definitive answer must keep the session and compensate nothing: %+v", st)
				}
				if wait > 0 && st.WaitSessionsIdle != 1 {
					t.Fatalf("the wait session did not come back to the pool: %+v", st)
				}
			})
		}
	}
}

func TestServerErrorReasonsAreTypedErrors(t *testing.T) {
	cases := []struct {
		reason codec.Reason
		want   error
	}{
		{codec.Unavailable, ErrUnavailable},
		{codec.TokenExhausted, ErrTokenExhausted},
		{codec.ShuttingDown, ErrShuttingDown},
		{codec.BadKey, ErrBadKey},
		{codec.BadLease, ErrUnsupportedDuration},
		{codec.BadOwner, ErrProtocol},
		{codec.DupOwner, ErrProtocol},
		{codec.AuthRequired, ErrAuth},
	}
	for _, tc := range cases {
		t.Run(tc.reason.String(), func(t *testing.T) {
			p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) { c.Error(f.owner, tc.reason) })
			c := newClient(t, p, newFakeClock(), nil)
			_, err := c.Acquire(context.Background(), "k", waitFor(5*time.Second))
			if !errors.Is(err, tc.want) || !errors.Is(err, tc.reason) || errors.Is(err, ErrIndeterminate) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestUnattributedServerErrorMakesInFlightIndeterminate(t *testing.T) {
	p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) {
		c.Error(0, codec.ShuttingDown)
		c.Close()
	})
	c := newClient(t, p, newFakeClock(), nil)
	_, err := c.Acquire(context.Background(), "k", waitFor(5*time.Second))
	if !errors.Is(err, ErrIndeterminate) || !errors.Is(err, codec.ShuttingDown) {
		t.Fatalf("got %v, want ErrIndeterminate caused by shutting_down", err)
	}
}

func TestReleaseAnswers(t *testing.T) {
	p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) {
		if f.token == 1 {
			c.Reply(codec.OpReleased, f.owner)
		} else {
			c.Reply(codec.OpNotHeld, f.owner)
		}
	})
	c := newClient(t, p, newFakeClock(), nil)
	if err := c.ReleaseToken(context.Background(), "k", 1); err != nil {
		t.Fatalf("R: %v", err)
	}
	if err := c.ReleaseToken(context.Background(), "k", 2); err != ErrNotHeld {
		t.Fatalf("N: %v, want ErrNotHeld", err)
	}
	if err := c.ReleaseToken(context.Background(), "k", 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("token 0: %v", err)
	}
}

func TestReleaseWithoutAnswerIsIndeterminateAfterFiveSeconds(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, nil)
	c := newClient(t, p, clk, nil)
	res := goRelease(c, "k", 5)
	eventually(t, "the server has the release", func() bool { return len(p.seen(codec.OpRelease)) == 1 })
	clk.Advance(IODeadline - time.Millisecond)
	if !pending(res) {
		t.Fatal("the release ended before 5 s")
	}
	clk.Advance(time.Millisecond)
	if err := await(t, res); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate", err)
	}
}

func TestReleaseRetriesAcrossSessionsWithinFiveSecondsAbsolute(t *testing.T) {
	clk := newFakeClock()
	frames := make(chan frame, 8)
	conns := make(chan *lockdtest.Conn, 8)
	p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) {
		frames <- f
		conns <- c
	})
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2 })

	res := goRelease(c, "k", 5)
	first, firstConn := await(t, frames), await(t, conns)
	clk.Advance(3 * time.Second)
	firstConn.Close() // the answer is lost with the connection

	second := await(t, frames)
	await(t, conns)
	if second.conn == first.conn || second.token != 5 || second.key != "k" {
		t.Fatalf("retry %+v after %+v: want the same token on another session", second, first)
	}
	clk.Advance(2*time.Second - time.Millisecond)
	if !pending(res) {
		t.Fatal("ended early")
	}
	clk.Advance(time.Millisecond)
	if err := await(t, res); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("got %v, want ErrIndeterminate at 5 s from the call", err)
	}

	res = goRelease(c, "k", 6)
	await(t, frames)
	conn := await(t, conns)
	conn.Close()
	f := await(t, frames)
	if err := (await(t, conns)).Reply(codec.OpReleased, f.owner); err != nil {
		t.Fatal(err)
	}
	if err := await(t, res); err != nil {
		t.Fatalf("retried release answered RELEASED: %v", err)
	}
}

func TestCompensationQueueFullLeavesTheLockToItsLease(t *testing.T) {
	clk := newFakeClock()
	// Releases are never answered, so compensations pile up.
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.op == codec.OpAcquire {
			grant(p, c, f)
		}
	})
	c := newClient(t, p, clk, func(cfg *Config) { cfg.CompensationQueue = 1 })
	// A budget equal to the lease can never be met once the drift margin
	// is subtracted, so every grant is compensated.
	tight := AcquireOptions{Lease: time.Second, MinWorkBudget: Budget(time.Second)}
	for i := range compensationWorkers {
		if _, err := c.Acquire(context.Background(), "k", tight); !errors.Is(err, ErrIndeterminate) {
			t.Fatal(err)
		}
		eventually(t, "a worker is sending it", func() bool { return len(p.seen(codec.OpRelease)) == i+1 })
	}
	c.Acquire(context.Background(), "k", tight) // queued
	c.Acquire(context.Background(), "k", tight) // dropped
	st := c.Stats()
	if st.CompensationsQueued != compensationWorkers+1 || st.CompensationsDropped != 1 {
		t.Fatalf("stats %+v: want %d queued and 1 dropped", st, compensationWorkers+1)
	}
}

func TestOwnersAreDistinctAndNonZero(t *testing.T) {
	p := startPeer(t, grant)
	c := newClient(t, p, newFakeClock(), func(cfg *Config) { cfg.Sessions = 3 })
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			tk, err := c.Acquire(context.Background(), "k"+strings.Repeat("x", i), waitFor(0))
			if err == nil {
				c.Release(context.Background(), tk)
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for _, op := range []byte{codec.OpAcquire, codec.OpRelease} {
		for _, f := range p.seen(op) {
			if f.owner == 0 || seen[f.owner] {
				t.Fatalf("owner %d repeated or zero", f.owner)
			}
			seen[f.owner] = true
		}
	}
	if len(seen) != 128 {
		t.Fatalf("%d owners", len(seen))
	}
}

func TestOwnerCounterFailsClosedAtWrap(t *testing.T) {
	p := startPeer(t, grant)
	c := newClient(t, p, newFakeClock(), nil)
	c.lastOwner.Store(math.MaxUint64 - 1)
	if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.Acquire(context.Background(), "k2", waitFor(0)); err != ErrOwnerExhausted {
			t.Fatalf("got %v, want ErrOwnerExhausted", err)
		}
		if err := c.ReleaseToken(context.Background(), "k", 1); err != ErrOwnerExhausted {
			t.Fatalf("release: got %v, want ErrOwnerExhausted", err)
		}
	}
	sent := p.seen(codec.OpAcquire)
	if len(sent) != 1 || sent[0].owner != math.MaxUint64 {
		t.Fatalf("sent %+v", sent)
	}
}

func TestAnswerForUnknownOwnerClosesTheSession(t *testing.T) {
	p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) { c.Acquired(f.owner+1000, 1, 0) })
	c := newClient(t, p, newFakeClock(), nil)
	_, err := c.Acquire(context.Background(), "k", waitFor(0))
	if !errors.Is(err, ErrIndeterminate) || !errors.Is(err, ErrProtocol) {
		t.Fatalf("got %v, want ErrIndeterminate from a protocol error", err)
	}
	eventually(t, "the session is closed", func() bool { return p.connEnded(0) })
	if n := c.Stats().ProtocolErrors; n != 1 {
		t.Fatalf("%d protocol errors counted", n)
	}
}

func TestAnswerOfTheWrongKindClosesTheSession(t *testing.T) {
	p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) { c.Reply(codec.OpReleased, f.owner) })
	c := newClient(t, p, newFakeClock(), nil)
	if _, err := c.Acquire(context.Background(), "k", waitFor(5*time.Second)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("RELEASED for an acquire: %v", err)
	}
}

func TestWriterBatchesQueuedFramesIntoOneWrite(t *testing.T) {
	p := startPeer(t, grant)
	gate := newFirstWriteGate()
	var mu sync.Mutex
	var writes [][]byte
	c := newClient(t, p, newFakeClock(), func(cfg *Config) {
		cfg.Dialer = hookDialer(func(hc *hookedConn, b []byte) (int, error) {
			mu.Lock()
			writes = append(writes, append([]byte(nil), b...))
			mu.Unlock()
			return gate.write(hc, b)
		})
	})
	results := []<-chan result{goAcquire(c, "first", waitFor(0))}
	eventually(t, "the writer holds the first frame", gate.entered.Load)
	for i := range 10 {
		results = append(results, goAcquire(c, "k"+string(rune('a'+i)), waitFor(0)))
	}
	eventually(t, "ten requests are queued", func() bool { return queued(onlySession(c)) == 10 })
	close(gate.open)
	for _, ch := range results {
		if r := await(t, ch); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(writes) != 2 || countFrames(t, writes[1]) != 10 {
		t.Fatalf("%d writes; want the ten queued frames in the second", len(writes))
	}
}

func countFrames(t *testing.T, b []byte) int {
	var req codec.Request
	n := 0
	for len(b) > 0 {
		m, err := codec.DecodeRequest(b, &req)
		if err != nil {
			t.Fatal(err)
		}
		b = b[m:]
		n++
	}
	return n
}

func TestPipelinedAnswersAreMatchedByOwner(t *testing.T) {
	frames := make(chan frame, 8)
	var conn *lockdtest.Conn
	p := startPeer(t, func(_ *peer, c *lockdtest.Conn, f frame) {
		conn = c
		frames <- f
	})
	c := newClient(t, p, newFakeClock(), nil)
	keys := []string{"k1", "k2", "k3", "k4", "k5"}
	results := map[string]<-chan result{}
	for _, k := range keys {
		results[k] = goAcquire(c, k, waitFor(0))
	}
	var got []frame
	for range keys {
		got = append(got, await(t, frames))
	}
	for i := len(got) - 1; i >= 0; i-- {
		conn.Acquired(got[i].owner, uint64(100+int(got[i].key[1]-'0')), 0)
	}
	for i, k := range keys {
		r := await(t, results[k])
		if r.Err != nil || r.Ticket.Token() != uint64(101+i) || r.Ticket.Key() != k {
			t.Fatalf("%s: token %d, err %v", k, r.Ticket.Token(), r.Err)
		}
	}
}

func TestTicketValidityAndLost(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		if f.op == codec.OpAcquire {
			c.Acquired(f.owner, p.tokens.Add(1), 1500)
			return
		}
		c.Reply(codec.OpReleased, f.owner)
	})
	c := newClient(t, p, clk, nil)
	start := clk.Now()
	tk, err := c.Acquire(context.Background(), "k", AcquireOptions{Lease: 10 * time.Second, MinWorkBudget: Budget(0)})
	if err != nil {
		t.Fatal(err)
	}
	span := 11500 * time.Millisecond
	want := start.Add(span - driftMargin(span))
	if !tk.ValidUntil().Equal(want) || tk.Remaining() != want.Sub(start) {
		t.Fatalf("valid until %v (remaining %v), want %v", tk.ValidUntil(), tk.Remaining(), want)
	}
	lost := tk.Lost()
	if tk.Lost() != lost {
		t.Fatal("Lost returned another channel")
	}
	clk.Advance(tk.Remaining() - time.Millisecond)
	select {
	case <-lost:
		t.Fatal("lost before ValidUntil")
	default:
	}
	clk.Advance(time.Millisecond)
	eventually(t, "Lost is closed at ValidUntil", func() bool { return !pending(lost) })
	if tk.Remaining() != 0 {
		t.Fatal("remaining after expiry")
	}

	released, err := c.Acquire(context.Background(), "k2", waitFor(0))
	if err != nil {
		t.Fatal(err)
	}
	lost = released.Lost()
	if err := c.Release(context.Background(), released); err != nil {
		t.Fatal(err)
	}
	if pending(lost) {
		t.Fatal("Lost not closed by the release")
	}
}

func TestContextEndsTheCallLikeItsDeadline(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, nil)
	gate := newFirstWriteGate()
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Dialer = hookDialer(gate.write) })

	sentCtx, cancelSent := context.WithCancel(context.Background())
	sent := goAcquireCtx(sentCtx, c, "sent", waitFor(0))
	eventually(t, "the writer holds the first frame", gate.entered.Load)
	queuedCtx, cancelQueued := context.WithCancel(context.Background())
	stillQueued := goAcquireCtx(queuedCtx, c, "queued", waitFor(0))
	eventually(t, "the second request is queued", func() bool { return queued(onlySession(c)) == 1 })

	cancelQueued()
	if r := await(t, stillQueued); !errors.Is(r.Err, ErrTimeout) || !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("cancelled while queued: %v, want ErrTimeout", r.Err)
	}
	cancelSent()
	if r := await(t, sent); !errors.Is(r.Err, ErrIndeterminate) {
		t.Fatalf("cancelled after the writer took it: %v, want ErrIndeterminate", r.Err)
	}
	close(gate.open)
}

func TestLocalInFlightLimitIsBusyAndReleasesHaveAReserve(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, grant)
	gate := newFirstWriteGate()
	c := newClient(t, p, clk, func(cfg *Config) {
		cfg.MaxInFlight = 1
		cfg.Dialer = hookDialer(gate.write)
	})
	first := goAcquire(c, "first", waitFor(0))
	eventually(t, "the writer holds the first frame", gate.entered.Load)
	if _, err := c.Acquire(context.Background(), "second", waitFor(0)); !errors.Is(err, ErrBusy) {
		t.Fatalf("got %v, want ErrBusy", err)
	}
	rel := goRelease(c, "other", 3)
	eventually(t, "the release is queued", func() bool { return queued(onlySession(c)) == 1 })
	close(gate.open)
	if r := await(t, first); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := await(t, rel); err != nil {
		t.Fatal(err)
	}
}

func TestCloseEndsCallsInFlightAndRefusesNewOnes(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, nil)
	c, err := dial(context.Background(), Config{Addrs: []string{p.srv.Addr()}, Sessions: 1}, clk)
	if err != nil {
		t.Fatal(err)
	}
	res := goAcquire(c, "k", waitFor(30*time.Second))
	eventually(t, "the server has the frame", func() bool { return len(p.seen(codec.OpAcquire)) == 1 })
	closeClient(t, c, clk)
	if r := await(t, res); !errors.Is(r.Err, ErrIndeterminate) || errors.Is(r.Err, ErrClosed) {
		t.Fatalf("in flight at Close: %v, want ErrIndeterminate and not ErrClosed's promise that nothing was sent", r.Err)
	}
	if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
	if err := c.ReleaseToken(context.Background(), "k", 1); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
}

func TestLostSessionIsReplaced(t *testing.T) {
	p := startPeer(t, grant)
	c := newClient(t, p, newFakeClock(), nil)
	onlySession(c).fail(errors.New("test: lost"))
	eventually(t, "a new session", func() bool { return c.Stats().Sessions == 1 })
	if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Reconnects != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestHandshakeAuthenticatesBothWays(t *testing.T) {
	secret := []byte("s3cret")
	p := startAuthPeer(t, grant, map[string][]byte{"t1": secret})
	ok := Config{Addrs: []string{p.srv.Addr()}, Sessions: 1, Tenant: "t1", Secret: secret}
	c, err := Dial(context.Background(), ok)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != nil {
		t.Fatal(err)
	}
	refused := map[string]Config{
		"wrong secret":   {Tenant: "t1", Secret: []byte("guess")},
		"unknown tenant": {Tenant: "t2", Secret: secret},
		"no secret":      {},
	}
	for name, cfg := range refused {
		cfg.Addrs = []string{p.srv.Addr()}
		if _, err := Dial(context.Background(), cfg); !errors.Is(err, ErrAuth) {
			t.Errorf("%s: got %v, want ErrAuth", name, err)
		}
	}
}

func TestHandshakeRefusesAServerThatCannotProveTheSecret(t *testing.T) {
	impostors := map[string]lockdtest.Script{
		"wrong server MAC": func(c *lockdtest.Conn) {
			c.Greet(true)
			var req codec.Request
			if c.ReadRequest(&req) == nil {
				c.Welcome([codec.MACLen]byte{1, 2, 3})
			}
			c.ReadRequest(&req)
		},
		"auth off": func(c *lockdtest.Conn) {
			c.Greet(false)
			var req codec.Request
			c.ReadRequest(&req)
		},
	}
	for name, script := range impostors {
		t.Run(name, func(t *testing.T) {
			srv, err := lockdtest.Start(script)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			_, err = Dial(context.Background(), Config{Addrs: []string{srv.Addr()}, Tenant: "t1", Secret: []byte("s")})
			if !errors.Is(err, ErrAuth) {
				t.Fatalf("got %v, want ErrAuth", err)
			}
		})
	}
}

func TestHandshakeRefusesAServerThatBreaksTheProtocol(t *testing.T) {
	greetingV2 := codec.AppendGreeting(nil, 0, [codec.NonceLen]byte{}, "n")
	greetingV2[1] = 2
	violations := map[string]lockdtest.Script{
		"no GREETING first":     func(c *lockdtest.Conn) { c.Reply(codec.OpPong, 1) },
		"GREETING of version 2": func(c *lockdtest.Conn) { c.Write(greetingV2) },
		"undecodable GREETING":  func(c *lockdtest.Conn) { c.Write([]byte("Z\n")) },
		"HELLO answered with a grant": func(c *lockdtest.Conn) {
			c.Greet(false)
			var req codec.Request
			if c.ReadRequest(&req) == nil {
				c.Write(codec.AppendAcquired(nil, 1, 2, 3))
			}
			c.ReadRequest(&req)
		},
	}
	for name, script := range violations {
		t.Run(name, func(t *testing.T) {
			srv, err := lockdtest.Start(func(c *lockdtest.Conn) {
				script(c)
				var req codec.Request
				for c.ReadRequest(&req) == nil {
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			_, err = Dial(context.Background(), Config{Addrs: []string{srv.Addr()}, Tenant: "t1"})
			if !errors.Is(err, ErrProtocol) || errors.Is(err, ErrAuth) {
				t.Fatalf("got %v, want ErrProtocol", err)
			}
		})
	}
}

func TestHandshakeNamesTheTenantWhenAuthIsOff(t *testing.T) {
	tenants := make(chan string, 1)
	srv, err := lockdtest.Start(func(c *lockdtest.Conn) {
		c.Handshake(nil)
		c.Serve(func(c *lockdtest.Conn, req *codec.Request) {
			tenants <- c.Tenant
			c.Acquired(req.Owner, 1, 0)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := Dial(context.Background(), Config{Addrs: []string{srv.Addr()}, Sessions: 1, Tenant: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Acquire(context.Background(), "k", waitFor(0)); err != nil {
		t.Fatal(err)
	}
	if tenant := <-tenants; tenant != "team-a" {
		t.Fatalf("tenant %q", tenant)
	}
}

func TestDialSpreadsSessionsOverAddressesAndFailsOver(t *testing.T) {
	a, b := startPeer(t, grant), startPeer(t, grant)
	c := newClient(t, a, newFakeClock(), func(cfg *Config) {
		cfg.Addrs = []string{a.srv.Addr(), b.srv.Addr()}
		cfg.Sessions = 4
	})
	eventually(t, "two sessions on each address", func() bool {
		a.mu.Lock()
		b.mu.Lock()
		defer a.mu.Unlock()
		defer b.mu.Unlock()
		return a.conns == 2 && b.conns == 2
	})
	b.srv.Close()
	eventually(t, "every session moved to the live address", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.conns == 4 && c.Stats().Sessions == 4
	})

	dead := a.srv.Addr()
	a.srv.Close()
	if _, err := Dial(context.Background(), Config{Addrs: []string{dead}}); err == nil || errors.Is(err, ErrAuth) {
		t.Fatalf("dial of a dead address: %v", err)
	}
}

func TestDialRefusesAnUnusableConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no address":        {},
		"empty address":     {Addrs: []string{""}},
		"bad tenant":        {Addrs: []string{"127.0.0.1:1"}, Tenant: "a b"},
		"secret, no tenant": {Addrs: []string{"127.0.0.1:1"}, Secret: []byte("s")},
		"negative sessions": {Addrs: []string{"127.0.0.1:1"}, Sessions: -1},
		"silence too short": {Addrs: []string{"127.0.0.1:1"}, SilenceTimeout: minSilenceTimeout - 1},
		"negative silence":  {Addrs: []string{"127.0.0.1:1"}, SilenceTimeout: -time.Second},
	} {
		if _, err := Dial(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: got %v, want ErrConfig", name, err)
		}
	}
}
