package cluster

// This file owns a group's housekeeping: the periodic pass that ends the
// leases due on the leader's heap, asks for dated batches, places the
// leadership, drops the silent peers' and this node's earlier runs'
// waiters, and rechecks orphan releases. The pass is a step: given the
// time and what the loop observed, it returns an outbox of commands to
// propose and actions to carry out (etcd raft's Ready); only the loop
// reads the clock, asks dragonboat and sends.

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	"github.com/lockd/lockd/cluster/placement"
)

// housekeeper is one group's housekeeping state on this node. Only the
// housekeeping loop touches it, through step; pastRunsForgotten is also
// set by the apply of this run's forget (deliver).
type housekeeper struct {
	wasLeader   bool
	leaderSeen  uint64        // the group's leader at the last pass
	prevLeader  uint64        // the leader before leaderSeen
	leaderSince time.Duration // when this node last became leader
	forgotten   map[uint64]bool
	// pastRunsForgotten is set once this run's forget of its earlier
	// runs' waiters has applied; until then the step proposes it again
	// every propose timeout (a proposal can be given up while the
	// restarted node catches up).
	pastRunsForgotten atomic.Bool
	forgetSentAt      time.Duration
	// lastPass is the instant of the pass before; awakeSince is when
	// this node last came back from a pause of its own (see step).
	lastPass, awakeSince time.Duration
	placement            placement.Policy
	due                  []leaseRef // scratch: the lease ends of one pass
}

// observed is what the loop read for one group's step besides the clock:
// the group's leader as this node sees it (0 when unknown), the node idle
// groups gather on (group 0's leader), and when each peer was last heard.
type observed struct {
	leader, gatherOn uint64
	heard            map[uint64]time.Duration
}

// outbox is what one step decided for a group: the loop carries it out.
type outbox struct {
	commands [][]byte      // encoded commands, appended to the group's next batch
	wake     time.Duration // the group wants the next pass within this
	// stamp asks the proposer for a dated batch even with no command.
	stamp bool
	// resend: the group's leader changed; this node's proposals in
	// flight go out again at once (watch).
	resend bool
	// holdProposals: a hand-over was decided; the group's proposals wait
	// (holdProposals) until it is asked for, handOverHold later, and done.
	holdProposals bool
	// moveLeaderTo asks for the leadership to pass to this node.
	moveLeaderTo uint64
	// handOverGivenUp: a hand-over this leader asked for ended without a
	// new leader; the loop sends the group's other voters a send-again
	// (resendProposals), since this leader dropped their proposals
	// meanwhile.
	handOverGivenUp bool
	orphans         []leaseRef // orphan releases to send again
	forgot          []uint64   // silent peers whose waiters the commands drop
	leaseEnds       int        // lease ends among the commands
}

// housekeepingInterval bounds how long the loop sleeps: it wakes at the
// next lease deadline or wait end a step asked for and when a group's
// leader changes, and at least this often for what is judged by elapsed
// time (silent peers, leader placement, orphan rechecks, and leases
// applied since, which last at least a second). A short fixed tick
// instead costs an idle cluster much of its CPU (docs/cluster.md,
// Performance).
const housekeepingInterval = 250 * time.Millisecond

// expireRetry re-arms a due lease whose lease end proposal may be lost.
const expireRetry = 500 * time.Millisecond

