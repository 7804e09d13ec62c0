package cluster

// This file owns a group's proposer: group commit of the commands the
// event loops queued, the proposal slots, retries and leader-change
// re-sends.

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/valyala/bytebufferpool"
)

// proposalBuffers recycles proposals' bytes. A proposal's buffer is in use
// until its slot is freed, since watch and send propose the same bytes
// again after a drop, a timeout or a leader change (dragonboat copies a
// command into its entry, so nothing of it outlives the slot); the pool
// also drops buffers far above the usual batch, so one burst does not
// pin its memory.
var proposalBuffers bytebufferpool.Pool

// group is this node's side of one Raft group: its replica, its
// proposer, its orphan releases and its housekeeping.
type group struct {
	n       *Node
	idx     int
	shardID uint64
	maxKeys int
	fsm     atomic.Pointer[fsm]
	// logFormat is the group's log format as this replica last applied
	// it, for the writers of format-4 commands on the request path.
	logFormat atomic.Uint32
	// leading is whether this node led the group at the housekeeping
	// step's last pass (for the hold-time metric and the stamp requests).
	leading atomic.Bool

	proposer
	orphans orphanQueue
	house   housekeeper
}

// proposer is a group's batch in the making and its proposals in flight.
type proposer struct {
	// mu guards buf, count, lead and out; it is held alone (package
	// comment): stamp reads the replica through atomics.
	mu    sync.Mutex
	buf   []byte // header space (datedHeaderLen) + commands not yet proposed
	count uint32
	lead  leadership // this node's leadership, to stamp batches
	// needStamp asks the proposer for a dated batch even with no command:
	// a lease or wait started in an undated batch waits for one.
	needStamp atomic.Bool
	dirty     atomic.Bool
	kick      chan struct{}
	// slots bounds this node's proposals in flight for the group: while
	// they are all out, new commands gather into the next batch. A second
	// proposal only goes out beside the first when pipelineMin commands
	// wait; freed signals a slot coming back.
	slots chan struct{}
	freed chan struct{}
	// out holds the proposals whose slots are held: the apply of one
	// frees its slot at once (appliedOwn), not when its watcher hears of
	// the result, after the answers it carried were delivered and the
	// next requests may have found no slot free.
	out []*bytebufferpool.ByteBuffer
	// holdBy and holdUntil are a draining leader's request that this
	// node start no proposal of g until then, or until another node
	// leads (peerHold): the leader's hand-over needs a log at rest.
	holdBy    atomic.Uint64
	holdUntil atomic.Int64 // the node's clock
	// newLeader is closed, and replaced, when the group's leader changes:
	// proposals in flight then go out again at once (see watch).
	newLeader atomic.Pointer[chan struct{}]
}

// leader is this node's view of g's leader (0 when unknown).
func (g *group) leader() uint64 {
	id, _, ok, err := g.n.nh.GetLeaderID(g.shardID)
	if err != nil || !ok {
		return 0
	}
	return id
}

func (g *group) waitingCommands() uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count
}

// propose wakes the group's proposer.
func (g *group) propose() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// take swaps out the commands gathered so far as one stamped proposal,
// in a buffer from proposalBuffers; the next batch gathers in the storage
// of a recycled one. A batch of no command goes out only when the group's
// clock asked for a dated batch (needStamp) and this node can date one.
func (g *group) take() *bytebufferpool.ByteBuffer {
	g.dirty.Store(false)
	g.mu.Lock()
	defer g.mu.Unlock()
	stampOnly := g.count == 0
	if stampOnly && !g.needStamp.Swap(false) {
		return nil
	}
	batch := g.buf
	if g.logFormat.Load() >= logFormat5 {
		st := g.stamp()
		if stampOnly && st.elapsed == undated {
			return nil
		}
		putDatedHeader(batch, st, g.count)
	} else {
		if stampOnly {
			return nil
		}
		// The wall-clock form, which the builds of the formats before 5
		// apply (clock.go): in the room the dated header would take.
		batch = batch[datedHeaderLen-headerLen:]
		putHeader(batch, g.n.cfg.wall().UnixNano(), g.count)
	}
	b := proposalBuffers.Get()
	b.B, g.buf = batch, append(b.B[:0], make([]byte, datedHeaderLen)...)
	g.count = 0
	g.out = append(g.out, b)
	return b
}

