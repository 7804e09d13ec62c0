package server

import (
	"net"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

// gatedBackend is the single-mode engine with a gate around the acquire
// of one owner, so a test can hold the event loop at an exact point of a
// race window instead of sleeping into it. Owners are unique per test.
type gatedBackend struct {
	*engine.Local
	gateOwner uint64
	before    bool          // hold before the engine sees the acquire, else after
	entered   chan struct{} // closed when the loop reaches the gate
	proceed   chan struct{} // closed by the test to let it go on
}

func newGatedBackend(owner uint64, before bool) *gatedBackend {
	return &gatedBackend{
		Local:     engine.NewLocal(engine.New(engine.Config{Clock: engine.NewFakeClock()})),
		gateOwner: owner, before: before,
		entered: make(chan struct{}), proceed: make(chan struct{}),
	}
}

func (b *gatedBackend) Acquire(ns engine.Namespace, key []byte, owner uint64, req engine.Requester, lease, wait time.Duration, w engine.Waiter) (engine.Result, engine.Handle) {
	gated := owner == b.gateOwner
	if gated && b.before {
		close(b.entered)
		<-b.proceed
	}
	r, h := b.Local.Acquire(ns, key, owner, req, lease, wait, w)
	if gated && !b.before {
		close(b.entered)
		<-b.proceed
	}
	return r, h
}

func waitGate(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(ioTimeout):
		t.Fatal("the event loop never reached the gate")
	}
}

// A write that fails because the peer reset makes gnet close the
// connection from inside Write. The rest of that read must not be acted
// on: no lock granted for a dead connection, nothing written to its fd
// (which the kernel may already have handed to another client).
func TestNothingHandledAfterAWriteFails(t *testing.T) {
	be := newGatedBackend(1, true)
	s := startServer(t, func(c *Config) { c.Backend = be; c.Loops = 1 })
	c := dial(t, s)
	var burst []byte
	burst = codec.AppendAcquire(burst, 1, 60, 0, "first")
	for i := range ResponseBatch - 1 { // the 64th answer flushes mid-read
		burst = codec.AppendPing(burst, uint64(1000+i))
	}
	burst = codec.AppendAcquire(burst, 2, 60, 0, "after-close-1")
	burst = codec.AppendAcquire(burst, 3, 60, 0, "after-close-2")
	c.send(burst)
	waitGate(t, be.entered)
	_ = c.nc.(*net.TCPConn).SetLinger(0)
	c.nc.Close() // RST: the server's next write fails
	close(be.proceed)

	waitFor(t, func() bool { return s.conns.Load() == 0 })
	if issued := be.Stats().TokensIssued; issued != 1 {
		t.Fatalf("%d tokens issued: locks were granted for a connection already closed", issued)
	}
}

// A grant that resolves a queued acquire before Acquire has returned to
// the session must still carry its key, so that when the connection closes
// before the grant is written, the server's own release frees that key.
func TestGrantRacingAcquireReturnIsReleasedOnClose(t *testing.T) {
	be := newGatedBackend(7, false)
	s := startServer(t, func(c *Config) { c.Backend = be; c.Loops = 2 })
	holder := dial(t, s)
	token := holder.mustAcquire(1, "K")
	waiter := dial(t, s)
	waiter.send(append(codec.AppendAcquire(nil, 7, 3600, 30, "K"), "Z\n"...))
	waitGate(t, be.entered) // queued in the engine, not yet known to the session
	holder.send(codec.AppendRelease(nil, 2, token, "K"))
	holder.expect(codec.OpReleased, 2) // handed to owner 7 meanwhile
	close(be.proceed)
	waiter.expectError(0, codec.BadRequest)
	waiter.expectClosed()

	other := dial(t, s)
	waitFor(t, func() bool {
		other.acquire(9, 10, 0, "K")
		return other.recv().Op == codec.OpAcquired
	})
}

func TestOpenTenantsAreBounded(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxOpenTenants = 2 })
	for _, tenant := range []string{"a", "b", "a", "default"} {
		if r := dial(t, s).hello(tenant, nil); r.Op != codec.OpWelcome {
			t.Fatalf("tenant %q: %q %v", tenant, r.Op, r.Reason)
		}
	}
	c := dial(t, s)
	if r := c.hello("c", nil); r.Op != codec.OpError || r.Reason != codec.AuthFailed {
		t.Fatalf("a third open tenant: %q %v, want E auth_failed", r.Op, r.Reason)
	}
	c.expectClosed()
}
