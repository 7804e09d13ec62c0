package cluster

// This file owns the check of where a Raft frame says it comes from,
// made by the transport before dragonboat sees the frame: the sender
// must be a member of each group its messages are for, at the Raft
// address the group's membership records for it.
//
// Dragonboat trusts a message batch's source address: it files it in its
// address registry under every sender replica the batch names, and panics
// ("inconsistent target") when a replica already has another address
// there. One forged frame naming a member at a made-up address killed the
// process. So the transport forwards batches with their source address
// cleared, after checking it here: dragonboat's registry then learns
// addresses from the groups' membership (its log and snapshots) only.
//
// The exception is a group whose replica here does not know its
// membership yet: a node joining, until the leader's entries or snapshot
// arrive. It must learn the leader's address from the leader's messages
// to answer them, so their source address is kept; the first address
// given for a sender is then the only one accepted for it, so that
// dragonboat's registry is never given two. Until the join completes, an
// attacker who reaches the joining node first can still name a wrong one;
// mutual TLS (LoadRaftTLS) closes that.

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

	// pinned holds the address first given for each sender of a group
	// whose membership this node does not know (raftio.NodeInfo ->
	// string).
	pinned sync.Map
}

// sourcesView is one reading of the memberships.
type sourcesView struct {
	addrs map[raftio.NodeInfo]string // (group, member) -> Raft address
	// unknown holds the groups whose replica here does not know its
	// membership yet: a node joining, before the leader's first entries
	// or snapshot. Their messages cannot be checked; they are let through
	// without an address, which dragonboat then never files.
	unknown map[uint64]bool
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

// checkBatch reports whether every message of mb comes from a member of
// its group at mb's source address, and whether dragonboat must be given
// that address (a message is for a group whose membership is not known
// here). A batch whose sender is unknown makes the view be read again, at
// most every sourcesRefreshEvery.
func (s *raftSources) checkBatch(mb *pb.MessageBatch) (keepSource bool, err error) {
	if err := checkOrigin(mb.DeploymentId, mb.BinVer); err != nil {
		return false, err
	}
	view := s.view.Load()
	if err := view.checkBatch(mb); err != nil {
		if !s.refresh() {
			return false, err
		}
		if view = s.view.Load(); view.checkBatch(mb) != nil {
			return false, err
		}
	}
	for i := range mb.Requests {
		m := &mb.Requests[i]
		if !view.unknown[m.ShardID] {
			continue
		}
		keepSource = true
		sender := raftio.NodeInfo{ShardID: m.ShardID, ReplicaID: m.From}
		if first, _ := s.pinned.LoadOrStore(sender, mb.SourceAddress); first != mb.SourceAddress {
			return false, fmt.Errorf("%w: group %d member %d was at %q, now %q", errForeignSource, m.ShardID, m.From, first, mb.SourceAddress)
		}
	}
	return keepSource, nil
}

// checkChunk reports whether a snapshot chunk comes from a member of its
// group (a chunk carries no address).
func (s *raftSources) checkChunk(c *pb.Chunk) error {
	if err := checkOrigin(c.DeploymentId, c.BinVer); err != nil {
		return err
	}
	if err := s.view.Load().checkMember(c.ShardID, c.From, ""); err == nil || !s.refresh() {
		return err
	}
	return s.view.Load().checkMember(c.ShardID, c.From, "")
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
	v := &sourcesView{addrs: make(map[raftio.NodeInfo]string), unknown: make(map[uint64]bool)}
	for _, si := range (*read)() {
		if si.Pending || len(si.Replicas) == 0 {
			v.unknown[si.ShardID] = true
			continue
		}
		for id, addr := range si.Replicas {
			v.addrs[raftio.NodeInfo{ShardID: si.ShardID, ReplicaID: id}] = addr
		}
	}
	s.view.Store(v)
	return true
}

func (v *sourcesView) checkBatch(mb *pb.MessageBatch) error {
	if mb.SourceAddress == "" {
		return fmt.Errorf("%w: no source address", errForeignSource)
	}
	for i := range mb.Requests {
		if err := v.checkMember(mb.Requests[i].ShardID, mb.Requests[i].From, mb.SourceAddress); err != nil {
			return err
		}
	}
	return nil
}

// checkMember reports whether replica from is a member of group shard, at
// addr unless addr is empty.
func (v *sourcesView) checkMember(shard, from uint64, addr string) error {
	if v == nil {
		return fmt.Errorf("%w: no membership known yet", errForeignSource)
	}
	if from == 0 {
		return fmt.Errorf("%w: group %d, no sender", errForeignSource, shard)
	}
	if v.unknown[shard] {
		return nil
	}
	known, ok := v.addrs[raftio.NodeInfo{ShardID: shard, ReplicaID: from}]
	if !ok || (addr != "" && known != addr) {
		return fmt.Errorf("%w: group %d has no member %d at %q", errForeignSource, shard, from, addr)
	}
	return nil
}
