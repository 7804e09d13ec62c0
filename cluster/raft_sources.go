package cluster

// This file owns the check of where a Raft frame says it comes from,
// made by the transport before dragonboat sees the frame: each message
// must be for a group this node runs, name its sender, and come from the
// Raft address that group's membership records for that sender.
//
// Dragonboat trusts a message batch's source address: it files it in its
// address registry under every sender replica the batch names, and panics
// ("inconsistent target") when a replica already has another address
// there. One forged frame naming a member at a made-up address killed the
// process. So a batch whose senders are all members, at their recorded
// address, reaches dragonboat with its source address cleared: its
// registry then learns their addresses from the membership (log and
// snapshots) only.
//
// A sender this replica does not know as a member is not refused: a
// replica's membership is what it has applied, which lags its group's —
// a node joining knows none until the leader's entries arrive, and a node
// restarted may not have applied the addition of the member it must now
// vote with (it was refused, and two live members of three never elected
// a leader). Its batches keep their source address, so that this node
// can answer, and the first address given for such a sender is the only
// one accepted for it, so that dragonboat's registry is never given two.
// Someone who reaches a plain TCP Raft port can therefore still speak as
// a replica id the group does not have yet, and, in the moment between a
// member's addition and the next reading of the view, as that member at
// another address; mutual TLS (LoadRaftTLS) closes that: a peer's
// certificate must name the host of the address it gives.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
)

// sourcesRefreshEvery bounds how often a frame from an unknown source
// makes the view of the memberships be read again: a member added a
// moment ago is known after at most this, and a flood of forged frames
// costs one read per interval.
const sourcesRefreshEvery = 50 * time.Millisecond

var errForeignSource = errors.New("cluster: raft frame from outside the group's membership")

// raftSources checks frames against this node's view of its groups'
// memberships; safe for concurrent use by the transport's connections.
type raftSources struct {
	// shards reads every group this node runs, with its membership as
	// this node's replica knows it (Pending while it knows none); nil
	// until the NodeHost exists.
	shards atomic.Pointer[func() []dragonboat.ShardInfo]
	view   atomic.Pointer[sourcesView]

	refreshMu   sync.Mutex
	refreshedAt time.Time // under refreshMu

	// pinned holds the address first given for each sender not known as
	// a member (raftio.NodeInfo -> string).
	pinned sync.Map
}

// sourcesView is one reading of the memberships.
type sourcesView struct {
	groups map[uint64]bool            // the groups this node runs
	addrs  map[raftio.NodeInfo]string // (group, member) -> Raft address
}

// attach makes s read nh's groups.
func (s *raftSources) attach(nh *dragonboat.NodeHost) {
	read := func() []dragonboat.ShardInfo {
		info := nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
		if info == nil { // closed
			return nil
		}
		return info.ShardInfoList
	}
	s.shards.Store(&read)
}

// checkBatch reports whether mb's messages may reach dragonboat (see the
// file comment), and whether its source address must go with them (a
// sender is not a member as this replica knows). A batch that is refused
// or names a sender not known as a member makes the view be read again,
// at most every sourcesRefreshEvery.
func (s *raftSources) checkBatch(mb *pb.MessageBatch) (keepSource bool, err error) {
	if err := checkOrigin(mb.DeploymentId, mb.BinVer); err != nil {
		return false, err
	}
	view := s.view.Load()
	keepSource, err = view.checkBatch(mb)
	if (err != nil || keepSource) && s.refresh() {
		view = s.view.Load()
		keepSource, err = view.checkBatch(mb)
	}
	if err != nil || !keepSource {
		return false, err
	}
	for i := range mb.Requests {
		m := &mb.Requests[i]
		if _, member := view.addrs[raftio.NodeInfo{ShardID: m.ShardID, ReplicaID: m.From}]; member {
			continue
		}
		sender := raftio.NodeInfo{ShardID: m.ShardID, ReplicaID: m.From}
		if first, _ := s.pinned.LoadOrStore(sender, mb.SourceAddress); first != mb.SourceAddress {
			return false, fmt.Errorf("%w: group %d replica %d was at %q, now %q", errForeignSource, m.ShardID, m.From, first, mb.SourceAddress)
		}
	}
	return true, nil
}

// checkChunk reports whether a snapshot chunk comes from a member of its
// group (a chunk carries no address).
func (s *raftSources) checkChunk(c *pb.Chunk) error {
	if err := checkOrigin(c.DeploymentId, c.BinVer); err != nil {
		return err
	}
	if _, err := s.view.Load().checkSender(c.ShardID, c.From, ""); err == nil || !s.refresh() {
		return err
	}
	_, err := s.view.Load().checkSender(c.ShardID, c.From, "")
	return err
}

// checkOrigin refuses frames of another deployment or transport version,
// which dragonboat would drop one by one: their sender is no peer, and its
// connection is closed instead.
func checkOrigin(deployment uint64, binVer uint32) error {
	if deployment != deploymentID || binVer != raftio.TransportBinVersion {
		return fmt.Errorf("%w: deployment %d version %d", errForeignSource, deployment, binVer)
	}
	return nil
}

// refresh reads the memberships again unless that was done less than
// sourcesRefreshEvery ago; it reports whether it did.
func (s *raftSources) refresh() bool {
	read := s.shards.Load()
	if read == nil {
		return false
	}
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	if time.Since(s.refreshedAt) < sourcesRefreshEvery {
		return false
	}
	s.refreshedAt = time.Now()
	v := &sourcesView{groups: make(map[uint64]bool), addrs: make(map[raftio.NodeInfo]string)}
	for _, si := range (*read)() {
		v.groups[si.ShardID] = true
		for id, addr := range si.Replicas {
			v.addrs[raftio.NodeInfo{ShardID: si.ShardID, ReplicaID: id}] = addr
		}
	}
	s.view.Store(v)
	return true
}

// checkBatch checks every message of mb (checkSender); member is false
// when a sender is not a member as this replica knows.
func (v *sourcesView) checkBatch(mb *pb.MessageBatch) (notMember bool, err error) {
	if mb.SourceAddress == "" {
		return false, fmt.Errorf("%w: no source address", errForeignSource)
	}
	for i := range mb.Requests {
		member, err := v.checkSender(mb.Requests[i].ShardID, mb.Requests[i].From, mb.SourceAddress)
		if err != nil {
			return false, err
		}
		notMember = notMember || !member
	}
	return notMember, nil
}

// checkSender refuses a message for a group this node does not run, one
// without a sender, and one whose sender is a member at another address
// than addr (unless addr is empty); it reports whether the sender is a
// member.
func (v *sourcesView) checkSender(shard, from uint64, addr string) (member bool, err error) {
	switch {
	case v == nil:
		return false, fmt.Errorf("%w: no membership known yet", errForeignSource)
	case !v.groups[shard]:
		return false, fmt.Errorf("%w: no group %d here", errForeignSource, shard)
	case from == 0:
		return false, fmt.Errorf("%w: group %d, no sender", errForeignSource, shard)
	}
	known, member := v.addrs[raftio.NodeInfo{ShardID: shard, ReplicaID: from}]
	if member && addr != "" && known != addr {
		return false, fmt.Errorf("%w: group %d has member %d at %q, not %q", errForeignSource, shard, from, known, addr)
	}
	return member, nil
}
