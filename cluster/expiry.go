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
// only the leader acts on it, proposing a lease end for each due entry
// that still names the key's current token. The loop only reads the clock
// and each group's leader, hands them to the group's step (expiryStep,
// where every decision is made) and carries out what the step asks for.
// It sleeps until the earliest wake-up a step asked for, a wake-up
// (expiryDue: a leader change) and expiryHousekeeping.
func (n *Node) expiryLoop(ctx context.Context) {
	wake := time.NewTimer(0)
	defer wake.Stop()
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
			if g.fsm.Load() == nil {
				continue
			}
			view := n.leaderView(i)
			if i == 0 {
				gatherOn = view.leader
			}
			step := g.expiryStep(n.clock(), view, gatherOn)
			sleep = min(sleep, step.wake)
			if step.moveTo != 0 {
				n.moveLeader(g, step.moveTo)
			}
			if step.handOverGivenUp {
				n.resendProposals(g)
			}
			if step.propose {
				g.propose()
			}
		}
		wake.Reset(max(sleep, 0))
	}
}

// leaderView is a node's view of one group's leadership: the leader (0
// when unknown) and its Raft term.
type leaderView struct{ leader, term uint64 }

func (n *Node) leaderView(idx int) leaderView {
	id, term, ok, err := n.nh.GetLeaderID(n.groups[idx].shardID)
	if err != nil || !ok {
		return leaderView{}
	}
	return leaderView{leader: id, term: term}
}

// expiryStep is what one pass of the expiry driver decided for a group:
// the commands it queued in the group's batch are proposed when propose
// is set.
type expiryStep struct {
	wake   time.Duration // the group wants the next pass within this
	moveTo uint64        // ask for the leadership to pass to this node
	// handOverGivenUp: a hand-over this leader asked for ended without a
	// new leader; the followers' proposals it dropped meanwhile must go
	// out again (resendProposals).
	handOverGivenUp bool
	propose         bool
}

// expiryStep makes one pass's decisions for g at now, given its leader as
// this node sees it and the node idle groups gather on: leader-change
// tracking, the lease ends due on this leader's heap, placement, orphan
// rechecks, the silent peers' waiters, and the forget of this node's
// earlier runs. It
// reads no clock and asks dragonboat nothing, so tests drive it on a fake
// clock without a NodeHost.
func (g *group) expiryStep(now time.Duration, view leaderView, gatherOn uint64) expiryStep {
	n := g.n
	step := expiryStep{wake: expiryHousekeeping}
	// Passes come at least every expiryHousekeeping. A gap of an election
	// timeout means this process did not run (stopped, paused, starved):
	// it heard nothing meanwhile through no silence of its peers.
	if g.lastPass != 0 && now-g.lastPass > n.electionTimeout() {
		g.awakeSince = now
	}
	g.lastPass = now
	g.noteLeader(view.leader)
	leader := view.leader == n.cfg.NodeID
	becameLeader := leader && !g.wasLeader
	if becameLeader {
		g.leaderSince = now
	}
	g.leading.Store(leader)
	f := g.fsm.Load()
	f.mu.Lock()
	f.compactHeap()
	if becameLeader {
		f.rebuild(now)
	}
	g.due = g.due[:0]
	// A start this leader has not dated yet, or a wait that ended: a
	// dated batch moves the group's time (clock.go).
	if f.waitEnded(now) && leader || leader && len(f.state.clock.pending) > 0 {
		g.needStamp.Store(true)
		step.propose = true
	}
	if at, ok := f.waitEnds.Next(); ok {
		step.wake = min(step.wake, at-now)
	}
	if leader {
		g.due = f.due(now, expireRetry, g.due)
		if at, ok := f.heap.Next(); ok {
			step.wake = min(step.wake, at-now)
		}
	}
	if g.placement.due(now) {
		busiest, own := f.takeLoad(n.cfg.NodeID)
		if !n.cfg.FixedLeaders {
			gather := uint64(0)
			if g.idx != 0 && gatherOn != n.cfg.NodeID && len(f.state.locks) == 0 {
				gather = gatherOn
			}
			if to := g.placement.observe(now, leader, busiest, own, gather); to != 0 {
				g.placement.schedule(to, now+time.Duration(n.cfg.HeartbeatRTT)*n.cfg.RTT)
			}
		}
	}
	moveTo, wait := g.placement.handOver(now, leader)
	if wait > 0 {
		step.wake = min(step.wake, wait)
	}
	givenUp, wait := g.placement.givenUp(now, leader, n.handOverPending())
	if wait > 0 {
		step.wake = min(step.wake, wait)
	}
	if moveTo != 0 {
		g.placement.asked(now)
	}
	f.mu.Unlock()
	g.wasLeader = leader
	step.moveTo, step.handOverGivenUp = moveTo, givenUp
	g.recheckOrphans(now, f)
	if leader && g.forgetSilentPeers(now) {
		step.propose = true
	}
	if !g.pastRunsForgotten.Load() && now-g.forgetSentAt > n.cfg.ProposeTimeout {
		g.forgetSentAt = now
		g.forgetPastRuns()
		step.propose = true
	}
	if len(g.due) > 0 {
		for _, e := range g.due {
			tenant, key := splitLockKey(e.key)
			g.queue(func(b []byte) []byte { return appendLeaseEnd(b, tenant, key) })
		}
		n.stats.expires.Add(uint64(len(g.due)))
		clear(g.due)
		step.propose = true
	}
	return step
}

