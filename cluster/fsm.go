package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
)

// waitEntry is a queued acquire in the replicated FIFO of a key. node and
// id name the waiter on the node its connection is on; only that node
// delivers the grant (or, if the waiter is gone, releases it).
type waitEntry struct {
	node, id  uint64
	waitUntil int64 // state-machine time (Unix ns); never granted at or after it
	enqueued  int64 // state-machine time of the enqueue, for waited_ms
	lease     uint16
}

// lockState is one held key. A key is in the table only while held: a
// freed lock goes straight to the head waiter, or the key is deleted.
// node and id name the request it was granted to, so that a node that
// only learns of the grant from a snapshot can still deliver it.
type lockState struct {
	token   uint64
	lease   uint16 // seconds, of the grant or of the latest KEEP
	granted int64  // state-machine time of the grant
	// renewals counts the KEEPs applied to token: a lease end names the
	// renewal it ends, so that of a renewed lease frees nothing.
	renewals uint32
	node, id uint64
	queue    []waitEntry
}

// fsm is one group's deterministic state machine (SPEC §5 rules, cluster
// flavour). Replicated state: locks, now, lastToken, issued, keysClosed.
// Everything below "node-local" is derived on each replica and never
// snapshotted.
type fsm struct {
	g *group // node-side hooks; callbacks must not block

	mu         sync.Mutex
	locks      map[string]*lockState
	now        int64 // max of proposers' clocks seen so far (Unix ns)
	lastToken  uint64
	issued     uint64
	keysClosed bool
	queued     int // waitEntries in all queues

	restored atomic.Int64 // snapshots recovered, for tests

	// node-local:
	fresh []expiry // grants and renewals applied since the expiry driver last ran
	heap  engine.DeadlineHeap[expiry]
	load  map[uint64]uint64 // acquires and releases applied per proposing node, for leader placement
	cmd   command           // decode scratch
}

func newFSM(g *group, firstToken uint64) *fsm {
	return &fsm{g: g, locks: make(map[string]*lockState), load: make(map[uint64]uint64), lastToken: max(firstToken, 1) - 1}
}

