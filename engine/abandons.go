package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// abandonBook is the Engine's side of SPEC §6a: the tombstones of every
// tenant, under a lock of their own, and the counters of what abandons
// did. An acquire reads live, one atomic load, and takes the lock only
// when some tombstone exists; Abandon takes it after its shard lock (the
// only order in which both are held).
type abandonBook struct {
	live atomic.Int64 // tombs.Len()

	mu      sync.Mutex
	tombs   *Tombstones[Namespace]
	evicted uint64

	refused, released, dropped, nothing atomic.Uint64
}

func (b *abandonBook) any() bool { return b.live.Load() != 0 }

func (b *abandonBook) refuses(ns Namespace, r Requester, key []byte, now time.Duration) bool {
	b.mu.Lock()
	refused := b.tombs.Refuses(ns, r, key, now)
	b.mu.Unlock()
	if refused {
		b.refused.Add(1)
	}
	return refused
}

func (b *abandonBook) lay(ns Namespace, r Requester, key []byte, now time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.evicted += uint64(b.tombs.Lay(ns, r, key, now))
	b.live.Store(int64(b.tombs.Len()))
}

// expire drops the tombstones expired at now (the Sweep).
func (b *abandonBook) expire(now time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tombs.Expire(now)
	b.live.Store(int64(b.tombs.Len()))
}

func (b *abandonBook) stats(st *Stats) {
	b.mu.Lock()
	st.Tombstones, st.TombstonesEvicted = b.tombs.Len(), b.evicted
	b.mu.Unlock()
	st.TombstoneRefusals = b.refused.Load()
	st.AbandonsReleased, st.AbandonsDroppedWaiter, st.AbandonsNothing = b.released.Load(), b.dropped.Load(), b.nothing.Load()
}

// Abandon is SPEC §6a ABANDON of the request tagged r on key in ns: when
// the key's current grant was made for r it is released as by Release
// with its token, the head waiter granted (Released); when r waits on the
// key its waiter is dropped and resolved TimedOut (NotHeld); otherwise
// nothing changes (NotHeld). Either way a tombstone refuses r's acquire of
// key for TombstoneLife. It passes no admission gate. r 0 names no request
// and is NotHeld.
func (e *Engine) Abandon(ns Namespace, key []byte, r Requester) Result {
	if r == 0 {
		return Result{Outcome: NotHeld}
	}
	s, h := e.locate(ns, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := e.clock.Now()
	out := e.abandonLocked(s, h, ns, key, r, now)
	e.abandons.lay(ns, r, key, now)
	return Result{Outcome: out}
}

func (e *Engine) abandonLocked(s *shard, h uint64, ns Namespace, key []byte, r Requester, now time.Duration) Outcome {
	ent := s.table.get(h, ns, key)
	if ent != nil {
		ent = e.settle(s, h, ent, now)
	}
	if ent == nil {
		e.abandons.nothing.Add(1)
		return NotHeld
	}
	// Every queued copy of the request goes first (a client re-sending
	// an owner may have queued it again), so that releasing its grant
	// cannot hand the lock to the same abandoned request.
	dropped := false
	for w := ent.head; w != nil; {
		next := w.next
		if w.requester == r {
			e.resolve(w, e.unqueue(s, w), Result{Outcome: TimedOut})
			dropped = true
		}
		w = next
	}
	if AbandonGrant(ent.lease, ent.holder, r, now) == Released {
		e.releaseLocked(s, h, ent, ent.lease.Token, now)
		e.abandons.released.Add(1)
		return Released
	}
	if dropped {
		e.abandons.dropped.Add(1)
		return NotHeld
	}
	e.abandons.nothing.Add(1)
	return NotHeld
}
