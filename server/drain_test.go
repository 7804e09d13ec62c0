package server

import (
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

// heldReleases is a Backend whose releases are answered later, when the
// test says, like a cluster node's releases on their way through Raft.
type heldReleases struct {
	grantingBackend
	held chan engine.Waiter
}

func (*heldReleases) AsyncAnswers() bool { return true }

func (h *heldReleases) Release(_ engine.Namespace, _ []byte, _, _ uint64, w engine.Waiter) engine.Result {
	h.held <- w
	return engine.Result{Outcome: engine.Queued}
}

// A draining server answers every request in flight on a connection
// before it closes it: a request that arrives during the drain is
// answered shutting_down, and the connection stays open until the release
// sent before it has its own answer (SPEC §9: shutting_down closes the
// connection; no client of a draining node is left without an answer).
func TestDrainAnswersWhatIsInFlightBeforeClosing(t *testing.T) {
	backend := &heldReleases{held: make(chan engine.Waiter, 1)}
	s := startServer(t, func(cfg *Config) { cfg.Backend = backend; cfg.DrainGrace = time.Second })
	c := dial(t, s)
	c.acquire(1, 30, 0, "k")
	token := c.expect(codec.OpAcquired, 1).Token
	c.send(codec.AppendRelease(nil, 2, token, "k"))
	release := <-backend.held

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	waitDraining(t, s)
	c.send(codec.AppendPing(nil, 3))
	c.expectError(3, codec.ShuttingDown)
	// Still open while the release is in flight: the next request is
	// answered too.
	c.send(codec.AppendPing(nil, 4))
	c.expectError(4, codec.ShuttingDown)

	release.Resolve(2, engine.Result{Outcome: engine.Released})
	c.expect(codec.OpReleased, 2)
	c.expectClosed()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// waitDraining waits until Close has begun the drain.
func waitDraining(t *testing.T, s *testServer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !s.draining.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not begin")
		}
		time.Sleep(time.Millisecond)
	}
}
