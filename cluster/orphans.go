package cluster

// This file owns the release of grants nobody takes: the waiter's
// connection closed, its wait ended here, it was answered unavailable, or
// the grant is a duplicate.

import (
	"sync"
	"time"
)

// orphanQueue holds a group's grants to release. Its mu is taken after
// the group's fsm.mu (the housekeeping step), never before it.
type orphanQueue struct {
	mu      sync.Mutex
	pending []leaseRef // grants to release, current or not
	// releasing are the releases proposed, checked again at their
	// instant in case their proposal was given up (due).
	releasing []orphanCheck
}

// orphanCheck is an orphan release to look at again at instant at: if
// its token is still current then, the proposal was most likely given up
// (the group had no leader for the whole propose timeout) and it is
// released again; a duplicate release of a token no longer current is a
// no-op.
type orphanCheck struct {
	leaseRef
	at time.Duration
}

func (q *orphanQueue) add(grants ...leaseRef) {
	q.mu.Lock()
	q.pending = append(q.pending, grants...)
	q.mu.Unlock()
}

func (q *orphanQueue) take() []leaseRef {
	q.mu.Lock()
	defer q.mu.Unlock()
	grants := q.pending
	q.pending = nil
	return grants
}

// due returns the releases whose check falls at now or before.
func (q *orphanQueue) due(now time.Duration) []leaseRef {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(q.releasing) && q.releasing[n].at <= now {
		n++
	}
	due := make([]leaseRef, n)
	for i, c := range q.releasing[:n] {
		due[i] = c.leaseRef
	}
	q.releasing = q.releasing[n:]
	return due
}

// orphan queues the release of a grant nobody waits for; the proposer
// drops the ones no longer current before proposing (a restarted node
// replaying its log finds many such historical grants). It runs on
// dragonboat's apply goroutine and inside Waiter.Resolve (Abandon), so it
// only queues.
func (g *group) orphan(key string, token uint64) {
	g.n.stats.abandoned.Add(1)
	g.orphans.add(leaseRef{key: key, token: token})
	g.propose()
}

// releaseOrphans turns the queued orphans still holding their lock into
// release commands, each checked again later (due).
func (g *group) releaseOrphans() {
	orphans := g.orphans.take()
	if len(orphans) == 0 {
		return
	}
	f := g.fsm.Load()
	kept := orphans[:0]
	f.mu.Lock()
	for _, o := range orphans {
		if f.valid(o) {
			kept = append(kept, o)
		}
	}
	f.mu.Unlock()
	if len(kept) == 0 {
		return
	}
	g.n.stats.orphanReleases.Add(uint64(len(kept)))
	// A batch may wait up to a propose timeout for a free slot, then be
	// proposed for another one.
	checkAt := g.n.clock() + 2*g.n.cfg.ProposeTimeout + g.n.cfg.AttemptTimeout
	g.orphans.mu.Lock()
	for _, o := range kept {
		g.orphans.releasing = append(g.orphans.releasing, orphanCheck{leaseRef: o, at: checkAt})
	}
	g.orphans.mu.Unlock()
	for _, o := range kept {
		tenant, key := splitLockKey(o.key)
		g.queue(func(b []byte) []byte { return appendRelease(b, g.n.cfg.NodeID, 0, o.token, tenant, key) })
	}
}