// step makes one pass's decisions for g at now. It reads no clock, asks
// dragonboat nothing and sends nothing, so tests drive it on a fake clock
// without a NodeHost (testdata/housekeeping.txt).
func (g *group) step(now time.Duration, obs observed) outbox {
	h, cfg := &g.house, &g.n.cfg
	out := outbox{wake: housekeepingInterval}
	// Passes come at least every housekeepingInterval. A gap of an
	// election timeout beyond that means this process did not run
	// (stopped, paused, starved): it heard nothing meanwhile through no
	// silence of its peers.
	if h.lastPass != 0 && now-h.lastPass > housekeepingInterval+time.Duration(cfg.ElectionRTT)*cfg.RTT {
		h.awakeSince = now
	}
	h.lastPass = now
	if obs.leader != 0 && obs.leader != h.leaderSeen {
		out.resend = h.leaderSeen != 0
		h.prevLeader, h.leaderSeen = h.leaderSeen, obs.leader
	}
	leader := obs.leader == cfg.NodeID
	becameLeader := leader && !h.wasLeader
	if becameLeader {
		h.leaderSince = now
	}
	h.wasLeader = leader
	g.leading.Store(leader)
	f := g.fsm.Load()
	f.mu.Lock()
	f.compactHeap()
	if becameLeader {
		f.rebuild(now)
	}
	// A start this leader has not dated yet, or a wait that ended: a
	// dated batch moves the group's time (clock.go).
	out.stamp = f.waitEnded(now) && leader || leader && len(f.state.clock.pending) > 0
	if at, ok := f.waitEnds.Next(); ok {
		out.wake = min(out.wake, at-now)
	}
	if leader {
		h.due = f.due(now, expireRetry, h.due[:0])
		if at, ok := f.heap.Next(); ok {
			out.wake = min(out.wake, at-now)
		}
	}
	if h.placement.Due(now) {
		busiest, own := f.takeLoad(cfg.NodeID)
		if !cfg.FixedLeaders {
			gather := uint64(0)
			if g.idx != 0 && obs.gatherOn != cfg.NodeID && len(f.state.locks) == 0 {
				gather = obs.gatherOn
			}
			if to := h.placement.Observe(now, leader, busiest, own, gather); to != 0 {
				h.placement.Schedule(to, now+cfg.handOverHold())
				out.holdProposals = true
			}
		}
	}
	for _, c := range g.orphans.due(now) {
		if f.valid(c) {
			out.orphans = append(out.orphans, c)
		}
	}
	f.mu.Unlock()
	moveTo, wait := h.placement.HandOver(now, leader)
	if wait > 0 {
		out.wake = min(out.wake, wait)
	}
	givenUp, wait := h.placement.GivenUp(now, leader, cfg.handOverPending())
	if wait > 0 {
		out.wake = min(out.wake, wait)
	}
	if moveTo != 0 {
		h.placement.Asked(now)
	}
	out.moveLeaderTo, out.handOverGivenUp = moveTo, givenUp
	if leader {
		out.forgot = h.silentPeers(now, obs.heard, cfg)
		for _, peer := range out.forgot {
			out.commands = append(out.commands, appendForget(nil, peer, 1, 0))
		}
	}
	if !h.pastRunsForgotten.Load() && now-h.forgetSentAt > cfg.ProposeTimeout {
		h.forgetSentAt = now
		out.commands = append(out.commands, g.n.pastRunsForget())
	}
	for _, e := range h.due {
		tenant, key := splitLockKey(e.key)
		out.commands = append(out.commands, appendLeaseEnd(nil, tenant, key))
	}
	out.leaseEnds = len(h.due)
	clear(h.due)
	return out
}

// silentPeers is the silent-peer rule, run by the group's leader: a peer
// it has heard nothing from for ForgetAfter is taken for dead, and its
// queued waiters are dropped from the group (cmdForget), once until it
// is heard from again. A peer that was only slow loses its waits,
// answered E unavailable, never a lock it was given: no node takes back
// a grant on a judgement (only the requester's ABANDON, or the lease,
// ends a grant nobody releases). It returns the peers to forget now.
//
// Two peers are judged differently. The group's previous leader is taken
// for dead after one election timeout: that silence is what made this
// node leader, so its waiters go in the same batch as the first lease
// ends the new leader proposes, not to the head of a queue a lease later.
// Any other peer's silence counts from when this node became leader at
// the earliest: followers do not talk to each other, and the first pass
// as leader can run before the other voters' answers to its election
// arrive. And no peer's silence counts while this node itself did not
// run: a leader back from a stop still takes itself for leader at its
// first pass, and its judgement of peers it could not hear, proposed
// again to the leader elected meanwhile, would drop the waiters of the
// nodes that went on without it.
func (h *housekeeper) silentPeers(now time.Duration, heard map[uint64]time.Duration, cfg *Config) (forget []uint64) {
	electionTimeout := time.Duration(cfg.ElectionRTT) * cfg.RTT
	for peer, last := range heard {
		last = max(last, h.awakeSince)
		limit := cfg.ForgetAfter
		if peer == h.prevLeader {
			limit = min(limit, electionTimeout)
		} else {
			last = max(last, h.leaderSince)
		}
		if now-last <= limit {
			delete(h.forgotten, peer)
			continue
		}
		if !h.forgotten[peer] {
			h.forgotten[peer] = true
			forget = append(forget, peer)
		}
	}
	slices.Sort(forget)
	return forget
}