// stamp dates a batch taken now (clock.go); called with g.mu held.
func (g *group) stamp() stamp {
	n := g.n
	leader, term, ok, err := n.nh.GetLeaderID(g.shardID)
	if err != nil || !ok {
		return stamp{elapsed: undated}
	}
	var applied uint64
	var dated appliedBatch
	if f := g.fsm.Load(); f != nil {
		applied = f.appliedIndex.Load()
		dated = *f.lastDated.Load()
	}
	return g.lead.stamp(term, leader, n.cfg.NodeID, n.clock(), applied, dated)
}

// done ends proposal b: its buffer goes back to the pool, and its slot
// too, unless its apply freed it already.
func (g *group) done(b *bytebufferpool.ByteBuffer) {
	g.mu.Lock()
	i := slices.Index(g.out, b)
	if i >= 0 {
		g.out = slices.Delete(g.out, i, i+1)
	}
	g.mu.Unlock()
	proposalBuffers.Put(b)
	if i >= 0 {
		g.freeSlot()
	}
}

// appliedOwn frees the slot of the proposal of this node whose bytes cmd
// are, if any: it has applied, whatever its watcher hears later (a retry
// of it then goes out without a slot, and changes nothing).
func (g *group) appliedOwn(cmd []byte) {
	g.mu.Lock()
	i := slices.IndexFunc(g.out, func(b *bytebufferpool.ByteBuffer) bool { return bytes.Equal(b.B, cmd) })
	if i >= 0 {
		g.out = slices.Delete(g.out, i, i+1)
	}
	g.mu.Unlock()
	if i >= 0 {
		g.freeSlot()
	}
}

// freeSlot gives a proposal slot back; the proposer is told when commands
// wait for it. When none wait, the next event loop to flush finds the
// slot free and proposes itself (proposeFromLoop).
func (g *group) freeSlot() {
	<-g.slots
	if g.waitingCommands() == 0 {
		return
	}
	select {
	case g.freed <- struct{}{}:
	default:
	}
}

// proposeFromLoop proposes what the event loops gathered for g from the
// calling loop itself when no proposal of g is out and g has a leader:
// handing each commit to the proposer goroutine costs a wake-up, a
// context switch, on its path. Otherwise the proposer decides
// (the next batch gathers behind the one out; no leader means retries),
// and so it does for an attempt refused here, on a goroutine of its own,
// since a loop must not wait.
func (g *group) proposeFromLoop() {
	if g.n.ctx.Err() != nil {
		return // closing: the proposer has stopped too
	}
	select {
	case g.slots <- struct{}{}:
	default:
		g.propose()
		return
	}
	if len(g.slots) > 1 || g.leader() == 0 || g.held() > 0 {
		<-g.slots
		g.propose()
		return
	}
	b := g.take()
	if b == nil {
		<-g.slots
		return
	}
	n := g.n
	deadline := time.Now().Add(n.cfg.ProposeTimeout)
	if g.proposeOnce(n.ctx, b, deadline) == nil {
		return
	}
	n.stats.proposeRetries.Add(1)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if !g.send(n.ctx, b, deadline) {
			g.done(b)
		}
	}()
}

// proposeLoop turns whatever accumulated since the last proposal into the
// next one. Proposals are asynchronous, so while one is in flight the next
// batch gathers: one Raft entry carries many requests under load.
func (g *group) proposeLoop(ctx context.Context) {
	n := g.n
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		case <-g.freed: // commands held back while a proposal was out
		}
		g.releaseOrphans()
		for {
			select {
			case g.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			if len(g.slots) > 1 && g.waitingCommands() < pipelineMin {
				// One proposal is out and few commands wait: let them
				// gather until it completes (or more arrive).
				<-g.slots
				select {
				case <-g.freed:
					continue
				case <-g.kick:
					g.releaseOrphans()
					continue
				case <-ctx.Done():
					return
				}
			}
			b := g.take()
			if b == nil {
				<-g.slots // nothing to do: no signal, or this loop would spin
				break
			}
			if !g.send(ctx, b, time.Now().Add(n.cfg.ProposeTimeout)) {
				g.done(b)
			}
		}
	}
}

