package cluster

import (
	"math"
	"strings"
	"time"

	"github.com/lockd/lockd/engine"
)

// This file owns a group's replicated state and applies commands to it
// with the engine's rule core (engine.Acquire, Release, Keep, HandOff,
// GateRule), judged against the replicated time: a lease that has lapsed
// is free and a late RELEASE or KEEP is NotHeld, exactly as in single
// mode. It holds no lock, reads no clock and calls nothing: applying a
// command returns what happened (answers to requests, leases to time), and
// the state machine adapter (fsm.go) hands that to the node.

// waitEntry is a queued acquire in the replicated FIFO of a key, on the
// replicated clock. node and id name the waiter on the node its connection
// is on; only that node delivers the grant (or, if the waiter is gone,
// releases it).
type waitEntry struct {
	node, id  uint64
	requester engine.Requester // SPEC §6a; 0 without a session
	// origin is the index of the undated batch that queued it, until a
	// dated batch dates it (clock.go), 0 then: the origin of the lease a
	// handoff gives it.
	origin uint64
	engine.Waiting
}

// lockState is one held key. A key is in the table only while held: a
// freed lock goes straight to the head waiter, or the key is deleted.
// node and id name the request it was granted to, so that a node that
// only learns of the grant from a snapshot can still deliver it.
type lockState struct {
	engine.Lease        // token and lease end, on the replicated clock
	leaseSeconds uint16 // of the grant or of the latest KEEP
	// renewals counts the KEEPs applied to the token: a retried KEEP
	// names the renewal it extends, so that applied twice it renews once.
	renewals uint32
	node, id uint64
	// requester tags the request the token was issued to (SPEC §6a), 0
	// when it had no session: only its ABANDON gives the grant back.
	requester engine.Requester
	// grantedAt is the group's time when the token was issued, for the
	// hold time when its lease ends.
	grantedAt time.Duration
	// origin is the index of the undated batch that started the lease
	// (End is pendingEnd) until a dated batch dates it (clock.go); 0
	// once dated.
	origin uint64
	queue  []waitEntry
}

// replicated is one group's replicated state: the same on every replica
// that has applied the same log.
type replicated struct {
	locks      map[string]*lockState
	now        time.Duration // the group's time (clock.go)
	clock      groupClock
	batch      batchTime // the batch being applied
	tokens     engine.TokenCounter
	keysClosed bool
	queued     int // waitEntries in all queues
	// tombstones refuse the acquires their requesters abandoned (SPEC
	// §6a), by tenant name, on the replicated clock: the engine's rule
	// core, with its per-tenant bound, the same on every replica.
	tombstones *engine.Tombstones[string]
	// tenantKeys counts each tenant's keys (derived from locks), for the
	// tenants' keys quotas.
	tenantKeys map[string]int
	// format is the group's log format (version.go): logFormatBase, or
	// the newest every member read when its leader raised it (cmdFormat).
	// A writer of a command kind or snapshot form newer than the base
	// checks it first.
	format uint32
}

func newReplicated(firstToken uint64) replicated {
	return replicated{
		locks:      make(map[string]*lockState),
		tokens:     engine.TokenCounter{Last: max(firstToken, 1) - 1},
		tenantKeys: make(map[string]int),
		tombstones: engine.NewTombstones[string](0),
		format:     logFormatBase,
	}
}

// tenantOf is the tenant of a lock key.
func tenantOf(k string) string {
	tenant, _, _ := strings.Cut(k, "\x00")
	return tenant
}

// answerKind says how the node delivers an answer.
type answerKind uint8

const (
	answerDirect    answerKind = iota + 1 // the answer to the command's own request
	answerHandOff                         // a queued waiter was granted (or passed) when the lock freed
	answerStaleKeep                       // a KEEP named an older renewal; its request may need it again
	answerRestored                        // a grant or queue entry of this node's, found in a snapshot
	answerForgotten                       // a forget applied: node, and id its keep_first
)

