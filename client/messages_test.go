package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/client/lockdtest"
	"github.com/lockd/lockd/codec"
)

// saysPrefixOnce fails unless msg starts with "lockd client: " and says it
// nowhere else.
func saysPrefixOnce(t *testing.T, msg string) {
	t.Helper()
	if !strings.HasPrefix(msg, errPrefix) || strings.Count(msg, errPrefix) != 1 {
		t.Errorf("%q: want %q once, at the start", msg, errPrefix)
	}
}

// A waiting acquire that runs out on a held key is ErrIndeterminate and
// ErrWaitElapsed, and its message tells the caller what is true: it does
// not hold the lock, and the client gives back whatever the server did —
// an ABANDON is queued, or, on a server without SPEC §6a, a last-instant
// grant is left to its lease. It never says the lock may be held.
func TestWaitThatRunsOutSaysTheCallerDoesNotHoldTheLockAndWhatIsGivenBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flags   uint8
		fate    string
		abandon int
	}{
		{"server with abandon", codec.GreetingAbandon, "an ABANDON is queued to give back whatever the server did", 1},
		{"server without abandon", 0, "this server does not take ABANDON, so a grant it may have made is left to its lease", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			p := startFlagsPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
				if f.op == codec.OpAbandon {
					c.Reply(codec.OpNotHeld, f.owner)
				}
			}, nil, tc.flags)
			c := newClient(t, p, clk, nil)

			res := goAcquire(c, "busy-key", waitFor(2*time.Second))
			eventually(t, "the server has the waiting acquire", func() bool { return len(p.seen(codec.OpAcquire)) == 1 })
			clk.Advance(2 * time.Second)
			err := await(t, res).Err
			if !errors.Is(err, ErrIndeterminate) || !errors.Is(err, ErrWaitElapsed) {
				t.Fatalf("got %v, want ErrIndeterminate and ErrWaitElapsed", err)
			}
			msg := err.Error()
			saysPrefixOnce(t, msg)
			for _, want := range []string{"the wait ran out", `acquire of "busy-key"`, "this call does not hold the lock", tc.fate} {
				if !strings.Contains(msg, want) {
					t.Errorf("%q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, "may be held") {
				t.Errorf("%q says the lock may be held", msg)
			}
			if tc.abandon == 1 {
				eventually(t, "the ABANDON is answered", func() bool { return c.Stats().AbandonsNotHeld == 1 })
			}
			if n := len(p.seen(codec.OpAbandon)); n != tc.abandon {
				t.Fatalf("%d ABANDONs, want %d", n, tc.abandon)
			}
		})
	}
}

// Errors that carry one or several of the client's errors inside their
// context — a protocol violation that cut an acquire, a refused release,
// a context's end — say "lockd client:" once, at the start.
func TestErrorMessagesSayLockdClientOnce(t *testing.T) {
	clk := newFakeClock()
	p := startPeer(t, func(p *peer, c *lockdtest.Conn, f frame) {
		switch {
		case f.op == codec.OpRelease:
			c.Error(f.owner, codec.BadKey)
		case f.key == "violation":
			c.Reply(codec.OpReleased, f.owner) // no answer an ACQUIRE can get
		}
	})
	c := newClient(t, p, clk, func(cfg *Config) { cfg.Sessions = 2 })

	_, err := c.Acquire(context.Background(), "violation", waitFor(0))
	if !errors.Is(err, ErrIndeterminate) || !strings.Contains(err.Error(), "protocol violation") {
		t.Fatalf("got %v, want ErrIndeterminate naming the protocol violation", err)
	}
	saysPrefixOnce(t, err.Error())

	err = c.ReleaseToken(context.Background(), "k", 7)
	if !errors.Is(err, ErrBadKey) || !strings.Contains(err.Error(), `release of "k" token 7`) {
		t.Fatalf("got %v, want ErrBadKey naming the release", err)
	}
	saysPrefixOnce(t, err.Error())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.Acquire(ctx, "k", waitFor(time.Second))
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want ErrTimeout and context.Canceled", err)
	}
	saysPrefixOnce(t, err.Error())
}

// A refused dial names the address once: the net package's error says
// "dial tcp ADDR" already.
func TestDialErrorNamesTheAddressOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = Dial(context.Background(), Config{Addrs: []string{addr}})
	if err == nil {
		t.Fatal("Dial to a closed port succeeded")
	}
	msg := err.Error()
	if strings.Count(msg, addr) != 1 || strings.Count(msg, "dial") != 1 {
		t.Fatalf("%q: want the address and \"dial\" once", msg)
	}
}