// pastRunsForget is the forget of the waiters of this node's earlier
// runs: they wait for nobody. A run's ids start at a random base and stay
// within runIDSpan of it, so the range names this run's ids alone (runs
// overlap with a chance of about runIDSpan in 2^63).
func (n *Node) pastRunsForget() []byte {
	return appendForget(nil, n.cfg.NodeID, n.idFirst, n.idFirst+runIDSpan)
}

// handOverHold is how long a leader holds a group's proposals before it
// asks for a hand-over: two heartbeats, for the last proposals to commit
// and the followers to learn of the commit and apply it
// (handOverLeadership).
func (c *Config) handOverHold() time.Duration {
	return time.Duration(2*c.HeartbeatRTT) * c.RTT
}

// handOverPending is the longest Raft keeps a leader's hand-over pending:
// one election timeout, and a tick for the leader to notice.
func (c *Config) handOverPending() time.Duration {
	return time.Duration(c.ElectionRTT+1) * c.RTT
}

// wakeHousekeeping wakes the housekeeping loop now (it coalesces
// wake-ups).
func (n *Node) wakeHousekeeping() {
	select {
	case n.housekeepingDue <- struct{}{}:
	default:
	}
}

// leaderListener wakes the housekeeping loop on every leadership change
// dragonboat reports, so that a new leader rebuilds its deadlines and
// proposals in flight go out again at once, not at the next pass.
// dragonboat calls it from one goroutine that must not block.
type leaderListener struct{ n *Node }

func (l leaderListener) LeaderUpdated(info raftio.LeaderInfo) {
	l.n.obs.leaderUpdated(info)
	l.n.wakeHousekeeping()
}

// housekeepingLoop reads the clock and each group's leader, calls the
// group's step, and carries out its outbox. It sleeps until the earliest
// wake-up a step asked for, a wake-up (a leader change), or
// housekeepingInterval.
func (n *Node) housekeepingLoop(ctx context.Context) {
	wake := time.NewTimer(0)
	defer wake.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake.C:
		case <-n.housekeepingDue:
		}
		sleep := housekeepingInterval
		obs := observed{heard: n.liveness.heardAt()}
		for i, g := range n.groups {
			if g.fsm.Load() == nil {
				continue
			}
			obs.leader = n.Leader(i)
			if i == 0 {
				obs.gatherOn = obs.leader
			}
			out := g.step(n.clock(), obs)
			sleep = min(sleep, out.wake)
			n.carryOut(g, &out)
		}
		wake.Reset(max(sleep, 0))
	}
}

// carryOut does what a step decided for g.
func (n *Node) carryOut(g *group, out *outbox) {
	if out.resend {
		g.sendAgain()
	}
	if out.holdProposals {
		n.holdProposals(g)
	}
	if out.moveLeaderTo != 0 {
		n.moveLeader(g, out.moveLeaderTo)
	}
	if out.handOverGivenUp {
		n.resendProposals(g)
	}
	for _, peer := range out.forgot {
		n.log.Info().Uint64("group", g.shardID).Uint64("peer", peer).Msg("dropping the queued waiters of a silent node")
	}
	if len(out.orphans) > 0 {
		g.orphans.add(out.orphans...)
		g.propose()
	}
	for _, c := range out.commands {
		g.queue(func(b []byte) []byte { return append(b, c...) })
	}
	n.stats.expires.Add(uint64(out.leaseEnds))
	if out.stamp {
		g.needStamp.Store(true)
	}
	if len(out.commands) > 0 || out.stamp {
		g.propose()
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