// answer is one outcome of applying commands, for the node that owns id.
type answer struct {
	kind     answerKind
	key      string // lock key (tenant 0x00 key)
	node, id uint64
	r        engine.Result
	// for answerStaleKeep: what to propose again
	token    uint64
	renewals uint32
	lease    uint16
}

// applied gathers what a batch did: the answers to deliver, the leases
// (grants and renewals) whose end each replica times on its own clock,
// and how long each lease that ended was held (on the group's clock).
type applied struct {
	answers []answer
	leases  []leaseRef
	holds   []time.Duration
	// waits are the deadlines of the waits the batch queued, on the
	// group's clock: the leader moves the group's time when one ends
	// (clock.go), so that the next command passes its waiter.
	waits []time.Duration
}

func (a *applied) answer(kind answerKind, key string, node, id uint64, r engine.Result) {
	a.answers = append(a.answers, answer{kind: kind, key: key, node: node, id: id, r: r})
}

// apply runs one command at s.now.
func (s *replicated) apply(c *command, out *applied) {
	k := lockKey(c.tenant, c.key)
	switch c.kind {
	case cmdAcquire, cmdAcquireBy:
		s.acquire(k, c, out)
	case cmdAbandon:
		s.abandon(k, c, out)
	case cmdRelease:
		r := engine.Result{Outcome: engine.NotHeld}
		if l := s.settle(k, out); l != nil && engine.Release(l.Lease, c.token, s.now) == engine.Released {
			r.Outcome = engine.Released
			out.holds = append(out.holds, s.now-l.grantedAt)
			s.free(k, l, out)
		}
		if c.id != 0 {
			out.answer(answerDirect, k, c.node, c.id, r)
		}
	case cmdKeep:
		l := s.settle(k, out)
		switch {
		case l == nil || !l.Current(c.token, s.now):
			if c.id != 0 {
				out.answer(answerDirect, k, c.node, c.id, engine.Result{Outcome: engine.NotHeld})
			}
		case l.renewals != c.renewals:
			// A duplicate of a KEEP that applied already, or one proposed
			// from a replica that had not seen the latest renewal: no
			// effect. The proposer asks again for a request still waiting.
			out.answers = append(out.answers, answer{
				kind: answerStaleKeep, key: k, node: c.node, id: c.id,
				token: c.token, renewals: l.renewals, lease: c.lease,
			})
		default:
			engine.Keep(&l.Lease, c.token, s.now, seconds(c.lease))
			l.leaseSeconds = c.lease
			l.renewals++
			s.started(k, l, s.batch.origin(), out)
			if c.id != 0 {
				out.answer(answerDirect, k, c.node, c.id, engine.Result{Outcome: engine.Renewed, Token: l.Token})
			}
		}
	case cmdForget:
		s.forget(c.node, c.keepFirst, c.keepLast, out)
	case cmdCancel:
		s.cancel(k, c.node, c.id)
	case cmdFormat:
		s.format = max(s.format, c.format)
	case cmdLeaseEnd:
		// The leader's timer saw the lease fall due; whether it has is the
		// replicated clock's to say, so a renewed lease or a later token
		// is left alone.
		s.settle(k, out)
	}
}

// endBatch is run after each batch's commands: the tombstones expired on
// the replicated clock go.
func (s *replicated) endBatch() {
	if s.tombstones.Len() > 0 {
		s.tombstones.Expire(s.now)
	}
}

