package cluster

// This file owns the clocks: the node's monotonic clock, and a group's
// replicated clock (docs/cluster.md, The group's clock): the stamp a proposer puts on a batch, and the rule by which a
// replica moves the group's time with it. From log format 5 on, only the
// monotonic clock of the node that leads moves time: the leader stamps
// each batch with its Raft term, its id and the elapsed time since its
// leadership began; a replica adopts a new leadership at its first dated
// batch, continuing from the time it had applied plus the time the new
// leader counted since it applied the last dated batch, and moves time to
// base + elapsed within it. A batch that the current leadership did not
// date (built by a follower or by a deposed leader, or in the wall-clock
// form after the format rose) moves no time; what it starts (a lease, a
// renewal, the lease a waiter it queued may be handed) is dated later,
// by the first batch the leader stamps after applying it (origins), and
// its waits are judged at its proposer's estimate of the leader's time.
// No wall clock enters the state machine from format 5 on.

import "time"

// clock is the node's monotonic clock (Config.Clock): leases, waits,
// request deadlines and peer liveness are judged on it.
func (n *Node) clock() time.Duration { return n.cfg.Clock() }

// monotonicClock is the process's monotonic clock from now, the default
// Config.Clock.
func monotonicClock() func() time.Duration {
	start := time.Now()
	return func() time.Duration { return time.Since(start) }
}

// undated is a stamp's elapsed when the proposer did not lead the group.
const undated = -1

// pendingEnd is the end of a lease whose start is not dated yet: it
// holds until a dated batch gives it one.
const pendingEnd = time.Duration(1<<63 - 1)

// stamp is a batch header's time.
type stamp struct {
	// wall is the form of the formats before 5 (batch version 2): the
	// proposer's wall clock, Unix ns.
	wall   int64
	legacy bool
	// From format 5 on (batch version 3): the leadership the proposer
	// knew (Raft term and leader id), the elapsed time of that leadership
	// on the leader's monotonic clock (undated when the proposer did not
	// lead), and the index the leader had applied when it stamped.
	term, leader uint64
	elapsed      time.Duration
	applied      uint64
	// dated is the index of the last dated batch the proposer had
	// applied, sinceDated its monotonic time since it applied it, and
	// datedTerm and datedNow the clock's term and the group's time
	// there: what a new leadership carries over from the one before,
	// and what an undated batch judges waits at.
	dated      uint64
	sinceDated time.Duration
	datedTerm  uint64
	datedNow   time.Duration
}

// leadership is what a proposer knows of its own leadership of a group,
// to stamp its batches: the term it leads in and when (on its monotonic
// clock) it first stamped in that term.
type leadership struct {
	term  uint64
	since time.Duration
}

// stamp dates a batch built at now (the node's monotonic clock) when self
// leads in term, and leaves it undated otherwise. Only differences of the
// elapsed times within one term count (a replica adopts a leadership at
// its first dated batch, continuing its own time), so since may be any
// instant of the leadership that comes before every stamp of it.
//
// applied is the index this node had applied, and dated the last dated
// batch among them.
func (l *leadership) stamp(term, leader, self uint64, now time.Duration, applied uint64, dated appliedBatch) stamp {
	st := stamp{term: term, leader: leader, elapsed: undated, applied: applied,
		dated: dated.index, sinceDated: max(now-dated.at, 0), datedTerm: dated.term, datedNow: dated.now}
	if leader != self || term == 0 {
		return st
	}
	if l.term != term {
		l.term, l.since = term, now
	}
	st.elapsed = now - l.since
	return st
}

// appliedBatch is a dated batch as a replica applied it: its index, the
// node's clock then, and the clock's term and the group's time after it.
type appliedBatch struct {
	index uint64
	at    time.Duration
	term  uint64
	now   time.Duration
}

// groupClock is a group's replicated clock, part of the replicated state.
type groupClock struct {
	// term and leader are the leadership that dates batches now; base is
	// the group's time at its elapsed 0; dated is the index of the last
	// dated batch.
	term, leader uint64
	base         time.Duration
	dated        uint64
	// pending are the keys holding a lease or waiter whose start waits
	// for a dated batch, with the index of the batch that started it.
	pending []pendingStart
}

type pendingStart struct {
	origin uint64
	key    string
}

// batchTime is how the batch being applied relates to the clock.
type batchTime struct {
	index uint64
	dated bool
	// waitNow is the time waits are judged at: the group's time, or for
	// an undated batch its proposer's estimate of the leader's, the time
	// at the last dated batch it applied plus its own time since (when
	// that batch is of the clock's leadership), which is never behind
	// the group's time nor ahead of the leader's. A wait only ends a
	// waiter's claim to a handoff, so its end may come about a commit
	// early or late, never a lease's.
	waitNow time.Duration
}

