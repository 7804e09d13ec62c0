package rulestest

import (
	"time"

	"github.com/lockd/lockd/engine"
)

// EngineWrapper is the single-mode rule core: a one-shard engine.Engine
// on a FakeClock, so that tokens come out as 1, 2, 3...
type EngineWrapper struct {
	clock    *engine.FakeClock
	e        *engine.Engine
	resolved []Resolution
}

// NewEngineWrapper returns a fresh one-shard engine with default limits.
func NewEngineWrapper() *EngineWrapper {
	clock := engine.NewFakeClock()
	return &EngineWrapper{clock: clock, e: engine.New(engine.Config{Shards: 1, Clock: clock})}
}

// Resolve records a queued acquire's answer (engine.Waiter).
func (w *EngineWrapper) Resolve(owner uint64, r engine.Result) {
	w.resolved = append(w.resolved, Resolution{Owner: owner, Result: r})
}

func (w *EngineWrapper) Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result {
	r, _ := w.e.Acquire(w.e.Namespace(tenant), []byte(key), owner, lease, wait, w)
	return r
}

func (w *EngineWrapper) Release(tenant, key string, token uint64) engine.Result {
	return w.e.Release(w.e.Namespace(tenant), []byte(key), token)
}

func (w *EngineWrapper) Keep(tenant, key string, token uint64, lease time.Duration) engine.Result {
	return w.e.Keep(w.e.Namespace(tenant), []byte(key), token, lease)
}

func (w *EngineWrapper) Advance(d time.Duration) { w.clock.Advance(d) }

func (w *EngineWrapper) Tick() { w.e.Tick() }

func (w *EngineWrapper) Resolutions() []Resolution {
	r := w.resolved
	w.resolved = nil
	return r
}