func (s *replicated) acquire(k string, c *command, out *applied) {
	if s.tombstones.Len() > 0 && s.tombstones.Refuses(string(c.tenant), c.requester, c.key, s.now) {
		// Its requester abandoned it (SPEC §6a): never granted or queued.
		out.answer(answerDirect, k, c.node, c.id, engine.Result{Outcome: engine.TimedOut})
		return
	}
	l := s.settle(k, out)
	var held engine.Lease
	if l != nil {
		held = l.Lease
	}
	switch engine.Acquire(held, s.now, time.Duration(max(c.wait, 0))) {
	case engine.TimedOut:
		out.answer(answerDirect, k, c.node, c.id, engine.Result{Outcome: engine.TimedOut})
	case engine.Granted:
		r := engine.Result{Outcome: engine.Granted}
		switch {
		case !s.tokens.Room(math.MaxUint64):
			r.Outcome = engine.TokenExhausted
		case !s.admitKey(int64(c.keyLimit)):
			r.Outcome = engine.Busy
		default:
			l = &lockState{}
			s.locks[k] = l
			s.tenantKeys[tenantOf(k)]++
			s.grant(k, l, c.node, c.id, c.requester, c.lease, out)
			r.Token = l.Token
		}
		out.answer(answerDirect, k, c.node, c.id, r)
	case engine.Queued:
		// A multiple of 64, not the slice's capacity: replicas restored
		// from a snapshot have other capacities and must still prune alike.
		if len(l.queue) >= 64 && len(l.queue)%64 == 0 {
			s.prune(l) // waiters that timed out stay queued until passed; bound them
		}
		w := waitEntry{node: c.node, id: c.id, requester: c.requester, origin: s.queuedAt(k),
			Waiting: engine.QueueEntry(s.now, time.Duration(c.wait), seconds(c.lease))}
		w.Deadline = s.batch.waitNow + time.Duration(c.wait)
		l.queue = append(l.queue, w)
		out.waits = append(out.waits, w.Deadline)
		s.queued++
		out.answer(answerDirect, k, c.node, c.id, engine.Result{Outcome: engine.Queued})
	}
}

// admitKey is the keys admission gate (SPEC §8) on replicated state, so
// every replica decides alike; limit is the proposer's share of MaxKeys
// carried in the command.
func (s *replicated) admitKey(limit int64) bool {
	admitted, closed := engine.NewGateRule(limit).Admit(s.keysClosed, int64(len(s.locks)))
	s.keysClosed = closed
	return admitted
}

func (s *replicated) grant(k string, l *lockState, node, id uint64, r engine.Requester, lease uint16, out *applied) {
	s.tokens.Grant(&l.Lease, s.now, seconds(lease))
	s.setHolder(k, l, node, id, r, lease, s.batch.origin(), out)
}

// setHolder records who holds the token just issued to l, whose lease
// started at origin (clock.go).
func (s *replicated) setHolder(k string, l *lockState, node, id uint64, r engine.Requester, lease uint16, origin uint64, out *applied) {
	l.leaseSeconds = lease
	l.renewals = 0
	l.node, l.id, l.requester = node, id, r
	l.grantedAt = s.now
	s.started(k, l, origin, out)
}

// settle frees the lock of k if its lease has lapsed at s.now (SPEC §5), so
// that a command on the key sees it as single mode would. It returns the
// key's lock from then on, nil if free.
func (s *replicated) settle(k string, out *applied) *lockState {
	l := s.locks[k]
	if l == nil || !l.Lapsed(s.now) {
		return l
	}
	out.holds = append(out.holds, l.End-l.grantedAt) // the holder had the whole lease
	return s.free(k, l, out)
}

// free hands the lock to the first waiter still within its wait, or
// deletes the key; it returns the lock, nil when deleted.
func (s *replicated) free(k string, l *lockState, out *applied) *lockState {
	for len(l.queue) > 0 {
		w := l.queue[0]
		l.queue[0] = waitEntry{}
		l.queue = l.queue[1:]
		s.queued--
		if w.origin != 0 {
			// Queued by a batch no dated batch has dated yet: its request
			// may have arrived as late as the lease's start, so its
			// client may count no time waited.
			w.Arrived = s.batch.waitNow
		}
		// At waitNow, never before the group's time: a lease it grants is
		// never shorter.
		r := engine.HandOff(&l.Lease, &s.tokens, math.MaxUint64, w.Waiting, s.batch.waitNow)
		out.answer(answerHandOff, k, w.node, w.id, r)
		if r.Outcome == engine.Granted {
			// A waiter queued in a dated batch sent its request before
			// the time it was queued at, so before s.now.
			s.setHolder(k, l, w.node, w.id, w.requester, uint16(w.Lease/time.Second), w.origin, out)
			return l
		}
	}
	delete(s.locks, k)
	tenant := tenantOf(k)
	if s.tenantKeys[tenant]--; s.tenantKeys[tenant] == 0 {
		delete(s.tenantKeys, tenant)
	}
	return nil
}

