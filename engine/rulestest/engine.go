package rulestest

import (
	"time"

	"github.com/lockd/lockd/engine"
)

// EngineWrapper is the single-mode rule core: an engine.Engine on a
// FakeClock. It is Instrumented and an AbandonWrapper.
type EngineWrapper struct {
	clock *engine.FakeClock
	e     *engine.Engine
	// waits are the handles of every acquire that queued, kept after it
	// was answered so that a late Cancel reaches the engine.
	waits    map[uint64]*engine.Wait
	resolved []Resolution
}

// NewEngineWrapper returns a fresh engine with cfg on a new FakeClock
// (cfg.Clock is ignored). One shard numbers tokens 1, 2, 3... across keys.
func NewEngineWrapper(cfg engine.Config) *EngineWrapper {
	clock := engine.NewFakeClock()
	cfg.Clock = clock
	return &EngineWrapper{clock: clock, e: engine.New(cfg), waits: make(map[uint64]*engine.Wait)}
}

// Resolve records a queued acquire's answer (engine.Waiter).
func (w *EngineWrapper) Resolve(owner uint64, r engine.Result) {
	w.resolved = append(w.resolved, Resolution{Owner: owner, Result: r})
}

func (w *EngineWrapper) Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result {
	return w.AcquireFor(tenant, key, owner, 0, lease, wait)
}

// AcquireFor is Acquire of the request tagged r (AbandonWrapper).
func (w *EngineWrapper) AcquireFor(tenant, key string, owner uint64, r engine.Requester, lease, wait time.Duration) engine.Result {
	res, h := w.e.Acquire(w.e.Namespace(tenant), []byte(key), owner, r, lease, wait, w)
	if h != nil {
		w.waits[owner] = h
	}
	return res
}

// Abandon is engine.Abandon (AbandonWrapper).
func (w *EngineWrapper) Abandon(tenant, key string, r engine.Requester) engine.Result {
	return w.e.Abandon(w.e.Namespace(tenant), []byte(key), r)
}

func (w *EngineWrapper) Release(tenant, key string, token uint64) engine.Result {
	return w.e.Release(w.e.Namespace(tenant), []byte(key), token)
}

func (w *EngineWrapper) Keep(tenant, key string, token uint64, lease time.Duration) engine.Result {
	return w.e.Keep(w.e.Namespace(tenant), []byte(key), token, lease)
}

// Cancel is engine.Cancel on owner's handle; nil for an owner that never
// queued, which Cancel answers false.
func (w *EngineWrapper) Cancel(owner uint64) bool { return w.e.Cancel(w.waits[owner]) }

func (w *EngineWrapper) Advance(d time.Duration) { w.clock.Advance(d) }

func (w *EngineWrapper) Tick() { w.e.Tick() }

func (w *EngineWrapper) Resolutions() []Resolution {
	r := w.resolved
	w.resolved = nil
	return r
}

func (w *EngineWrapper) Stats() engine.Stats { return w.e.Stats() }

func (w *EngineWrapper) Sweep() { w.e.Sweep() }

func (w *EngineWrapper) Shutdown() { w.e.Shutdown() }