// origin is what a lease or waiter started by the batch being applied
// records: 0 when the batch is dated (its start is the group's time),
// else the batch's index, which a later dated batch resolves.
func (b batchTime) origin() uint64 {
	if b.dated {
		return 0
	}
	return b.index
}

// date moves the group's time by the batch at index stamped st and
// resolves the starts it dates; it sets s.batch for the commands of the
// batch.
func (s *replicated) date(st stamp, index uint64, out *applied) {
	dated := false
	switch {
	case st.legacy:
		// The wall-clock form: the rule of the formats before 5, as their
		// builds apply it. Once the format rose it moves no time, since a
		// wall clock may run ahead of the leadership's time.
		if s.format < logFormat5 {
			s.now = max(s.now, time.Duration(st.wall))
			dated = true
		}
	case st.elapsed < 0:
	case st.term > s.clock.term:
		// A new leadership: time goes on from where it stood, plus what
		// the new leader counted since it applied the last dated batch —
		// if that is the last one here too (a batch of the term before
		// may apply after the new leader stamped) — so it stands still
		// at most from the last dated batch to the new leader's apply of
		// it.
		if st.dated == s.clock.dated {
			s.now += st.sinceDated
		}
		s.clock.term, s.clock.leader = st.term, st.leader
		s.clock.base = s.now - st.elapsed
		dated = true
	case st.term == s.clock.term && st.leader == s.clock.leader:
		s.now = max(s.now, s.clock.base+st.elapsed)
		dated = true
	}
	s.batch = batchTime{index: index, dated: dated, waitNow: s.now}
	if !dated && !st.legacy && st.datedTerm == s.clock.term && st.dated != 0 {
		s.batch.waitNow = max(s.now, st.datedNow+st.sinceDated)
	}
	if dated {
		s.clock.dated = index
	}
	if dated && !st.legacy && len(s.clock.pending) > 0 {
		s.resolve(st.applied, out)
	}
}

// resolve dates the starts of the batches up to applied: the leader had
// applied them before it stamped the batch being applied, so their
// requests were sent before s.now. A waiter's arrival moves there too:
// the group's time of its undated batch may stand long before its
// receipt, and waited_ms counted from it would carry its client's
// validity bound past the lease.
func (s *replicated) resolve(applied uint64, out *applied) {
	kept := s.clock.pending[:0]
	for _, p := range s.clock.pending {
		if p.origin > applied {
			kept = append(kept, p)
			continue
		}
		l := s.locks[p.key]
		if l == nil {
			continue
		}
		if l.origin != 0 && l.origin <= applied {
			l.origin = 0
			l.End = s.now + seconds(l.leaseSeconds)
			out.leases = append(out.leases, leaseRef{key: p.key, token: l.Token, renewals: l.renewals, lease: seconds(l.leaseSeconds)})
		}
		for i := range l.queue {
			// The group's time here is the first known to come after the
			// waiter's receipt: its wait counts for waited_ms from here.
			if w := &l.queue[i]; w.origin != 0 && w.origin <= applied {
				w.origin, w.Arrived = 0, s.now
			}
		}
	}
	clear(s.clock.pending[len(kept):])
	s.clock.pending = kept
}

// started records that l, the lock of k, got a lease (a grant or a
// renewal) at s.now whose start is origin's to date: a lease started in
// an undated batch holds until a dated batch resolves it.
func (s *replicated) started(k string, l *lockState, origin uint64, out *applied) {
	l.origin = origin
	if origin == 0 {
		out.leases = append(out.leases, leaseRef{key: k, token: l.Token, renewals: l.renewals, lease: seconds(l.leaseSeconds)})
		return
	}
	l.End = pendingEnd
	s.clock.pending = append(s.clock.pending, pendingStart{origin: origin, key: k})
}

// queuedAt records a waiter queued by the batch being applied: the
// origin of the lease a handoff gives it.
func (s *replicated) queuedAt(k string) uint64 {
	origin := s.batch.origin()
	if origin != 0 {
		s.clock.pending = append(s.clock.pending, pendingStart{origin: origin, key: k})
	}
	return origin
}

// rebuildPending lists the pending starts of a restored state: one entry
// for each, as started and queuedAt add them.
func (s *replicated) rebuildPending() {
	s.clock.pending = nil
	for k, l := range s.locks {
		if l.origin != 0 {
			s.clock.pending = append(s.clock.pending, pendingStart{origin: l.origin, key: k})
		}
		for _, w := range l.queue {
			if w.origin != 0 {
				s.clock.pending = append(s.clock.pending, pendingStart{origin: w.origin, key: k})
			}
		}
	}
}