// Update applies one batch. Malformed batches are skipped whole (they
// cannot come from this code); Update never fails, since a failed Update
// stops the replica.
func (f *fsm) Update(e sm.Entry) (sm.Result, error) {
	now, count, b, err := readHeader(e.Cmd)
	if err != nil {
		return sm.Result{}, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = max(f.now, now)
	for range count {
		if b, err = readCommand(b, &f.cmd); err != nil {
			break
		}
		f.apply(&f.cmd)
	}
	return sm.Result{Value: uint64(count)}, nil
}

func (f *fsm) apply(c *command) {
	switch c.kind {
	case cmdAcquire:
		f.load[c.node]++
		f.acquire(c)
	case cmdRelease:
		f.load[c.node]++
		r := engine.Result{Outcome: engine.NotHeld}
		k := lockKey(c.tenant, c.key)
		if l := f.locks[k]; l != nil && l.token == c.token {
			r.Outcome = engine.Released
			f.free(k, l)
		}
		if c.id != 0 {
			f.g.result(k, c.node, c.id, r)
		}
	case cmdKeep:
		f.load[c.node]++
		k := lockKey(c.tenant, c.key)
		l := f.locks[k]
		switch {
		case l == nil || l.token != c.token:
			if c.id != 0 {
				f.g.result(k, c.node, c.id, engine.Result{Outcome: engine.NotHeld})
			}
		case l.renewals != c.renewals:
			// A duplicate of a KEEP that applied already, or one proposed
			// from a replica that had not seen the latest renewal: no
			// effect. The proposer asks again for a request still waiting.
			f.g.staleKeep(c, l.renewals)
		default:
			f.renew(k, l, c.lease)
			if c.id != 0 {
				f.g.result(k, c.node, c.id, engine.Result{Outcome: engine.Renewed, Token: l.token})
			}
		}
	case cmdLeaseEnd, cmdExpire:
		k := lockKey(c.tenant, c.key)
		if l := f.locks[k]; l != nil && l.token == c.token && l.renewals == c.renewals {
			f.free(k, l)
		}
	}
}

// renew is KEEP (SPEC §5) on the replicated state: the token stays, the
// lease becomes lease from now, on each replica's clock once stamped
// (stampFresh), and the expiry entries of the lease it replaces go stale.
// A lease that fell due on the leader but whose end has not applied yet is
// still held, so a KEEP ordered before that end renews it: nobody else
// can have been granted the key.
func (f *fsm) renew(k string, l *lockState, lease uint16) {
	l.lease = lease
	l.renewals++
	f.fresh = append(f.fresh, expiry{key: k, token: l.token, renewals: l.renewals, lease: time.Duration(lease) * time.Second})
}

func (f *fsm) acquire(c *command) {
	k := lockKey(c.tenant, c.key)
	l := f.locks[k]
	if l == nil {
		r := engine.Result{Outcome: engine.Granted}
		switch {
		case f.lastToken == math.MaxUint64:
			r.Outcome = engine.TokenExhausted
		case !f.admitKey(int(c.keyLimit)):
			r.Outcome = engine.Busy
		default:
			l = &lockState{}
			f.locks[k] = l
			f.grant(k, l, c.node, c.id, c.lease)
			r.Token = l.token
		}
		f.g.result(k, c.node, c.id, r)
		return
	}
	if c.wait <= 0 {
		f.g.result(k, c.node, c.id, engine.Result{Outcome: engine.TimedOut})
		return
	}
	// A multiple of 64, not the slice's capacity: replicas restored from a
	// snapshot have other capacities and must still prune alike.
	if len(l.queue) >= 64 && len(l.queue)%64 == 0 {
		f.prune(l) // waiters that timed out stay queued until passed; bound them
	}
	l.queue = append(l.queue, waitEntry{node: c.node, id: c.id, waitUntil: f.now + c.wait, enqueued: f.now, lease: c.lease})
	f.queued++
	f.g.result(k, c.node, c.id, engine.Result{Outcome: engine.Queued})
}

// admitKey is the keys admission gate (SPEC §8) on replicated state, so
// every replica decides alike: closes at 90 % of limit, the proposer's
// share of MaxKeys carried in the command, and reopens below 75 %.
func (f *fsm) admitKey(limit int) bool {
	n := len(f.locks)
	if f.keysClosed {
		if n >= limit-limit/4 {
			return false
		}
		f.keysClosed = false
	}
	if n >= limit-limit/10 {
		f.keysClosed = true
		return false
	}
	return true
}

func (f *fsm) grant(k string, l *lockState, node, id uint64, lease uint16) {
	f.lastToken++
	f.issued++
	l.token = f.lastToken
	l.lease = lease
	l.renewals = 0
	l.granted = f.now
	l.node, l.id = node, id
	f.fresh = append(f.fresh, expiry{key: k, token: l.token, lease: time.Duration(lease) * time.Second})
}

// free hands the lock to the first waiter still within its wait, or
// deletes the key.
func (f *fsm) free(k string, l *lockState) {
	for len(l.queue) > 0 {
		w := l.queue[0]
		l.queue[0] = waitEntry{}
		l.queue = l.queue[1:]
		f.queued--
		switch {
		case w.waitUntil <= f.now:
			f.g.result(k, w.node, w.id, engine.Result{Outcome: engine.TimedOut})
		case f.lastToken == math.MaxUint64:
			f.g.result(k, w.node, w.id, engine.Result{Outcome: engine.TokenExhausted})
		default:
			f.grant(k, l, w.node, w.id, w.lease)
			f.g.granted(k, w.node, w.id, engine.Result{
				Outcome: engine.Granted, Token: l.token, Waited: time.Duration(f.now - w.enqueued),
			})
			return
		}
	}
	delete(f.locks, k)
}

// prune drops waiters whose wait has ended (their node answered T already).
func (f *fsm) prune(l *lockState) {
	kept := l.queue[:0]
	for _, w := range l.queue {
		if w.waitUntil > f.now {
			kept = append(kept, w)
		} else {
			f.queued--
		}
	}
	clear(l.queue[len(kept):])
	l.queue = kept
}

// Lookup answers a lock key (tenant 0x00 key) with its current token, 0
// when free; used by tests and tools.
func (f *fsm) Lookup(q any) (any, error) {
	k, ok := q.(string)
	if !ok {
		return nil, errors.New("cluster: lookup wants a lock key")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.locks[k]; l != nil {
		return l.token, nil
	}
	return uint64(0), nil
}

// snapshotVersion 2 added each lock's holder (node, id), version 3 its
// renewals. Older snapshots, written by earlier builds, still restore
// with no holder known and no renewals: dragonboat stops the process when
// a snapshot cannot be read.
const snapshotVersion = 3

// SaveSnapshot writes the replicated state. IStateMachine snapshots block
// Update for their duration; the state is a few dozen bytes per key.
func (f *fsm) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, stop <-chan struct{}) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	bw := bufio.NewWriterSize(w, 64<<10)
	var b []byte
	b = append(b, snapshotVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(f.now))
	b = binary.BigEndian.AppendUint64(b, f.lastToken)
	b = binary.BigEndian.AppendUint64(b, f.issued)
	if f.keysClosed {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(f.locks)))
	if _, err := bw.Write(b); err != nil {
		return err
	}
	n := 0
	for k, l := range f.locks {
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
		b = binary.BigEndian.AppendUint64(b, l.token)
		b = binary.BigEndian.AppendUint16(b, l.lease)
		b = binary.BigEndian.AppendUint64(b, uint64(l.granted))
		b = binary.BigEndian.AppendUint64(b, l.node)
		b = binary.BigEndian.AppendUint64(b, l.id)
		b = binary.BigEndian.AppendUint32(b, l.renewals)
		b = binary.BigEndian.AppendUint32(b, uint32(len(l.queue)))
		for _, q := range l.queue {
			b = binary.BigEndian.AppendUint64(b, q.node)
			b = binary.BigEndian.AppendUint64(b, q.id)
			b = binary.BigEndian.AppendUint64(b, uint64(q.waitUntil))
			b = binary.BigEndian.AppendUint64(b, uint64(q.enqueued))
			b = binary.BigEndian.AppendUint16(b, q.lease)
		}
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// RecoverFromSnapshot replaces the state. Every held lock is handed to the
// expiry driver with its full lease from now on this replica: a restored
// replica may extend a lease, never shorten it. Grants and queue entries
// of this node's requests that the snapshot holds are handed to the node
// (group.restoredGrant, group.result), since no Update will report them.
func (f *fsm) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, stop <-chan struct{}) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var hdr [1 + 8 + 8 + 8 + 1 + 8]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return err
	}
	version := hdr[0]
	if version < 1 || version > snapshotVersion {
		return fmt.Errorf("cluster: snapshot version %d, this build reads 1 to %d", version, snapshotVersion)
	}
	be := binary.BigEndian
	locks := make(map[string]*lockState)
	nLocks := be.Uint64(hdr[26:])
	queued := 0
	var fresh []expiry
	self := f.g.n.cfg.NodeID
	var mine []ownedRequest // this node's requests the snapshot granted or queued
	const waitEntryLen = 8 + 8 + 8 + 8 + 2
	holderLen, renewalsLen := 8+8, 4
	if version == 1 {
		holderLen = 0
	}
	if version < 3 {
		renewalsLen = 0
	}
	var buf [8 + 2 + 8 + 16 + 4 + 4]byte
	for i := uint64(0); i < nLocks; i++ {
		if i%4096 == 4095 {
			select {
			case <-stop:
				return sm.ErrSnapshotStopped
			default:
			}
		}
		if _, err := io.ReadFull(br, buf[:2]); err != nil {
			return err
		}
		kb := make([]byte, be.Uint16(buf[:2]))
		if _, err := io.ReadFull(br, kb); err != nil {
			return err
		}
		if _, err := io.ReadFull(br, buf[:8+2+8+holderLen+renewalsLen+4]); err != nil {
			return err
		}
		l := &lockState{token: be.Uint64(buf[:]), lease: be.Uint16(buf[8:]), granted: int64(be.Uint64(buf[10:]))}
		if holderLen > 0 {
			l.node, l.id = be.Uint64(buf[18:]), be.Uint64(buf[26:])
		}
		if renewalsLen > 0 {
			l.renewals = be.Uint32(buf[18+holderLen:])
		}
		nq := int(be.Uint32(buf[18+holderLen+renewalsLen:]))
		if l.node == self {
			// Before its queue: a retried duplicate of the holder's own
			// request may wait behind it.
			mine = append(mine, ownedRequest{key: string(kb), id: l.id, token: l.token})
		}
		for range nq {
			if _, err := io.ReadFull(br, buf[:waitEntryLen]); err != nil {
				return err
			}
			w := waitEntry{
				node: be.Uint64(buf[:]), id: be.Uint64(buf[8:]), waitUntil: int64(be.Uint64(buf[16:])),
				enqueued: int64(be.Uint64(buf[24:])), lease: be.Uint16(buf[32:]),
			}
			l.queue = append(l.queue, w)
			if w.node == self {
				mine = append(mine, ownedRequest{key: string(kb), id: w.id})
			}
		}
		queued += nq
		k := string(kb)
		locks[k] = l
		fresh = append(fresh, expiry{key: k, token: l.token, renewals: l.renewals, lease: time.Duration(l.lease) * time.Second})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = int64(be.Uint64(hdr[1:]))
	f.lastToken = be.Uint64(hdr[9:])
	f.issued = be.Uint64(hdr[17:])
	f.keysClosed = hdr[25] == 1
	f.locks = locks
	f.queued = queued
	f.heap = f.heap[:0]
	f.fresh = fresh
	f.restored.Add(1)
	for _, o := range mine {
		if o.token != 0 {
			f.g.restoredGrant(o.id, o.token)
		} else {
			f.g.result(o.key, self, o.id, engine.Result{Outcome: engine.Queued})
		}
	}
	return nil
}