// send proposes b until it is applied or deadline passes, retrying when
// the group did not take it (busy, no leader yet, dropped) and when an
// attempt timed out (e.g. it was forwarded to a leader that just died).
// Retrying a proposal that may also have been applied is safe: every
// command is idempotent in effect. A duplicate release names a token
// that can never be current again, and a duplicate keep a renewal, which
// therefore change nothing; a duplicate lease end settles its key as any
// command does; a duplicate acquire's second outcome finds its request
// already answered, and if it is a grant the node releases it as an
// orphan. Same for a batch that applies after its requests were answered
// E unavailable.
//
// It reports whether a watcher took over b (and the group's slot, which
// it frees with b when b's fate is known).
func (g *group) send(ctx context.Context, b *bytebufferpool.ByteBuffer, deadline time.Time) bool {
	n := g.n
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			n.stats.proposeFailures.Add(1)
			return false
		}
		if g.leader() == 0 {
			// No leader known (an election, or a node waiting to be
			// added): dragonboat would drop the proposal with a warning.
			n.stats.proposeRetries.Add(1)
			pause(ctx, n.cfg.RTT)
			continue
		}
		if wait := g.held(); wait > 0 {
			select {
			case <-ctx.Done():
			case <-*g.newLeader.Load():
			case <-time.After(wait):
			}
			continue
		}
		err := g.proposeOnce(ctx, b, deadline)
		if err == nil {
			return true
		}
		if !dragonboat.IsTempError(err) {
			n.stats.proposeFailures.Add(1)
			n.log.Warn().Err(err).Uint64("group", g.shardID).Msg("proposal refused")
			return false
		}
		n.stats.proposeRetries.Add(1)
		pause(ctx, 5*time.Millisecond)
	}
}

// proposeOnce makes one attempt at proposing b; when dragonboat takes it,
// a watcher owns b and its slot from then on.
func (g *group) proposeOnce(ctx context.Context, b *bytebufferpool.ByteBuffer, deadline time.Time) error {
	n := g.n
	leaderChanged := *g.newLeader.Load()
	// dragonboat refuses a timeout under one tick (one RTT): a batch
	// close to its deadline still gets a whole attempt. Its requests are
	// answered by their own deadlines all the same, and what applies later
	// is handled as any late outcome.
	attempt := max(min(time.Until(deadline), n.cfg.AttemptTimeout), 2*n.cfg.RTT)
	rs, err := n.nh.Propose(n.nh.GetNoOPSession(g.shardID), b.B, attempt)
	if err != nil {
		return err
	}
	n.stats.proposals.Add(1)
	n.stats.commands.Add(uint64(binaryCount(b.B)))
	// Added from a goroutine the node's WaitGroup already counts (the
	// proposer or a watcher), or from an event loop, which the server
	// stops before Close; so Close cannot miss it.
	n.wg.Add(1)
	go func() { defer n.wg.Done(); g.watch(ctx, rs, leaderChanged, b, deadline) }()
	return nil
}

func binaryCount(b []byte) uint32 {
	_, count, _, _ := readHeader(b)
	return count
}

// watch waits for a proposal's fate and sends it again when it was
// dropped or timed out, or at once when the group's leader changed while
// it was out: a dead leader loses what a follower forwarded to it, and a
// leader handing over drops it, without telling the follower, which
// would otherwise learn only at the attempt timeout (two election
// timeouts). Sending a proposal twice is safe (see send).
func (g *group) watch(ctx context.Context, rs *dragonboat.RequestState, leaderChanged <-chan struct{}, b *bytebufferpool.ByteBuffer, deadline time.Time) {
	proposed := time.Now()
	var r dragonboat.RequestResult
	select {
	case r = <-rs.ResultC():
		if r.Completed() {
			g.n.obs.proposeToApply.Observe(time.Since(proposed))
		}
	case <-leaderChanged:
		// rs completes on its own; its outcome no longer matters.
		g.n.stats.proposeRetries.Add(1)
		if g.send(ctx, b, deadline) {
			return // the new watcher owns the slot
		}
		g.done(b)
		return
	case <-ctx.Done():
		g.done(b)
		return
	}
	rs.Release()
	if r.Dropped() || r.Timeout() {
		g.n.stats.proposeRetries.Add(1)
		pause(ctx, 5*time.Millisecond)
		if g.send(ctx, b, deadline) {
			return // the new watcher owns the slot
		}
	}
	g.done(b)
}

