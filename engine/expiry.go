package engine

import (
	"context"
	"math"
	"slices"
	"time"
)

// SweepInterval is how often Run calls Sweep (SPEC §8, a constant).
const SweepInterval = 5 * time.Second

// noDeadline is what Tick returns when nothing is scheduled.
const noDeadline = time.Duration(math.MaxInt64)

// timer is an item of a shard's DeadlineHeap: the end of a waiter's wait
// (wait set), or the end of the lease of entry's token, due at that end.
// It is checked when it comes due and dropped if it no longer applies.
type timer struct {
	wait  *Wait
	entry *entry
	token uint64
}

// keepTimer is live for compaction, which may drop a lease timer while its key
// momentarily has no waiters: such a lease is disarmed, so that the key's
// next waiter arms it again instead of waiting past the lease's end.
func keepTimer(d Deadline[timer]) bool {
	t := d.Item
	if t.live(d.At) {
		return true
	}
	if t.wait == nil && t.current(d.At) {
		t.entry.leaseArmed = false
	}
	return false
}

// current reports whether a lease timer due at is for the lease in force:
// the same token and, since Keep moves a lease's end, the same end.
func (t timer) current(at time.Duration) bool {
	return t.entry.lease == Lease{Token: t.token, End: at}
}

func (t timer) live(at time.Duration) bool {
	if t.wait != nil {
		return t.wait.queued()
	}
	// Without waiters the lease expires lazily instead.
	return t.current(at) && t.entry.head != nil
}

// minCompact is the heap size below which stale timers are not worth
// collecting before they come due.
const minCompact = 64

// schedule adds t to the shard's heap and wakes Run if t is earlier than
// what it sleeps for.
func (e *Engine) schedule(s *shard, at time.Duration, t timer) {
	// Cancelled and early-granted waiters, and leases renewed while waiters
	// queue, leave stale timers that would otherwise pile up for up to a
	// full wait or lease. Live timers number at most
	// 2*waiting (one per waiter, one per key with waiters), so past 4*waiting
	// at least half are stale and one pass over them pays for itself.
	if len(s.timers) >= minCompact && len(s.timers) > 4*s.waiting {
		s.timers.Retain(keepTimer)
	}
	s.timers.Push(at, t)
	if int64(at) < e.nextTick.Load() {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// armLease schedules the lease end of ent's current token if someone waits
// for it and it is not scheduled yet.
func (e *Engine) armLease(s *shard, ent *entry) {
	if ent.head == nil || ent.leaseArmed {
		return
	}
	ent.leaseArmed = true
	e.schedule(s, ent.lease.End, timer{entry: ent, token: ent.lease.Token})
}

// Tick processes everything due at Clock.Now(): lease ends of keys with
// waiters (the lock goes to the head waiter) and ends of waits (TimedOut). It
// returns the delay until the next scheduled event, 0 if one is already due,
// or math.MaxInt64 when nothing is scheduled.
func (e *Engine) Tick() time.Duration { return e.delayUntil(e.tick()) }

func (e *Engine) delayUntil(at time.Duration) time.Duration {
	if at == noDeadline {
		return noDeadline
	}
	return max(at-e.clock.Now(), 0)
}

// tick is Tick returning the Clock instant of the next event.
func (e *Engine) tick() time.Duration {
	next := noDeadline
	for i := range e.shards {
		s := &e.shards[i]
		s.mu.Lock()
		now := e.clock.Now()
		for at, ok := s.timers.Next(); ok && at <= now; at, ok = s.timers.Next() {
			t := s.timers.Pop().Item
			if !t.live(at) {
				continue
			}
			if t.wait != nil {
				e.resolve(t.wait, e.unqueue(s, t.wait), Result{Outcome: TimedOut})
			} else {
				s.expired(t.entry)
				e.handoff(s, e.hash(t.entry.ns, t.entry.key()), t.entry, now)
			}
		}
		if at, ok := s.timers.Next(); ok {
			next = min(next, at)
		}
		s.mu.Unlock()
	}
	return next
}

// Sweep reclaims expired keys nobody waits for (SPEC §5: the single
// expiry sweep) and expired tombstones (SPEC §6a), drops the free entries nobody needed since the previous
// Sweep, and shrinks tables a flood left mostly empty. Keys with waiters
// are left to Tick.
func (e *Engine) Sweep() {
	for i := range e.shards {
		s := &e.shards[i]
		s.mu.Lock()
		now := e.clock.Now()
		s.table.sweep(func(ent *entry) bool {
			if ent.head != nil || !ent.lease.Lapsed(now) {
				return false
			}
			s.expired(ent)
			e.leaveKey(ent.ns)
			return true
		})
		s.table.shrink()
		s.timers.Shrink()
		s.free = slices.Delete(s.free, 0, s.freeLow)
		s.freeLow = len(s.free)
		s.mu.Unlock()
	}
	e.abandons.expire(e.clock.Now())
}

// Run drives Tick in real time, waking early when an earlier deadline is
// scheduled, and calls Sweep every SweepInterval, until ctx is done. With
// Config.HighWater it also keeps tokens reserved ahead of the grants, on a
// goroutine of its own so that a slow disk never delays a hand-off. Tests
// on a FakeClock call Tick, Sweep and ReserveTokens themselves instead.
func (e *Engine) Run(ctx context.Context) {
	if e.tokens.hw != nil {
		reserving := make(chan struct{})
		go func() { defer close(reserving); e.reserveAhead(ctx) }()
		defer func() { <-reserving }()
	}
	sweep := time.NewTicker(SweepInterval)
	defer sweep.Stop()
	timer := time.NewTimer(noDeadline)
	defer timer.Stop()
	for {
		// While ticking, any new deadline may have been missed by the scan:
		// have schedule signal all of them.
		e.nextTick.Store(int64(noDeadline))
		next := e.tick()
		e.nextTick.Store(int64(next))
		timer.Reset(e.delayUntil(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.wake:
		case <-sweep.C:
			e.Sweep()
		}
	}
}

// Shutdown resolves every queued waiter with ShuttingDown; later Acquires
// answer ShuttingDown. Held locks stay releasable.
func (e *Engine) Shutdown() {
	e.shuttingDown.Store(true)
	for i := range e.shards {
		s := &e.shards[i]
		s.mu.Lock()
		for _, d := range s.timers {
			if t := d.Item; t.wait != nil && t.wait.queued() {
				e.resolve(t.wait, e.unqueue(s, t.wait), Result{Outcome: ShuttingDown})
			}
		}
		// Every remaining timer is now stale: no key has waiters left.
		s.timers = nil
		s.mu.Unlock()
	}
}
