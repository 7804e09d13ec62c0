package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Backend is a lock table a server can serve: the Engine itself in single
// mode (NewLocal), Raft-replicated groups in cluster mode. It covers
// exactly what a connection needs, and lives here so that neither the
// server nor the cluster has to import the other. Every method may be
// called from any goroutine concurrently.
type Backend interface {
	// Namespace interns a tenant.
	Namespace(tenant string) Namespace
	// Acquire is Engine.Acquire of the request tagged r (SPEC §6a; 0
	// without a session): Granted, TimedOut, Busy, TokenExhausted or
	// ShuttingDown at once, or Queued with a Handle for Cancel and
	// exactly one later w.Resolve(owner, …) unless cancelled. A Queued
	// answer may also mean "pending in Raft"; its resolution may then be
	// Unavailable. key is only borrowed during the call.
	Acquire(ns Namespace, key []byte, owner uint64, r Requester, lease, wait time.Duration, w Waiter) (Result, Handle)
	// Release gives back the lock on key if token is current. A
	// synchronous backend answers Released or NotHeld at once. An
	// asynchronous one (AsyncAnswers) answers Queued and later calls
	// w.Resolve(owner, r) exactly once with Released, NotHeld, Unavailable
	// or ShuttingDown; a nil w asks for no answer at all. It passes no
	// admission gate.
	Release(ns Namespace, key []byte, owner, token uint64, w Waiter) Result
	// Keep renews the lease on key to lease from now if token is its
	// current token and the lease has not expired (SPEC §5 KEEP): Renewed
	// with that same token, else NotHeld. Like Release it passes no
	// admission gate, and an asynchronous backend answers Queued and later
	// calls w.Resolve(owner, r) once with Renewed, NotHeld, Unavailable or
	// ShuttingDown. lease is 1..3600 s.
	Keep(ns Namespace, key []byte, owner, token uint64, lease time.Duration, w Waiter) Result
	// Abandon is SPEC §6a ABANDON of the request tagged r (never 0) on
	// key: Released when its grant was released, NotHeld when its waiter
	// was dropped or it had nothing; either way its acquire of key is
	// refused from then on, for TombstoneLife. Like Release it passes no
	// admission gate, and an asynchronous backend answers Queued and later
	// calls w.Resolve(owner, r) once with Released, NotHeld, Unavailable
	// or ShuttingDown. Called only when ServesAbandon.
	Abandon(ns Namespace, key []byte, owner uint64, r Requester, w Waiter) Result
	// ServesAbandon reports whether the backend serves SPEC §6a (the
	// server then sets GREETING flag bit1 and accepts SESSION and
	// ABANDON).
	ServesAbandon() bool
	// AsyncAnswers reports whether Release, Keep and Abandon answer
	// through the Waiter.
	AsyncAnswers() bool
	// ReleaseUndelivered gives back the grant of token to the queued
	// acquire h (what Acquire returned) when its waiter can no longer
	// take it (its connection closed first), instead of leaving the lock
	// to its lease. It never blocks and may be called from inside
	// Waiter.Resolve; the backend releases the token if it is still
	// current.
	ReleaseUndelivered(h Handle, token uint64)
	// Cancel drops a queued acquire whose connection closed; the Handle is
	// what Acquire returned. Safe after resolution and with a nil Handle.
	Cancel(h Handle)
	// Flush ends one batch of requests: a replicated backend proposes what
	// the batch queued (group commit). Called once per connection wake-up,
	// after its frames were handled.
	Flush()
	Stats() Stats
	// Shutdown resolves every queued waiter with ShuttingDown; later
	// acquires answer ShuttingDown.
	Shutdown()
	// Run drives the backend's timers until ctx is done.
	Run(ctx context.Context)
}

// Handle identifies a queued acquire for Backend.Cancel. The local
// backend's handle is the engine's *Wait (a pointer, so storing it
// allocates nothing).
type Handle any

// UndeliveredQueue bounds the undelivered grants the local backend has
// yet to release; past it a grant is left to its lease.
const UndeliveredQueue = 4096

// Local is single mode's Backend: the Engine, called synchronously.
// Undelivered grants are released by Run's goroutine, since
// ReleaseUndelivered may run under a shard lock.
type Local struct {
	e           *Engine
	undelivered chan undeliveredGrant
	released    atomic.Uint64
	dropped     atomic.Uint64
}

type undeliveredGrant struct {
	w     *Wait
	token uint64
}

var _ Backend = (*Local)(nil)

// NewLocal returns the Backend of e.
func NewLocal(e *Engine) *Local {
	return &Local{e: e, undelivered: make(chan undeliveredGrant, UndeliveredQueue)}
}

func (b *Local) Namespace(tenant string) Namespace { return b.e.Namespace(tenant) }

func (b *Local) Acquire(ns Namespace, key []byte, owner uint64, r Requester, lease, wait time.Duration, w Waiter) (Result, Handle) {
	res, wt := b.e.Acquire(ns, key, owner, r, lease, wait, w)
	if wt == nil {
		return res, nil
	}
	return res, wt
}

func (b *Local) Release(ns Namespace, key []byte, _, token uint64, _ Waiter) Result {
	return b.e.Release(ns, key, token)
}

func (b *Local) Keep(ns Namespace, key []byte, _, token uint64, lease time.Duration, _ Waiter) Result {
	return b.e.Keep(ns, key, token, lease)
}

func (b *Local) Abandon(ns Namespace, key []byte, _ uint64, r Requester, _ Waiter) Result {
	return b.e.Abandon(ns, key, r)
}

func (*Local) ServesAbandon() bool { return true }

func (*Local) AsyncAnswers() bool { return false }

// ReleaseUndelivered queues the release; the queue is never closed, so a
// grant resolved after Run has returned is dropped, not a panic.
func (b *Local) ReleaseUndelivered(h Handle, token uint64) {
	w, ok := h.(*Wait)
	if !ok {
		return
	}
	select {
	case b.undelivered <- undeliveredGrant{w: w, token: token}:
		b.released.Add(1)
	default:
		b.dropped.Add(1)
	}
}

func (b *Local) Cancel(h Handle) {
	if w, ok := h.(*Wait); ok {
		b.e.Cancel(w)
	}
}

func (*Local) Flush() {}

func (b *Local) Stats() Stats {
	st := b.e.Stats()
	st.UndeliveredQueued, st.UndeliveredDropped = b.released.Load(), b.dropped.Load()
	return st
}

func (b *Local) Shutdown() { b.e.Shutdown() }

// Run drives the engine's timers and releases undelivered grants until
// ctx is done, then releases those still queued.
func (b *Local) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); b.e.Run(ctx) }()
	defer wg.Wait()
	for {
		select {
		case g := <-b.undelivered:
			b.e.ReleaseGranted(g.w, g.token)
		case <-ctx.Done():
			for {
				select {
				case g := <-b.undelivered:
					b.e.ReleaseGranted(g.w, g.token)
				default:
					return
				}
			}
		}
	}
}
