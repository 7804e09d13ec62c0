package cluster

// This file owns the release of grants nobody takes: the waiter's
// connection closed, its wait ended here, it was answered unavailable, or
// the grant is a duplicate.

import (
	"time"
)

// orphan queues the release of a grant nobody waits for; the proposer
// drops the ones no longer current before proposing (a restarted node
// replaying its log finds many such historical grants). It runs on
// dragonboat's apply goroutine and inside Waiter.Resolve (Abandon), so it
// only queues.
func (g *group) orphan(key string, token uint64) {
	g.n.stats.abandoned.Add(1)
	g.mu.Lock()
	g.orphans = append(g.orphans, expiry{key: key, token: token})
	g.mu.Unlock()
	g.propose()
}

// releaseOrphans turns the queued orphans still holding their lock into
// release commands.
func (g *group) releaseOrphans() {
	g.mu.Lock()
	orphans := g.orphans
	g.orphans = nil
	g.mu.Unlock()
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
	g.mu.Lock()
	for _, o := range kept {
		tenant, key := splitLockKey(o.key)
		g.buf = appendRelease(g.buf, g.n.cfg.NodeID, 0, o.token, tenant, key)
		g.count++
		g.releasing = append(g.releasing, orphanCheck{expiry: o, at: checkAt})
	}
	g.mu.Unlock()
}

// orphanCheck is an orphan release to look at again at instant at: if
// its token is still current then, the proposal was most likely given up
// (the group had no leader for the whole propose timeout) and it is
// released again; a duplicate release of a token no longer current is a
// no-op.
type orphanCheck struct {
	expiry
	at time.Duration
}

// recheckOrphans queues again the orphan releases due for a check whose
// lock is still held by the orphaned grant. Run by the expiry driver.
func (g *group) recheckOrphans(now time.Duration, f *fsm) {
	g.mu.Lock()
	n := 0
	for n < len(g.releasing) && g.releasing[n].at <= now {
		n++
	}
	due := g.releasing[:n:n]
	g.releasing = g.releasing[n:]
	g.mu.Unlock()
	if n == 0 {
		return
	}
	f.mu.Lock()
	var again []expiry
	for _, c := range due {
		if f.valid(c.expiry) {
			again = append(again, c.expiry)
		}
	}
	f.mu.Unlock()
	if len(again) == 0 {
		return
	}
	g.mu.Lock()
	g.orphans = append(g.orphans, again...)
	g.mu.Unlock()
	g.propose()
}
