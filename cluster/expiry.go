package cluster

// This file owns lease expiry on this node: stamping the leases applied,
// the leader's proposals of lease ends, leader-change detection, and the
// leader placement it drives.

import (
	"context"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
)

// expiryDue wakes the expiry driver now (it coalesces wake-ups).
func (n *Node) expiryDue() {
	select {
	case n.wakeExpiry <- struct{}{}:
	default:
	}
}

// leaderListener wakes the expiry driver on every leadership change
// dragonboat reports, so that a new leader rebuilds its deadlines and
// proposals in flight go out again at once, not at the next housekeeping
// wake-up. dragonboat calls it from one goroutine that must not block.
type leaderListener struct{ n *Node }

func (l leaderListener) LeaderUpdated(info raftio.LeaderInfo) {
	l.n.obs.leaderUpdated(info)
	l.n.expiryDue()
}

// expiryLoop drives lease expiry. Every replica keeps a deadline heap per
// group (grants are stamped with this process's clock after they apply);
// only the leader acts on it, proposing an expire for each due entry that
// still names the key's current token. A replica that becomes leader
// rebuilds its heap from the replicated table, keeping what it knew. The
// driver sleeps until the earliest of its leader's next deadline, a wake-up
// (expiryDue) and expiryHousekeeping.
func (n *Node) expiryLoop(ctx context.Context) {
	wake := time.NewTimer(0)
	defer wake.Stop()
	var due []expiry
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake.C:
		case <-n.wakeExpiry:
		}
		sleep := expiryHousekeeping
		gatherOn := uint64(0) // group 0's leader, where idle groups gather
		for i, g := range n.groups {
			f := g.fsm.Load()
			if f == nil {
				continue
			}
			leaderID := n.Leader(i)
			if i == 0 {
				gatherOn = leaderID
			}
			if leaderID != 0 && leaderID != g.leaderSeen {
				if g.leaderSeen != 0 {
					close(*g.newLeader.Swap(new(make(chan struct{}))))
				}
				g.prevLeader, g.leaderSeen = g.leaderSeen, leaderID
			}
			leader := leaderID == n.cfg.NodeID
			now := n.clock()
			if leader && !g.wasLeader {
				g.leaderSince = now
			}
			f.mu.Lock()
			f.compactHeap()
			if leader && !g.wasLeader {
				f.rebuild(now)
			}
			if leader {
				due = f.due(now, expireRetry, due[:0])
				if at, ok := f.heap.Next(); ok {
					sleep = min(sleep, at-now)
				}
			}
			if g.placement.due(now) {
				busiest, own := f.takeLoad(n.cfg.NodeID)
				if !n.cfg.FixedLeaders {
					gather := uint64(0)
					if i != 0 && gatherOn != n.cfg.NodeID && len(f.state.locks) == 0 {
						gather = gatherOn
					}
					if to := g.placement.observe(now, leader, busiest, own, gather); to != 0 {
						g.placement.schedule(to, now+time.Duration(n.cfg.HeartbeatRTT)*n.cfg.RTT)
					}
				}
			}
			moveTo, wait := g.placement.handOver(now, leader)
			if wait > 0 {
				sleep = min(sleep, wait)
			}
			f.mu.Unlock()
			g.wasLeader = leader
			if moveTo != 0 {
				n.moveLeader(g, moveTo)
			}
			g.recheckOrphans(now, f)
			if leader {
				g.forgetSilentPeers(now)
			}
			if !g.pastRunsForgotten.Load() && now-g.forgetSentAt > n.cfg.ProposeTimeout {
				g.forgetSentAt = now
				g.forgetPastRuns()
				g.propose()
			}
			if len(due) == 0 {
				continue
			}
			g.mu.Lock()
			for _, e := range due {
				tenant, key := splitLockKey(e.key)
				g.buf = appendLeaseEnd(g.buf, e.token, e.renewals, tenant, key)
				g.count++
			}
			g.mu.Unlock()
			n.stats.expires.Add(uint64(len(due)))
			clear(due)
			g.propose()
		}
		wake.Reset(max(sleep, 0))
	}
}

// moveLeader asks for group g's leadership to pass to node to. Raft only
// hands it over once to has the whole log; until then, and if it fails,
// this node stays leader.
func (n *Node) moveLeader(g *group, to uint64) {
	if err := n.nh.RequestLeaderTransfer(g.shardID, to); err != nil {
		n.log.Debug().Err(err).Uint64("group", g.shardID).Uint64("to", to).Msg("leader transfer not started")
		return
	}
	n.stats.leaderTransfers.Add(1)
	n.log.Info().Uint64("group", g.shardID).Uint64("to", to).Msg("moving group leader toward its load")
}

// forgetSilentPeers is run by g's leader: a peer it has heard nothing from
// for ForgetAfter is taken for dead, and its queued waiters are dropped
// from the group (cmdForget), once until it is heard from again. A peer
// that was only slow loses its waits, answered E unavailable, never a
// lock: the drop only decides who is next in a queue.
//
// Two peers are judged differently. The group's previous leader is taken
// for dead after one election timeout: that silence is what made this
// node leader, so its waiters go in the same batch as the first lease
// ends the new leader proposes, not to the head of a queue a lease later.
// Any other peer's silence counts from when this node became leader at
// the earliest: followers do not talk to each other, and the first pass
// as leader can run before the other voters' answers to its election
// arrive.
func (g *group) forgetSilentPeers(now time.Duration) {
	n := g.n
	electionTimeout := time.Duration(n.cfg.ElectionRTT) * n.cfg.RTT
	for peer, heard := range n.liveness.snapshot() {
		last, limit := time.Duration(heard.Load()), n.cfg.ForgetAfter
		if peer == g.prevLeader {
			limit = min(limit, electionTimeout)
		} else {
			last = max(last, g.leaderSince)
		}
		switch silent := now-last > limit; {
		case !silent:
			delete(g.forgotten, peer)
		case !g.forgotten[peer]:
			g.forgotten[peer] = true
			n.log.Info().Uint64("group", g.shardID).Uint64("peer", peer).Msg("dropping the queued waiters of a silent node")
			g.queueForget(peer)
		}
	}
}

// forgetPastRuns queues the forget of the waiters of this node's earlier
// runs: they wait for nobody. A run's ids start at a random base and stay
// within runIDSpan of it, so the range names this run's ids alone (runs
// overlap with a chance of about runIDSpan in 2^63).
func (g *group) forgetPastRuns() {
	g.mu.Lock()
	g.buf = appendForget(g.buf, g.n.cfg.NodeID, g.n.idFirst, g.n.idFirst+runIDSpan)
	g.count++
	g.mu.Unlock()
	g.dirty.Store(true)
}
