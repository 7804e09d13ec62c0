package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
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
	lease        uint16 // seconds, of the grant or of the latest KEEP
	// renewals counts the KEEPs applied to the token: a retried KEEP
	// names the renewal it extends, so that applied twice it renews once.
	renewals uint32
	node, id uint64
	// requester tags the request the token was issued to (SPEC §6a), 0
	// when it had no session: only its ABANDON gives the grant back.
	requester engine.Requester
	// granted is the group's clock when the token was issued, for the
	// hold time when its lease ends.
	granted time.Duration
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
	leases  []expiry
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
			out.holds = append(out.holds, s.now-l.granted)
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
			l.lease = c.lease
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
	s.granted(k, l, node, id, r, lease, s.batch.origin(), out)
}

// granted records who holds the token just issued to l, whose lease
// started at origin (clock.go).
func (s *replicated) granted(k string, l *lockState, node, id uint64, r engine.Requester, lease uint16, origin uint64, out *applied) {
	l.lease = lease
	l.renewals = 0
	l.node, l.id, l.requester = node, id, r
	l.granted = s.now
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
	out.holds = append(out.holds, l.End-l.granted) // the holder had the whole lease
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
			s.granted(k, l, w.node, w.id, w.requester, uint16(w.Lease/time.Second), w.origin, out)
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
			out.holds = append(out.holds, s.now-l.granted)
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

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Snapshot versions: 7 is log format 3's, 8 format 4's, 9 format 5's
// (version.go). A group writes a version only once its format is the
// version's, so that every member can read what it writes. The forms of the unreleased formats before 3
// are refused, and a version this build does not read halts the replica
// (errUnknownSnapshot).
//
//	version u8 | now i64 | tokens last u64 | tokens issued u64 | keys closed u8 |
//	locks u64 | format u32 | [clock term u64 | clock leader u64 | clock base i64 | clock dated u64 |]
//	locks × lock [| tombstones u64 | tombstones × tombstone]
//
// a lock is
//
//	key len u16 + key | token u64 | lease_s u16 | end i64 | node u64 | id u64 |
//	[requester u64 |] renewals u32 | granted i64 | [origin u64 |] waiters u32 |
//	waiters × (node u64 | id u64 | [requester u64 |] [origin u64 |] deadline i64 | arrived i64 | lease_s u16)
//
// (requesters from version 8 on, the clock and origins from version 9 on)
//
// and a tombstone (version 8; in the order engine.Tombstones.All yields,
// so that laying them again rebuilds the same refusals)
//
//	tenant len u8 + tenant | requester u64 | key len u8 + key | laid i64
const (
	snapshotVersion7 = 7
	snapshotVersion8 = 8
	snapshotVersion  = 9
)

// errUnknownSnapshot is a snapshot version this build does not read.
var errUnknownSnapshot = errors.New("cluster: unknown snapshot")

// save writes the state; stop aborts a long save.
func (s *replicated) save(w io.Writer, stop <-chan struct{}) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var b []byte
	version := byte(snapshotVersion7)
	switch {
	case s.format >= logFormat5:
		version = snapshotVersion
	case s.format >= logFormat4:
		version = snapshotVersion8
	}
	b = append(b, version)
	b = binary.BigEndian.AppendUint64(b, uint64(s.now))
	b = binary.BigEndian.AppendUint64(b, s.tokens.Last)
	b = binary.BigEndian.AppendUint64(b, s.tokens.Issued)
	b = append(b, boolByte(s.keysClosed))
	b = binary.BigEndian.AppendUint64(b, uint64(len(s.locks)))
	b = binary.BigEndian.AppendUint32(b, s.format)
	if version >= snapshotVersion {
		b = binary.BigEndian.AppendUint64(b, s.clock.term)
		b = binary.BigEndian.AppendUint64(b, s.clock.leader)
		b = binary.BigEndian.AppendUint64(b, uint64(s.clock.base))
		b = binary.BigEndian.AppendUint64(b, s.clock.dated)
	}
	if _, err := bw.Write(b); err != nil {
		return err
	}
	n := 0
	for k, l := range s.locks {
		if n++; n%4096 == 0 {
			select {
			case <-stop:
				return sm.ErrSnapshotStopped
			default:
			}
		}
		b = b[:0]
		b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint64(b, l.Token)
		b = binary.BigEndian.AppendUint16(b, l.lease)
		b = binary.BigEndian.AppendUint64(b, uint64(l.End))
		b = binary.BigEndian.AppendUint64(b, l.node)
		b = binary.BigEndian.AppendUint64(b, l.id)
		if version >= snapshotVersion8 {
			b = binary.BigEndian.AppendUint64(b, uint64(l.requester))
		}
		b = binary.BigEndian.AppendUint32(b, l.renewals)
		b = binary.BigEndian.AppendUint64(b, uint64(l.granted))
		if version >= snapshotVersion {
			b = binary.BigEndian.AppendUint64(b, l.origin)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(l.queue)))
		for _, q := range l.queue {
			b = binary.BigEndian.AppendUint64(b, q.node)
			b = binary.BigEndian.AppendUint64(b, q.id)
			if version >= snapshotVersion8 {
				b = binary.BigEndian.AppendUint64(b, uint64(q.requester))
			}
			if version >= snapshotVersion {
				b = binary.BigEndian.AppendUint64(b, q.origin)
			}
			b = binary.BigEndian.AppendUint64(b, uint64(q.Deadline))
			b = binary.BigEndian.AppendUint64(b, uint64(q.Arrived))
			b = binary.BigEndian.AppendUint16(b, uint16(q.Lease/time.Second))
		}
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	if version >= snapshotVersion8 {
		b = binary.BigEndian.AppendUint64(b[:0], uint64(s.tombstones.Len()))
		for tenant, ts := range s.tombstones.All() {
			b = append(b, byte(len(tenant)))
			b = append(b, tenant...)
			b = binary.BigEndian.AppendUint64(b, uint64(ts.Requester))
			b = append(b, byte(len(ts.Key)))
			b = append(b, ts.Key...)
			b = binary.BigEndian.AppendUint64(b, uint64(ts.Laid))
			if len(b) >= 32<<10 {
				if _, err := bw.Write(b); err != nil {
					return err
				}
				b = b[:0]
			}
		}
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// restore reads a state written by save.
func restore(r io.Reader, stop <-chan struct{}) (replicated, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var hdr [1 + 8 + 8 + 8 + 1 + 8 + 4]byte
	if _, err := io.ReadFull(br, hdr[:1]); err != nil {
		return replicated{}, err
	}
	version := hdr[0]
	if version < snapshotVersion7 || version > snapshotVersion {
		return replicated{}, fmt.Errorf("%w version %d (this build reads %d to %d)", errUnknownSnapshot, version, snapshotVersion7, snapshotVersion)
	}
	if _, err := io.ReadFull(br, hdr[1:]); err != nil {
		return replicated{}, err
	}
	be := binary.BigEndian
	s := newReplicated(0)
	s.now = time.Duration(be.Uint64(hdr[1:]))
	s.tokens = engine.TokenCounter{Last: be.Uint64(hdr[9:]), Issued: be.Uint64(hdr[17:])}
	s.keysClosed = hdr[25] == 1
	s.format = be.Uint32(hdr[34:])
	nLocks := be.Uint64(hdr[26:])
	requesterLen, originLen := 0, 0
	if version >= snapshotVersion8 {
		requesterLen = 8
	}
	if version >= snapshotVersion {
		originLen = 8
		var clock [8 + 8 + 8 + 8]byte
		if _, err := io.ReadFull(br, clock[:]); err != nil {
			return replicated{}, err
		}
		s.clock.term, s.clock.leader = be.Uint64(clock[:]), be.Uint64(clock[8:])
		s.clock.base = time.Duration(be.Uint64(clock[16:]))
		s.clock.dated = be.Uint64(clock[24:])
	}
	lockLen := 8 + 2 + 8 + 8 + 8 + requesterLen + 4 + 8 + originLen + 4
	waitEntryLen := 8 + 8 + requesterLen + originLen + 8 + 8 + 2
	var buf [8 + 2 + 8 + 8 + 8 + 8 + 4 + 8 + 8 + 4]byte
	for i := uint64(0); i < nLocks; i++ {
		if i%4096 == 4095 {
			select {
			case <-stop:
				return replicated{}, sm.ErrSnapshotStopped
			default:
			}
		}
		if _, err := io.ReadFull(br, buf[:2]); err != nil {
			return replicated{}, err
		}
		kb := make([]byte, be.Uint16(buf[:2]))
		if _, err := io.ReadFull(br, kb); err != nil {
			return replicated{}, err
		}
		if _, err := io.ReadFull(br, buf[:lockLen]); err != nil {
			return replicated{}, err
		}
		l := &lockState{
			Lease: engine.Lease{Token: be.Uint64(buf[:]), End: time.Duration(be.Uint64(buf[10:]))},
			lease: be.Uint16(buf[8:]),
			node:  be.Uint64(buf[18:]),
			id:    be.Uint64(buf[26:]),
		}
		at := 34
		if requesterLen > 0 {
			l.requester = engine.Requester(be.Uint64(buf[at:]))
			at += 8
		}
		l.renewals = be.Uint32(buf[at:])
		l.granted = time.Duration(be.Uint64(buf[at+4:]))
		at += 12
		if originLen > 0 {
			l.origin = be.Uint64(buf[at:])
			at += 8
		}
		nq := int(be.Uint32(buf[at:]))
		for range nq {
			if _, err := io.ReadFull(br, buf[:waitEntryLen]); err != nil {
				return replicated{}, err
			}
			w := waitEntry{node: be.Uint64(buf[:]), id: be.Uint64(buf[8:])}
			at := 16
			if requesterLen > 0 {
				w.requester = engine.Requester(be.Uint64(buf[at:]))
				at += 8
			}
			if originLen > 0 {
				w.origin = be.Uint64(buf[at:])
				at += 8
			}
			w.Waiting = engine.Waiting{
				Deadline: time.Duration(be.Uint64(buf[at:])),
				Arrived:  time.Duration(be.Uint64(buf[at+8:])),
				Lease:    seconds(be.Uint16(buf[at+16:])),
			}
			l.queue = append(l.queue, w)
		}
		s.queued += nq
		s.locks[string(kb)] = l
		s.tenantKeys[tenantOf(string(kb))]++
	}
	if version >= snapshotVersion8 {
		if err := restoreTombstones(br, s.tombstones); err != nil {
			return replicated{}, err
		}
	}
	s.rebuildPending()
	return s, nil
}

// restoreTombstones lays the tombstones of a version 8 snapshot again, in
// the order saved.
func restoreTombstones(br *bufio.Reader, ts *engine.Tombstones[string]) error {
	var buf [8]byte
	if _, err := io.ReadFull(br, buf[:]); err != nil {
		return err
	}
	text := func() (string, error) {
		n, err := br.ReadByte()
		if err != nil {
			return "", err
		}
		b := make([]byte, n)
		_, err = io.ReadFull(br, b)
		return string(b), err
	}
	for range binary.BigEndian.Uint64(buf[:]) {
		tenant, err := text()
		if err != nil {
			return err
		}
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			return err
		}
		r := engine.Requester(binary.BigEndian.Uint64(buf[:]))
		key, err := text()
		if err != nil {
			return err
		}
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			return err
		}
		ts.Lay(tenant, r, []byte(key), time.Duration(binary.BigEndian.Uint64(buf[:])))
	}
	return nil
}
