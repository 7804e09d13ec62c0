package server

import (
	"context"
	"time"

	"github.com/lockd/lockd/engine"
)

// Backend is the lock table behind the server: the in-process engine in
// single mode, Raft-replicated groups in cluster mode (package cluster).
// It covers exactly what a session needs. Every method may be called from
// any event loop concurrently.
type Backend interface {
	// Namespace interns a tenant.
	Namespace(tenant string) engine.Namespace
	// Acquire is engine.Engine.Acquire: Granted, TimedOut, Busy,
	// TokenExhausted or ShuttingDown at once, or Queued with a Handle for
	// Cancel and exactly one later w.Resolve(owner, …) unless cancelled.
	// A Queued answer may also mean "pending in Raft"; its resolution may
	// then be Unavailable. key is only borrowed during the call.
	Acquire(ns engine.Namespace, key []byte, owner uint64, lease, wait time.Duration, w engine.Waiter) (engine.Result, Handle)
	// Release gives back the lock on key if token is current. A
	// synchronous backend answers Released or NotHeld at once. An
	// asynchronous one (AsyncRelease) answers Queued and later calls
	// w.Resolve(owner, r) exactly once with Released, NotHeld, Unavailable
	// or ShuttingDown; a nil w asks for no answer at all (the server's own
	// release of an orphaned grant). It passes no admission gate.
	Release(ns engine.Namespace, key []byte, owner, token uint64, w engine.Waiter) engine.Result
	// Keep renews the lease on key to lease from now if token is its
	// current token and the lease has not expired (SPEC §5 KEEP): Renewed
	// with that same token, else NotHeld. Like Release it passes no
	// admission gate, and an asynchronous backend answers Queued and later
	// calls w.Resolve(owner, r) once with Renewed, NotHeld, Unavailable or
	// ShuttingDown. lease is 1..3600 s.
	Keep(ns engine.Namespace, key []byte, owner, token uint64, lease time.Duration, w engine.Waiter) engine.Result
	// AsyncRelease reports whether Release and Keep answer through the
	// Waiter.
	AsyncRelease() bool
	// Cancel drops a queued acquire whose connection closed; the Handle is
	// what Acquire returned. Safe after resolution and with a nil Handle.
	Cancel(h Handle)
	// Flush ends one event-loop batch of requests: a replicated backend
	// proposes what the batch queued (group commit). Called once per
	// connection wake-up, after its frames were handled.
	Flush()
	Stats() engine.Stats
	// Shutdown resolves every queued waiter with ShuttingDown; later
	// acquires answer ShuttingDown.
	Shutdown()
	// Run drives the backend's timers until ctx is done.
	Run(ctx context.Context)
}

// Handle identifies a queued acquire for Backend.Cancel. The single-mode
// backend's handle is the engine's *engine.Wait (a pointer, so storing it
// allocates nothing).
type Handle any

// engineBackend is single mode: the engine, called synchronously.
type engineBackend struct{ e *engine.Engine }

func (b engineBackend) Namespace(tenant string) engine.Namespace { return b.e.Namespace(tenant) }

func (b engineBackend) Acquire(ns engine.Namespace, key []byte, owner uint64, lease, wait time.Duration, w engine.Waiter) (engine.Result, Handle) {
	r, wt := b.e.Acquire(ns, key, owner, lease, wait, w)
	if wt == nil {
		return r, nil
	}
	return r, wt
}

func (b engineBackend) Release(ns engine.Namespace, key []byte, _, token uint64, _ engine.Waiter) engine.Result {
	return b.e.Release(ns, key, token)
}

func (b engineBackend) Keep(ns engine.Namespace, key []byte, _, token uint64, lease time.Duration, _ engine.Waiter) engine.Result {
	return b.e.Keep(ns, key, token, lease)
}

func (engineBackend) AsyncRelease() bool { return false }

func (b engineBackend) Cancel(h Handle) {
	if w, ok := h.(*engine.Wait); ok {
		b.e.Cancel(w)
	}
}

func (engineBackend) Flush() {}

func (b engineBackend) Stats() engine.Stats { return b.e.Stats() }

func (b engineBackend) Shutdown() { b.e.Shutdown() }

func (b engineBackend) Run(ctx context.Context) { b.e.Run(ctx) }