// abandon is SPEC §6a ABANDON of the requester's acquire of k, by the
// engine's rule (engine.AbandonGrant), after a due handoff (settle): the
// request's queued waiter is dropped (answered TimedOut, as in single
// mode), and the grant made for it is released as by RELEASE with its
// token (the head waiter granted); either way a tombstone refuses that
// acquire from now on, should a retried proposal of it apply later.
// Answered Released or NotHeld. Every queued entry of the request goes,
// before the release can hand the lock to one of them: a retried proposal
// of it that applied twice queued a copy behind its own grant.
func (s *replicated) abandon(k string, c *command, out *applied) {
	r := engine.Result{Outcome: engine.NotHeld}
	if l := s.settle(k, out); l != nil {
		if c.requester != 0 {
			s.dropWaiters(l, func(w waitEntry) bool {
				if w.requester != c.requester {
					return false
				}
				out.answer(answerDirect, k, w.node, w.id, engine.Result{Outcome: engine.TimedOut})
				return true
			})
		}
		if engine.AbandonGrant(l.Lease, l.requester, c.requester, s.now) == engine.Released {
			r.Outcome = engine.Released
			out.holds = append(out.holds, s.now-l.grantedAt)
			s.free(k, l, out)
		}
	}
	s.tombstones.Lay(string(c.tenant), c.requester, c.key, s.now)
	out.answer(answerDirect, k, c.node, c.id, r)
}

// forget drops node's queued waiters whose request id is outside [keepFirst,
// keepLast], answering them Unavailable (a definitive non-acquisition: no
// grant can reach them any more). A lock that frees afterwards goes to a
// waiter of a live node instead of to one nobody can receive.
func (s *replicated) forget(node, keepFirst, keepLast uint64, out *applied) {
	out.answers = append(out.answers, answer{kind: answerForgotten, node: node, id: keepFirst})
	for k, l := range s.locks {
		s.dropWaiters(l, func(w waitEntry) bool {
			if id := w.id &^ (1 << 63); w.node != node || id >= keepFirst && id <= keepLast {
				return false
			}
			out.answer(answerDirect, k, w.node, w.id, engine.Result{Outcome: engine.Unavailable})
			return true
		})
	}
}

// cancel drops node's queued waiter id from k's queue (SPEC §5: a closed
// connection's waiters leave, its locks stay). It answers nobody, since
// the node has answered its client, and frees or grants nothing: a lapsed
// lease whose head waiter left is settled by the next command on the key
// (free), as in single mode, whose Cancel only unqueues. Every entry of
// the request goes (a retried acquire applied twice queued it twice), and
// none left is no error: a duplicate of the acquire may apply after the
// cancel, and its node then cancels it again (group.result).
func (s *replicated) cancel(k string, node, id uint64) {
	if l := s.locks[k]; l != nil {
		s.dropWaiters(l, func(w waitEntry) bool { return w.node == node && w.id == id })
	}
}

// prune drops waiters whose wait has ended (their node answered T already).
func (s *replicated) prune(l *lockState) {
	s.dropWaiters(l, func(w waitEntry) bool { return w.Deadline <= s.batch.waitNow })
}

// dropWaiters removes the entries of l's queue that drop reports, keeping
// the others in order; the lock itself is left alone.
func (s *replicated) dropWaiters(l *lockState, drop func(waitEntry) bool) {
	kept := l.queue[:0]
	for _, w := range l.queue {
		if drop(w) {
			s.queued--
		} else {
			kept = append(kept, w)
		}
	}
	clear(l.queue[len(kept):])
	l.queue = kept
}

func seconds(s uint16) time.Duration { return time.Duration(s) * time.Second }