// sendAgain makes g's proposals in flight go out again at once (watch):
// the leader they went to may have dropped them without a word.
func (g *group) sendAgain() { close(*g.newLeader.Swap(new(make(chan struct{})))) }

// resendProposals tells g's other voters that a hand-over this leader
// asked for was given up: while it was pending, this leader dropped the
// proposals they forwarded without telling them, and they would
// otherwise send them again only at their attempt timeout (two election
// timeouts).
// It ends the hand-over's hold here and on them.
func (n *Node) resendProposals(g *group) {
	n.log.Info().Uint64("group", g.shardID).Msg("leader hand-over given up: the followers send their proposals again")
	g.endHold()
	n.sendToVoters(g, appendSendAgain(nil, g.shardID))
}

// sendToVoters sends the peer message msg to g's other voters.
func (n *Node) sendToVoters(g *group, msg []byte) {
	info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	if info == nil {
		return
	}
	for _, si := range info.ShardInfoList {
		if si.ShardID != g.shardID {
			continue
		}
		for id := range si.Replicas {
			if id != n.cfg.NodeID {
				n.links.send(id, msg)
			}
		}
	}
}

// Send-again messages, inside a transport frame of kind 'L': 'a' | count ×
// shard u64. A node that does not know the kind ignores it; a forged one
// costs a resend, which is safe (send).
const peerSendAgain = 'a'

func appendSendAgain(b []byte, shard uint64) []byte {
	if len(b) == 0 {
		b = append(b, peerSendAgain)
	}
	return binary.BigEndian.AppendUint64(b, shard)
}

// onSendAgain ends a hold of the groups named and sends this node's
// proposals in flight to them again.
func (n *Node) onSendAgain(b []byte) {
	for ; len(b) >= 8; b = b[8:] {
		shard := binary.BigEndian.Uint64(b)
		for _, g := range n.groups {
			if g.shardID == shard {
				g.endHold()
				g.sendAgain()
			}
		}
	}
}

// Hold messages, inside a transport frame of kind 'L': 'h' | leader u64 |
// shard u64. A node that does not know the kind ignores it: the leader's
// hand-over may then fail as it does without one.
const peerHold = 'h'

func appendHold(b []byte, leader, shard uint64) []byte {
	b = append(b, peerHold)
	b = binary.BigEndian.AppendUint64(b, leader)
	return binary.BigEndian.AppendUint64(b, shard)
}

// onHold keeps this node from starting proposals of the group named for
// a hand-over's longest, while the leader that asked still leads it.
func (n *Node) onHold(b []byte) {
	if len(b) != 16 {
		return
	}
	leader, shard := binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
	for _, g := range n.groups {
		if g.shardID == shard {
			g.hold(leader, n.clock()+n.handOverTimeout())
		}
	}
}

func (g *group) hold(leader uint64, until time.Duration) {
	g.holdUntil.Store(int64(until))
	g.holdBy.Store(leader)
}

// holdProposals starts a hand-over of g, led here: this node and g's
// other voters start no proposal of g until its leader changes, the
// hand-over is given up (resendProposals) or handOverTimeout passed
// (handOverLeadership says why).
func (n *Node) holdProposals(g *group) {
	g.hold(n.cfg.NodeID, n.clock()+n.handOverTimeout())
	n.sendToVoters(g, appendHold(nil, n.cfg.NodeID, g.shardID))
}

func (g *group) endHold() { g.holdBy.Store(0) }

// held is how long this node must still start no proposal of g: while
// the leader that asked for a hold (onHold) still leads, until its end.
func (g *group) held() time.Duration {
	by := g.holdBy.Load()
	if by == 0 {
		return 0
	}
	left := time.Duration(g.holdUntil.Load()) - g.n.clock()
	if left <= 0 || g.leader() != by {
		g.holdBy.CompareAndSwap(by, 0)
		return 0
	}
	return left
}

// pause waits d, or until ctx is done: the back-off of a retry.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// queue appends one command, built by add, to g's next batch; the next
// event-loop Flush, or a propose, sends it. It is the only writer of the
// batch.
func (g *group) queue(add func([]byte) []byte) {
	g.mu.Lock()
	g.buf = add(g.buf)
	g.count++
	g.mu.Unlock()
	g.dirty.Store(true)
}