// ownedRequest is a grant (token != 0) or queue entry of this node's
// request id, found in a snapshot.
type ownedRequest struct {
	key   string
	id    uint64
	token uint64
}

func (f *fsm) Close() error { return nil }

// expiry is a lease end in a replica's expiry heap, due at an instant of
// this process's monotonic clock, valid while key still holds token and
// no KEEP renewed it since (renewals).
type expiry struct {
	key      string
	token    uint64
	renewals uint32
	lease    time.Duration // for fresh entries, before they are pushed
}

// takeLoad returns and resets the per-node command counts since the last
// call: the busiest node other than self, and self's own count.
func (f *fsm) takeLoad(self uint64) (busiest loadShare, own uint64) {
	for node, n := range f.load {
		switch {
		case node == self:
			own = n
		case n > busiest.commands || n == busiest.commands && node < busiest.node:
			busiest = loadShare{node: node, commands: n}
		}
	}
	clear(f.load)
	return busiest, own
}

// renewalsOf is the renewals of key's lock as this replica has applied
// them, when token is its current token; 0 otherwise (a KEEP proposed on
// that view, if stale, is proposed again once this replica catches up).
func (f *fsm) renewalsOf(key string, token uint64) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.locks[key]; l != nil && l.token == token {
		return l.renewals
	}
	return 0
}

