package cluster

// This file owns online membership changes: listing, adding and removing
// a node in every group, one group after the other, and the record of
// which peers this node hears from (the silent-peer rule of
// housekeeping.go reads it). A change goes through each group's Raft log as a
// configuration change; nothing here touches the replicated lock state
// except the forget of a removed node's waiters.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
)

// Errors of membership changes, wrapped with the group and node they name.
var (
	// ErrMemberExists: the node is a member of the group at another
	// address; remove it first (a replica id is never reused).
	ErrMemberExists = errors.New("cluster: node is already a member at another address")
	// ErrMemberRemoved: the node was removed from the group earlier, and
	// Raft never takes a removed id back; give the new node a new id.
	ErrMemberRemoved = errors.New("cluster: node was removed earlier and its id cannot come back")
	// ErrRemoveSelf: a node cannot carry out its own removal, since it
	// leaves each group as the change applies; ask another member.
	ErrRemoveSelf = errors.New("cluster: a node cannot remove itself: ask another member")
)

// Member is one node of the cluster as the groups' memberships list it.
type Member struct {
	ID   uint64 `json:"id"`
	Addr string `json:"raft_addr"`
	// Groups counts the groups the node is a member of: all of them once
	// a change has gone through, fewer while one is under way or after
	// one failed half-way (repeat it).
	Groups int `json:"groups"`
	// LeaderOf lists the groups (1-based, as in metrics) it leads in this
	// node's view.
	LeaderOf []int `json:"leader_of"`
	// Reachable is the answering node's view of it: "self"; "yes" when a
	// Raft message came from it within reachableWithin; "no" when none
	// did although a group one of the two leads keeps them talking;
	// "unknown" otherwise, as followers of the same leader do not talk
	// to each other (ask a node that leads a group).
	Reachable string `json:"reachable"`
	// LastHeardMs is how long ago, in ms, the answering node last had a
	// Raft message from it; null for itself and for a node it has not
	// heard since it started.
	LastHeardMs *int64 `json:"last_heard_ms"`
}

// Values of Member.Reachable.
const (
	ReachableSelf    = "self"
	ReachableYes     = "yes"
	ReachableNo      = "no"
	ReachableUnknown = "unknown"
)

// reachableWithin is how recently a peer must have been heard to be
// reachable: leaders send every tick, so this is many missed messages.
func (n *Node) reachableWithin() time.Duration {
	return max(2*time.Duration(n.cfg.ElectionRTT)*n.cfg.RTT, time.Second)
}

// contact fills m's Reachable and LastHeardMs from the instant (node
// clock) it was last heard, 0 for not since the start; inTouch says
// whether a group led by either node keeps the two talking.
func (m *Member) contact(self, inTouch bool, heardAt, now, within time.Duration) {
	if self {
		m.Reachable = ReachableSelf
		return
	}
	if heardAt > 0 {
		ago := (now - heardAt).Milliseconds()
		m.LastHeardMs = &ago
	}
	switch {
	case heardAt > 0 && now-heardAt <= within:
		m.Reachable = ReachableYes
	case inTouch && now > within:
		m.Reachable = ReachableNo
	default:
		m.Reachable = ReachableUnknown
	}
}

// Membership is the cluster's membership as every group has committed it.
type Membership struct {
	Node    uint64   `json:"node"` // the node that answered
	Groups  int      `json:"groups"`
	Members []Member `json:"members"`
	// Removed lists ids removed from any group: they cannot be added back.
	Removed []uint64 `json:"removed"`
	// LogFormats is each group's log format (version.go) as the answering
	// node's replica applied it, group 1 first.
	LogFormats []int `json:"log_formats"`
	// Halted says why each of the answering node's replicas that halted
	// did (a log entry or snapshot its build cannot read); empty when
	// none did.
	Halted []string `json:"halted"`
}

// maxHeardPeers bounds the peers this node keeps a heard instant of, so
// that messages naming made-up replica ids cannot grow it without end.
const maxHeardPeers = 64

// peerLiveness is when (node clock) a Raft message last came from each
// peer. Entries appear with a peer's first message — a node that proposes
// or votes in any group talks to every leader — and stay after a removal,
// so that a removed node's silence drops its waiters like a dead one's.
type peerLiveness struct {
	mu    sync.Mutex // serializes additions; reads go through the pointer
	peers atomic.Pointer[map[uint64]*atomic.Int64]
}

func (l *peerLiveness) init(self uint64, peers map[uint64]string) {
	m := make(map[uint64]*atomic.Int64, len(peers))
	for id := range peers {
		if id != self {
			m[id] = new(atomic.Int64) // heard of at start: the clock's 0
		}
	}
	l.peers.Store(&m)
}