// noteLeader tracks g's leader as the driver sees it: a change releases
// the proposals in flight to go out again at once (watch), and the leader
// before it is remembered for the silent-peer rule.
func (g *group) noteLeader(leaderID uint64) {
	if leaderID == 0 || leaderID == g.leaderSeen {
		return
	}
	if g.leaderSeen != 0 {
		g.sendAgain()
	}
	g.prevLeader, g.leaderSeen = g.leaderSeen, leaderID
}

// electionTimeout is the shortest a follower waits for its leader
// before it campaigns.
func (n *Node) electionTimeout() time.Duration {
	return time.Duration(n.cfg.ElectionRTT) * n.cfg.RTT
}

// handOverPending is the longest Raft keeps a leader's hand-over pending:
// one election timeout, and a tick for the leader to notice.
func (n *Node) handOverPending() time.Duration {
	return time.Duration(n.cfg.ElectionRTT+1) * n.cfg.RTT
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
// lock it was given: no node takes back a grant on a judgement (only
// the requester's ABANDON, or the lease, ends a grant nobody releases).
// It reports whether it queued commands.
//
// Two peers are judged differently. The group's previous leader is taken
// for dead after one election timeout: that silence is what made this
// node leader, so its waiters go in the same batch as the first lease
// ends the new leader proposes, not to the head of a queue a lease later.
// Any other peer's silence counts from when this node became leader at
// the earliest: followers do not talk to each other, and the first pass
// as leader can run before the other voters' answers to its election
// arrive. And no peer's silence counts while this node itself did not
// run: a leader resumed from a stop still takes itself for leader at its
// first pass, and its judgement of peers it could not hear would drop
// the waiters of the nodes that went on without it.
func (g *group) forgetSilentPeers(now time.Duration) (queued bool) {
	n := g.n
	for peer, heard := range n.liveness.snapshot() {
		last, limit := max(time.Duration(heard.Load()), g.awakeSince), n.cfg.ForgetAfter
		if peer == g.prevLeader {
			limit = min(limit, n.electionTimeout())
		} else {
			last = max(last, g.leaderSince)
		}
		if now-last <= limit {
			delete(g.forgotten, peer)
			continue
		}
		if !g.forgotten[peer] {
			g.forgotten[peer] = true
			n.log.Info().Uint64("group", g.shardID).Uint64("peer", peer).Msg("dropping the queued waiters of a silent node")
			g.queueForget(peer)
			queued = true
		}
	}
	return queued
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