// valid reports whether e still names the key's current lease: its token
// and its latest renewal.
func (f *fsm) valid(e expiry) bool {
	l := f.locks[e.key]
	return l != nil && l.token == e.token && l.renewals == e.renewals
}

// stampFresh gives the grants and renewals applied since the last call
// their deadline:
// now + lease on this replica's clock, read after the apply, so no replica
// ends a lease before the client's own bound (send instant + waited +
// lease). Stale heap entries are compacted when they outnumber live locks.
func (f *fsm) stampFresh(now time.Duration) {
	for _, e := range f.fresh {
		f.heap.Push(now+e.lease, e)
	}
	clear(f.fresh)
	f.fresh = f.fresh[:0]
	if len(f.heap) > 64 && len(f.heap) > 2*len(f.locks) {
		f.heap.Retain(f.valid)
	}
}

// rebuild is run when this replica becomes the group's leader: the heap
// is rebuilt from the replicated lock table, keeping every deadline this
// replica already knew (never shorter) and giving a lock it has no entry
// for a full lease from now.
func (f *fsm) rebuild(now time.Duration) {
	known := make(map[string]time.Duration, len(f.heap))
	for _, d := range f.heap {
		if f.valid(d.Item) {
			known[d.Item.key] = max(known[d.Item.key], d.At)
		}
	}
	f.heap = f.heap[:0]
	for k, l := range f.locks {
		at, ok := known[k]
		if !ok {
			at = now + time.Duration(l.lease)*time.Second
		}
		f.heap = append(f.heap, engine.Deadline[expiry]{At: at, Item: expiry{key: k, token: l.token, renewals: l.renewals}})
	}
	f.heap.Init()
}

// due pops the valid entries due at now, re-arming each retry later in
// case the expire proposal is lost (a later token makes it stale).
func (f *fsm) due(now, retry time.Duration, out []expiry) []expiry {
	for at, ok := f.heap.Next(); ok && at <= now; at, ok = f.heap.Next() {
		e := f.heap.Pop().Item
		if !f.valid(e) {
			continue
		}
		out = append(out, e)
		f.heap.Push(now+retry, e)
	}
	return out
}
