package engine

import "time"

// The rule core: the lock rules of SPEC §5 and the admission hysteresis of
// SPEC §8 as pure functions of a key's state and an instant. Nothing here
// locks, reads a clock or calls out; both wrappers of the rules — the
// sharded Engine (mutexes, the Clock, waiter delivery) and the cluster's
// replicated state machine (replicated time, snapshots) — store the state
// their own way and ask these functions what every command does, so the
// two modes cannot answer the same history differently.

// Lease is a key's holding as the rules see it: the current token and the
// instant its lease lapses, on the wrapper's clock (the Engine's Clock, the
// cluster's replicated time). The zero Lease is a free key.
type Lease struct {
	Token uint64
	End   time.Duration
}

// HeldAt reports whether the lease still holds at now. SPEC §5: a key is
// free when absent or when its lease has expired, whether or not anyone
// has processed the expiry yet.
func (l Lease) HeldAt(now time.Duration) bool { return l.Token != 0 && now < l.End }

// Current reports whether token names the lease and it still holds at
// now: what RELEASE and KEEP require.
func (l Lease) Current(token uint64, now time.Duration) bool {
	return l.Token == token && l.HeldAt(now)
}

// Lapsed reports whether a lease was granted and has expired at now: its
// end is due and must be settled (the lock handed to the head waiter, or
// the key freed) before any other command on the key.
func (l Lease) Lapsed(now time.Duration) bool { return l.Token != 0 && l.End <= now }

// TokenCounter issues the fencing tokens of one key space (an Engine shard,
// a Raft group): strictly increasing, never above the limit the wrapper
// passes (the tokens reserved on disk, or the end of the counter).
type TokenCounter struct {
	Last   uint64 // the last token issued, or one below the first before any grant
	Issued uint64 // grants so far
}

// Room reports whether a token below or at limit is left.
func (c *TokenCounter) Room(limit uint64) bool { return c.Last < limit }

// Grant gives l the next token and a lease of lease from now; the caller
// has checked Room.
func (c *TokenCounter) Grant(l *Lease, now, lease time.Duration) {
	c.Last++
	c.Issued++
	l.Token = c.Last
	l.End = now + lease
}

// Acquire is what SPEC §5 makes of an ACQUIRE on a key whose lapsed lease
// has been settled: Granted when the key is free (the wrapper then passes
// the keys gate for a key new to its table and checks Room), Queued when
// it is held and the caller waits (after the waiters gate), TimedOut when
// it is held and wait is 0.
func Acquire(l Lease, now, wait time.Duration) Outcome {
	switch {
	case !l.HeldAt(now):
		return Granted
	case wait > 0:
		return Queued
	default:
		return TimedOut
	}
}

// Release is SPEC §5 RELEASE: Released when token is the current token of
// an unexpired lease (the wrapper then hands the lock to its head waiter),
// NotHeld for anything else.
func Release(l Lease, token uint64, now time.Duration) Outcome {
	if l.Current(token, now) {
		return Released
	}
	return NotHeld
}

// Keep is SPEC §5 KEEP: with the current token of an unexpired lease the
// lease ends at now + lease from now on, sooner than before or later, and
// the answer is Renewed; anything else is NotHeld and changes nothing.
func Keep(l *Lease, token uint64, now, lease time.Duration) Outcome {
	if !l.Current(token, now) {
		return NotHeld
	}
	l.End = now + lease
	return Renewed
}

// Waiting is a queued acquire as the rules see it, on the wrapper's clock.
type Waiting struct {
	Arrived  time.Duration // the acquire's instant, for Result.Waited
	Deadline time.Duration // never granted at or after it
	Lease    time.Duration
}

// QueueEntry is the head-of-queue entry of a wait of wait that arrives at now.
func QueueEntry(now, wait, lease time.Duration) Waiting {
	return Waiting{Arrived: now, Deadline: now + wait, Lease: lease}
}

// HandOff decides what a freed lock (released, or its lease lapsed) does
// with its head waiter w at now: Granted, with l holding the next token
// and Result.Waited set; TimedOut when w's wait has elapsed; TokenExhausted
// when no token is left under limit (a wrapper whose limit is a
// reservation rather than the counter's end answers its own shortage).
// Only a Granted answer ends the handoff; for the others the wrapper drops
// w and asks again for the next waiter, and frees the key when none is
// left.
func HandOff(l *Lease, c *TokenCounter, limit uint64, w Waiting, now time.Duration) Result {
	switch {
	case w.Deadline <= now:
		return Result{Outcome: TimedOut}
	case !c.Room(limit):
		return Result{Outcome: TokenExhausted}
	default:
		c.Grant(l, now, w.Lease)
		return Result{Outcome: Granted, Token: l.Token, Waited: now - w.Arrived}
	}
}

// GateRule is SPEC §8's hysteresis for one hard limit: a gate closes when
// its count reaches 90 % of the limit and reopens only once the count is
// below 75 %.
type GateRule struct {
	// CloseAt and ReopenBelow are count*10 >= limit*9 and count*4 <
	// limit*3 solved for count (ceil(0.9*limit) = limit - limit/10,
	// ceil(0.75*limit) = limit - limit/4), which cannot overflow for any
	// limit.
	CloseAt, ReopenBelow int64
}

// NewGateRule returns the rule for limit units.
func NewGateRule(limit int64) GateRule {
	return GateRule{CloseAt: limit - limit/10, ReopenBelow: limit - limit/4}
}

// Admit decides one more unit for a gate holding count units, closed or
// not: whether it is admitted, and whether the gate is closed afterwards.
// CloseAt is at most the limit and a unit is only admitted below it, so
// this is also the hard limit.
func (r GateRule) Admit(closed bool, count int64) (admitted, closedAfter bool) {
	if closed && count >= r.ReopenBelow {
		return false, true
	}
	if count >= r.CloseAt {
		return false, true
	}
	return true, false
}

// Reopens reports whether a gate at count is open again after a departure.
func (r GateRule) Reopens(count int64) bool { return count < r.ReopenBelow }