// heard records a message from peer at now. It is on the transport's
// receive path: a known peer costs one map read and one atomic store.
func (l *peerLiveness) heard(peer uint64, now time.Duration) {
	if at := (*l.peers.Load())[peer]; at != nil {
		at.Store(int64(now))
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.peers.Load()
	if at := old[peer]; at != nil || len(old) >= maxHeardPeers {
		if at != nil {
			at.Store(int64(now))
		}
		return
	}
	m := maps.Clone(old)
	at := new(atomic.Int64)
	at.Store(int64(now))
	m[peer] = at
	l.peers.Store(&m)
}

// freshest is the peer heard from most recently, if within maxSilence of
// now; 0 when none is.
func (l *peerLiveness) freshest(now, maxSilence time.Duration) uint64 {
	best, bestAt := uint64(0), now-maxSilence
	for peer, t := range l.heardAt() {
		if t > bestAt || t == bestAt && best == 0 {
			best, bestAt = peer, t
		}
	}
	return best
}

// heardAt is the peers and their last heard instants.
func (l *peerLiveness) heardAt() map[uint64]time.Duration {
	peers := *l.peers.Load()
	heard := make(map[uint64]time.Duration, len(peers))
	for peer, at := range peers {
		heard[peer] = time.Duration(at.Load())
	}
	return heard
}

// memberTimeout bounds one group's configuration change or membership
// read: an election and a commit, with room for a busy leader.
const memberTimeout = 10 * time.Second

// Members reads every group's committed membership (a linearizable read
// through its leader) and merges them by node.
func (n *Node) Members(ctx context.Context) (Membership, error) {
	out := Membership{Node: n.cfg.NodeID, Groups: len(n.groups)}
	byID := map[uint64]*Member{}
	removed := map[uint64]bool{}
	inTouch := map[uint64]bool{}
	for i, g := range n.groups {
		m, err := n.groupMembership(ctx, g)
		if err != nil {
			return Membership{}, err
		}
		leader := n.Leader(i)
		for id, addr := range m.Nodes {
			mb := byID[id]
			if mb == nil {
				mb = &Member{ID: id, Addr: addr, LeaderOf: []int{}}
				byID[id] = mb
			}
			mb.Groups++
			inTouch[id] = inTouch[id] || leader == id || leader == n.cfg.NodeID
			if id == leader {
				mb.LeaderOf = append(mb.LeaderOf, i+1)
			}
		}
		for id := range m.Removed {
			removed[id] = true
		}
	}
	heard, now := n.liveness.heardAt(), n.clock()
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		mb := byID[id]
		mb.contact(id == n.cfg.NodeID, inTouch[id], heard[id], now, n.reachableWithin())
		out.Members = append(out.Members, *mb)
	}
	out.Removed = slices.Sorted(maps.Keys(removed))
	if out.Removed == nil {
		out.Removed = []uint64{}
	}
	halted := n.HaltedGroups()
	out.Halted = []string{}
	for i := range n.groups {
		out.LogFormats = append(out.LogFormats, n.LogFormat(i))
		if why, ok := halted[i]; ok {
			out.Halted = append(out.Halted, why)
		}
	}
	return out, nil
}

// AddMember adds node id at raft address addr to every group that does
// not have it yet. Start the new node first, with Config.Join and an
// empty data dir: it then catches up as soon as each group takes it. A
// repeat after a partial failure finishes the groups left.
func (n *Node) AddMember(ctx context.Context, id uint64, addr string) error {
	if id == 0 || addr == "" {
		return errors.New("cluster: add member: want an id >= 1 and a raft address")
	}
	err := n.changeEveryGroup(ctx, "add", id, func(ctx context.Context, g *group, m *dragonboat.Membership) (memberChange, error) {
		if _, gone := m.Removed[id]; gone {
			return nil, fmt.Errorf("group %d, node %d: %w", g.shardID, id, ErrMemberRemoved)
		}
		if have, ok := m.Nodes[id]; ok {
			if have != addr {
				return nil, fmt.Errorf("group %d, node %d at %s: %w", g.shardID, id, have, ErrMemberExists)
			}
			return nil, nil
		}
		if err := n.checkJoinerFormat(ctx, g, id, addr); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			return n.nh.SyncRequestAddReplica(ctx, g.shardID, id, addr, m.ConfigChangeID)
		}, nil
	})
	if err != nil {
		return err
	}
	n.log.Info().Uint64("node", id).Str("raft", addr).Msg("member added to every group")
	return nil
}

