package cluster

// This file owns a group's snapshots: the state machine's save and
// recovery, and the snapshot format of the replicated state.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
)

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
		b = binary.BigEndian.AppendUint16(b, l.leaseSeconds)
		b = binary.BigEndian.AppendUint64(b, uint64(l.End))
		b = binary.BigEndian.AppendUint64(b, l.node)
		b = binary.BigEndian.AppendUint64(b, l.id)
		if version >= snapshotVersion8 {
			b = binary.BigEndian.AppendUint64(b, uint64(l.requester))
		}
		b = binary.BigEndian.AppendUint32(b, l.renewals)
		b = binary.BigEndian.AppendUint64(b, uint64(l.grantedAt))
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
			Lease:        engine.Lease{Token: be.Uint64(buf[:]), End: time.Duration(be.Uint64(buf[10:]))},
			leaseSeconds: be.Uint16(buf[8:]),
			node:         be.Uint64(buf[18:]),
			id:           be.Uint64(buf[26:]),
		}
		at := 34
		if requesterLen > 0 {
			l.requester = engine.Requester(be.Uint64(buf[at:]))
			at += 8
		}
		l.renewals = be.Uint32(buf[at:])
		l.grantedAt = time.Duration(be.Uint64(buf[at+4:]))
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

// SaveSnapshot writes the replicated state. IStateMachine snapshots block
// Update for their duration; the state is a few dozen bytes per key. A
// halted replica aborts it (dragonboat keeps its last snapshot and log):
// its state is no longer the group's as of its applied index.
func (f *fsm) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, stop <-chan struct{}) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.halted.Load() != nil {
		return sm.ErrSnapshotAborted
	}
	return f.state.save(w, stop)
}

// RecoverFromSnapshot replaces the state. Every held lock is handed to the
// lease heap with its full lease from now on this replica: a restored
// replica may extend a lease, never shorten it. Grants and queue entries
// of this node's requests that the snapshot holds are handed to the node
// (answerRestored), since no Update will report them. A snapshot of a
// version or format this build does not read halts the replica; one it
// reads is the group's whole state, and a halted replica resumes from it.
func (f *fsm) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, stop <-chan struct{}) error {
	state, err := restore(r, stop)
	if err == nil && state.format > logFormatNewest {
		err = fmt.Errorf("%w with log format %d (this build reads %d to %d)", errUnknownSnapshot, state.format, logFormatBase, logFormatNewest)
	}
	if errors.Is(err, errUnknownSnapshot) {
		f.mu.Lock()
		f.halt(0, err)
		f.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	self := f.g.n.cfg.NodeID
	f.mu.Lock()
	if f.halted.Swap(nil) != nil {
		f.g.n.log.Warn().Uint64("group", f.g.shardID).Msg("halted replica resumed from a snapshot this build reads")
	}
	for k, l := range state.locks {
		f.out.leases = append(f.out.leases, leaseRef{key: k, token: l.Token, renewals: l.renewals, lease: seconds(l.leaseSeconds)})
		if l.node == self {
			// Before its queue: a retried duplicate of the holder's own
			// request may wait behind it.
			f.out.answer(answerRestored, k, self, l.id, engine.Result{Outcome: engine.Granted, Token: l.Token})
		}
		for _, w := range l.queue {
			f.out.waits = append(f.out.waits, w.Deadline)
			if w.node == self {
				f.out.answer(answerRestored, k, self, w.id, engine.Result{Outcome: engine.Queued})
			}
		}
	}
	f.state = state
	f.g.logFormat.Store(state.format)
	// As if the snapshot's last dated batch applied now: a new leader
	// here carries over no time from before the restore.
	f.nowAppliedAt = f.clock()
	f.lastDated.Store(&appliedBatch{index: state.clock.dated, at: f.nowAppliedAt, term: state.clock.term, now: state.now})
	f.heap = f.heap[:0]
	f.takeLeases(f.clock())
	f.waitEnds = f.waitEnds[:0]
	f.takeWaits()
	f.restored.Add(1)
	f.mu.Unlock()
	f.deliver()
	return nil
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