// RemoveMember removes node id from every group that has it, then drops
// its queued waiters (cmdForget), since no grant can reach them any more.
// Locks it granted stay until released or their leases end. Stop the
// removed node's process afterwards: it serves nothing.
func (n *Node) RemoveMember(ctx context.Context, id uint64) error {
	if id == n.cfg.NodeID {
		return fmt.Errorf("node %d: %w", id, ErrRemoveSelf)
	}
	err := n.changeEveryGroup(ctx, "remove", id, func(ctx context.Context, g *group, m *dragonboat.Membership) (memberChange, error) {
		if _, ok := m.Nodes[id]; !ok {
			return nil, nil
		}
		n.moveLeaderOff(ctx, g, id, m)
		return func(ctx context.Context) error {
			return n.nh.SyncRequestDeleteReplica(ctx, g.shardID, id, m.ConfigChangeID)
		}, nil
	})
	if err != nil {
		return err
	}
	for _, g := range n.groups {
		g.queue(func(b []byte) []byte { return appendForget(b, id, 1, 0) })
		g.propose()
	}
	n.log.Info().Uint64("node", id).Msg("member removed from every group")
	return nil
}

// memberChange proposes one group's configuration change.
type memberChange func(ctx context.Context) error

// memberPlan decides a group's change from its membership.
type memberPlan func(ctx context.Context, g *group, m *dragonboat.Membership) (memberChange, error)

// changeEveryGroup brings each group in turn to what plan wants: it reads
// the group's membership, and plan returns the change still to make (nil
// once there is none) or why it must not be made. The change names the
// membership it was planned on (its ConfigChangeID), so two changes
// racing on one group cannot both apply. A change that was not taken, or
// whose answer was lost with a leader, is planned again from a fresh
// read, until memberTimeout.
func (n *Node) changeEveryGroup(ctx context.Context, what string, id uint64, plan memberPlan) error {
	for _, g := range n.groups {
		gctx, cancel := context.WithTimeout(ctx, memberTimeout)
		err := n.changeGroup(gctx, g, what, id, plan)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) changeGroup(ctx context.Context, g *group, what string, id uint64, plan memberPlan) error {
	for {
		m, err := n.groupMembership(ctx, g)
		if err != nil {
			return err
		}
		change, err := plan(ctx, g, m)
		if err != nil || change == nil {
			return err
		}
		attempt, cancel := context.WithTimeout(ctx, n.cfg.AttemptTimeout)
		err = change(attempt)
		cancel()
		if err == nil {
			n.log.Info().Uint64("group", g.shardID).Uint64("node", id).Str("change", what).Msg("membership changed")
			return nil
		}
		// Rejected: another change applied first. Temporary: no leader,
		// busy, or lost with a leader. Both are planned again.
		if !errors.Is(err, dragonboat.ErrRejected) && !dragonboat.IsTempError(err) || ctx.Err() != nil {
			return fmt.Errorf("cluster: group %d: %s node %d: %w (repeat the command: groups done already are skipped)", g.shardID, what, id, err)
		}
		pause(ctx, 20*time.Millisecond)
	}
}

// moveLeaderOff hands g's leadership from node id, about to be removed,
// to another member (this node if it is one), and waits up to an
// election timeout for it: a leader that removes itself steps down with
// no successor, and the group then waits a whole election.
func (n *Node) moveLeaderOff(ctx context.Context, g *group, id uint64, m *dragonboat.Membership) {
	if n.Leader(g.idx) != id {
		return
	}
	to := n.cfg.NodeID
	if _, ok := m.Nodes[to]; !ok {
		to = 0
		for _, other := range slices.Sorted(maps.Keys(m.Nodes)) {
			if other != id {
				to = other
				break
			}
		}
	}
	n.moveLeader(g, to)
	deadline := time.Now().Add(time.Duration(n.cfg.ElectionRTT) * n.cfg.RTT)
	for n.Leader(g.idx) == id && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(n.cfg.RTT)
	}
}

func (n *Node) groupMembership(ctx context.Context, g *group) (*dragonboat.Membership, error) {
	ctx, cancel := context.WithTimeout(ctx, memberTimeout)
	defer cancel()
	for {
		// One attempt per AttemptTimeout: a read sent to a leader that
		// then stepped down or died is never answered.
		attempt, cancelAttempt := context.WithTimeout(ctx, n.cfg.AttemptTimeout)
		m, err := n.nh.SyncGetShardMembership(attempt, g.shardID)
		cancelAttempt()
		if err == nil {
			return m, nil
		}
		// Not ready (no leader known yet, or a node still catching up
		// after it joined), busy or timed out: try again within the bound.
		if !dragonboat.IsTempError(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("cluster: group %d: read membership: %w", g.shardID, err)
		}
		pause(ctx, 20*time.Millisecond)
	}
}

// heardFrom records a Raft message from replica (the transport's hook).
func (n *Node) heardFrom(replica uint64) { n.liveness.heard(replica, n.clock()) }
