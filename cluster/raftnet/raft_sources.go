package raftnet

// This file owns the check of where a Raft frame says it comes from,
// made by the transport before dragonboat sees the frame: each message
// must be for a group this node runs and for its replica there, name its
// sender, and come from the Raft address that group's membership records
// for that sender.
//
// Dragonboat trusts a message batch's source address: it files it in its
// address registry under every sender replica the batch names, and panics
// ("inconsistent target") when a replica already has another address
// there, which ends the process: one forged frame naming a member at a
// made-up address would do it. So a batch whose senders are all members, at their recorded
// address, reaches dragonboat with its source address cleared: its
// registry then learns their addresses from the membership (log and
// snapshots) only.
//
// A sender this replica does not know as a member is not refused: a
// replica's membership is what it has applied, which lags its group's —
// a node joining knows none until the leader's entries arrive, and a node
// restarted may not have applied the addition of the member it must now
// vote with (refusing it leaves two live members of three unable to
// elect a leader). Its batches keep their source address, so that this node
// can answer, and the first address given for such a sender is the only
// one accepted for it, so that the transport never gives dragonboat's
// registry two; past maxUnknownSenders such senders, new ones are
// refused. Before a sender is taken as unknown, the memberships are read
// again, after the frame arrived (a frame waits for that reading at most
// sourcesReadEvery, and a flood of such frames costs one reading per
// interval): a member added a moment ago is then known, and a frame
// giving it another address is refused. Dragonboat files an added member's
// address a moment before its membership shows the member; a frame that
// falls into that instant makes the registry panic, and the transport
// takes that panic back and closes the connection (deliverWithSource).
//
// The address first given for an unknown sender stays in dragonboat's
// registry, which forgets none. When the group later adds that replica id
// at another address (a frame from outside the membership gave a made-up
// one, or a node changed address before it was added), dragonboat's
// registry panics as it files the membership's address, on its apply path,
// where nothing can take the panic back and the process would end. lockd
// records every address it let through for an unknown sender
// (filedAddrs), and dragonboat's logger (Panicf) turns that panic, when the address the registry
// held is one lockd filed for that replica so, into a repair: the registry
// keeps the old address, the transport dials the membership's in its
// place (dialAddr), and the repair is logged and counted
// (lockd_cluster_raft_forged_addresses_total). The transport never dials
// elsewhere than the address asked for when that is a member's address,
// whose traffic it is.
//
// So a sender not known as a member must not give another member's
// address, or dragonboat would send that sender's messages to the member
// for good: lockd makes a node's replica id its node id in every group, so
// a member's address belongs to that id alone, and a frame naming another
// id at it is refused, whichever group the member is in. A node replaced
// by a new id at the same address is heard by this node in a group once
// this node has applied the old id's removal or the new one's addition
// there.
//
// What remains on a plain TCP Raft port (loopback, or --insecure-raft):
// someone who reaches it can speak as any member at its recorded address
// (forged votes and heartbeats), and as replica ids the group does not
// have yet at addresses no member has, up to maxUnknownSenders of them.
// Mutual TLS (LoadTLS) closes it: a peer's certificate must come from
// the cluster's CA and name the host of the address it gives.

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/rs/zerolog"
)

const (
	// sourcesReadEvery bounds how often frames from unknown sources make
	// the memberships be read again, and so how long such a frame waits
	// for a reading made after it arrived.
	sourcesReadEvery = 10 * time.Millisecond
	// maxUnknownSenders bounds the senders not known as members whose
	// address is pinned, and so the addresses of non-members dragonboat
	// files in its registry, which forgets none: frames naming a new
	// replica id each, or one frame naming millions, would grow both
	// without end. The legitimate ones are the few nodes of groups this
	// node is joining or electing a leader with while it lags.
	maxUnknownSenders = 1024
)

var errForeignSource = errors.New("cluster: raft frame from outside the group's membership")

// Sources checks frames against this node's view of its groups'
// memberships; safe for concurrent use by the transport's connections.
type Sources struct {
	// shards reads every group this node runs, with its membership as
	// this node's replica knows it (Pending while it knows none); nil
	// until the NodeHost exists.
	shards atomic.Pointer[func() []dragonboat.ShardInfo]
	view   atomic.Pointer[sourcesView]

	readMu sync.Mutex // held while a reading is made or awaited

	pinMu sync.Mutex
	// pinned holds the address first given for each sender not known as
	// a member, at most maxUnknownSenders of them; a sender is unpinned
	// once a reading shows it as a member.
	pinned map[raftio.NodeInfo]string
}

// sourcesView is one reading of the memberships.
type sourcesView struct {
	readAt time.Time                  // when the reading began
	groups map[uint64]uint64          // the groups this node runs -> its replica in each
	addrs  map[raftio.NodeInfo]string // (group, member) -> Raft address
	// memberAt maps a member's Raft address, in any group, to its replica
	// id; to 0 (never a replica id) when members of several ids give it.
	memberAt map[string]uint64
}

// newSourcesView is the reading of shards begun at readAt.
func newSourcesView(readAt time.Time, shards []dragonboat.ShardInfo) *sourcesView {
	v := &sourcesView{readAt: readAt, groups: make(map[uint64]uint64), addrs: make(map[raftio.NodeInfo]string),
		memberAt: make(map[string]uint64)}
	for _, si := range shards {
		v.groups[si.ShardID] = si.ReplicaID
		for id, addr := range si.Replicas {
			v.addrs[raftio.NodeInfo{ShardID: si.ShardID, ReplicaID: id}] = addr
			if other, seen := v.memberAt[addr]; seen && other != id {
				id = 0
			}
			v.memberAt[addr] = id
		}
	}
	return v
}

// attach makes s read nh's groups.
func (s *Sources) Attach(nh *dragonboat.NodeHost) {
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
// or names a sender not known as a member is checked again against a
// reading of the memberships made after it arrived.
func (s *Sources) checkBatch(mb *pb.MessageBatch) (keepSource bool, err error) {
	arrived := time.Now()
	if err := checkOrigin(mb.DeploymentId, mb.BinVer); err != nil {
		return false, err
	}
	view := s.view.Load()
	keepSource, err = view.checkBatch(mb)
	if err != nil || keepSource {
		view = s.readSince(arrived)
		keepSource, err = view.checkBatch(mb)
	}
	if err != nil || !keepSource {
		return false, err
	}
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	for i := range mb.Requests {
		sender := raftio.NodeInfo{ShardID: mb.Requests[i].ShardID, ReplicaID: mb.Requests[i].From}
		if _, member := view.addrs[sender]; member {
			continue
		}
		first, pinned := s.pinned[sender]
		switch {
		case pinned && first != mb.SourceAddress:
			return false, fmt.Errorf("%w: group %d replica %d was at %q, now %q", errForeignSource, sender.ShardID, sender.ReplicaID, first, mb.SourceAddress)
		case pinned:
			continue
		case len(s.pinned) >= maxUnknownSenders:
			return false, fmt.Errorf("%w: group %d replica %d: %d senders outside the memberships known already", errForeignSource, sender.ShardID, sender.ReplicaID, len(s.pinned))
		}
		if s.pinned == nil {
			s.pinned = make(map[raftio.NodeInfo]string)
		}
		s.pinned[sender] = mb.SourceAddress
		unknownFiled.file(sender, mb.SourceAddress)
	}
	return true, nil
}

// unpin forgets the addresses mb pinned for its senders, once dragonboat
// refused the batch: its senders turned out to be members at another
// address, which their own frames must still be able to give.
func (s *Sources) unpin(mb *pb.MessageBatch) {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	for i := range mb.Requests {
		sender := raftio.NodeInfo{ShardID: mb.Requests[i].ShardID, ReplicaID: mb.Requests[i].From}
		if s.pinned[sender] == mb.SourceAddress {
			delete(s.pinned, sender)
			unknownFiled.unfile(sender, mb.SourceAddress)
		}
	}
}

// checkChunk reports whether a snapshot chunk comes from a member of its
// group (a chunk carries no address).
func (s *Sources) checkChunk(c *pb.Chunk) error {
	arrived := time.Now()
	if err := checkOrigin(c.DeploymentId, c.BinVer); err != nil {
		return err
	}
	if _, err := s.view.Load().checkChunk(c); err == nil {
		return nil
	}
	_, err := s.readSince(arrived).checkChunk(c)
	return err
}

// checkOrigin refuses frames of another deployment or transport version,
// which dragonboat would drop one by one: their sender is no peer, and its
// connection is closed instead.
func checkOrigin(deployment uint64, binVer uint32) error {
	if deployment != DeploymentID || binVer != raftio.TransportBinVersion {
		return fmt.Errorf("%w: deployment %d version %d", errForeignSource, deployment, binVer)
	}
	return nil
}

// readSince returns a reading of the memberships begun at or after
// arrived: the last one if it is, else a new one, made once
// sourcesReadEvery has passed since the last. Callers queue on readMu, so
// one reading serves every frame that arrived before it began. Before the
// NodeHost exists there is nothing to read, and the last view stands.
func (s *Sources) readSince(arrived time.Time) *sourcesView {
	read := s.shards.Load()
	if read == nil {
		return s.view.Load()
	}
	s.readMu.Lock()
	defer s.readMu.Unlock()
	last := s.view.Load()
	if last != nil {
		if !last.readAt.Before(arrived) {
			return last
		}
		time.Sleep(sourcesReadEvery - time.Since(last.readAt))
	}
	v := newSourcesView(time.Now(), (*read)())
	s.view.Store(v)
	s.pinMu.Lock()
	for sender, first := range s.pinned {
		addr, member := v.addrs[sender]
		if !member {
			continue
		}
		delete(s.pinned, sender)
		if addr == first {
			// The registry holds the membership's own address: no later
			// filing of this member can conflict with it.
			unknownFiled.unfile(sender, first)
		}
	}
	s.pinMu.Unlock()
	return v
}

// dialAddr is where the transport dials target, an address dragonboat's
// registry gave for a peer: when target is an address lockd filed for a
// sender outside the membership and the membership then gave that sender
// another, that other (see the file comment). But target itself when, on
// a reading of the memberships made now, it is a member's address (its
// traffic is that member's) or the other is no member's, and when two
// members superseded target with different addresses.
func (s *Sources) dialAddr(target string) string {
	to, redirected := unknownFiled.redirect(target)
	if !redirected || to == "" {
		return target
	}
	v := s.readSince(time.Now())
	if v == nil {
		return target
	}
	if _, member := v.memberAt[target]; member {
		return target
	}
	if _, member := v.memberAt[to]; !member {
		return target
	}
	return to
}

// checkBatch checks every message of mb (checkMessage) and, when a sender
// is not a member as this replica knows, that the source address is one
// dragonboat can file; notMember reports such a sender.
func (v *sourcesView) checkBatch(mb *pb.MessageBatch) (notMember bool, err error) {
	if mb.SourceAddress == "" {
		return false, fmt.Errorf("%w: no source address", errForeignSource)
	}
	for i := range mb.Requests {
		member, err := v.checkMessage(&mb.Requests[i], mb.SourceAddress)
		if err != nil {
			return false, err
		}
		notMember = notMember || !member
	}
	if notMember && !validRaftAddr(mb.SourceAddress) {
		return false, fmt.Errorf("%w: source address %q is not host:port", errForeignSource, mb.SourceAddress)
	}
	return notMember, nil
}

// checkMessage refuses a message that is not for this node's replica of
// its group, one without a sender, one of a kind dragonboat only makes
// locally (a snapshot to install arrives as chunks), one whose sender is a
// member at another address than addr, and one whose sender is not a
// member but addr is the address of a member of another id, in any group;
// it reports whether the sender is a member.
func (v *sourcesView) checkMessage(m *pb.Message, addr string) (member bool, err error) {
	if m.Type == pb.InstallSnapshot {
		return false, fmt.Errorf("%w: group %d, a local message kind (%s)", errForeignSource, m.ShardID, m.Type)
	}
	if err := v.checkSender(m.ShardID, m.From); err != nil {
		return false, err
	}
	if m.To != v.groups[m.ShardID] {
		return false, fmt.Errorf("%w: group %d, for replica %d, not this node's %d", errForeignSource, m.ShardID, m.To, v.groups[m.ShardID])
	}
	known, member := v.addrs[raftio.NodeInfo{ShardID: m.ShardID, ReplicaID: m.From}]
	if member && known != addr {
		return false, fmt.Errorf("%w: group %d has member %d at %q, not %q", errForeignSource, m.ShardID, m.From, known, addr)
	}
	if owner, taken := v.memberAt[addr]; !member && taken && owner != m.From {
		return false, fmt.Errorf("%w: group %d, sender %d at %q, a member's address of another id", errForeignSource, m.ShardID, m.From, addr)
	}
	return member, nil
}

// checkChunk refuses a chunk that checkMessage would, but for its address
// (a chunk carries none); it reports whether the sender is a member.
func (v *sourcesView) checkChunk(c *pb.Chunk) (member bool, err error) {
	if err := v.checkSender(c.ShardID, c.From); err != nil {
		return false, err
	}
	if c.ReplicaID != v.groups[c.ShardID] {
		return false, fmt.Errorf("%w: group %d, a chunk for replica %d, not this node's %d", errForeignSource, c.ShardID, c.ReplicaID, v.groups[c.ShardID])
	}
	_, member = v.addrs[raftio.NodeInfo{ShardID: c.ShardID, ReplicaID: c.From}]
	return member, nil
}

// checkSender refuses a frame for a group this node does not run and one
// without a sender.
func (v *sourcesView) checkSender(shard, from uint64) error {
	switch {
	case v == nil:
		return fmt.Errorf("%w: no membership known yet", errForeignSource)
	case v.groups[shard] == 0:
		return fmt.Errorf("%w: no group %d here", errForeignSource, shard)
	case from == 0:
		return fmt.Errorf("%w: group %d, no sender", errForeignSource, shard)
	}
	return nil
}

// validRaftAddr is what the transport tells dragonboat a Raft address
// must be (Factory.Validate): dragonboat panics when asked to
// file any other.
func validRaftAddr(addr string) bool {
	_, _, err := net.SplitHostPort(addr)
	return err == nil
}

// unknownFiled is the process's record of the addresses lockd let
// dragonboat file for senders outside the membership. It is process-wide
// because the registry's panic, where it is read, reaches lockd through
// dragonboat's logger, which is the process's (the cluster package installs it
// once) and names no NodeHost; tests run several nodes in one process,
// each filing here.
var unknownFiled filedAddrs

// forgedAddresses counts the registry conflicts repaired
// (lockd_cluster_raft_forged_addresses_total), process-wide as the record.
var forgedAddresses atomic.Uint64

// ForgedAddresses is how many registry conflicts were repaired in this
// process.
func ForgedAddresses() uint64 { return forgedAddresses.Load() }

// filedAddrs records, per sender and address, how many of the process's
// nodes let that address through to their registry for that sender while
// it was not a member, the membership's address that superseded each such
// filing, and from those the redirects. An entry is dropped when the registry
// turned it down (unpin) or the membership gave the sender that same
// address; one the membership gave another address is kept, since
// dragonboat files the membership's address again whenever it restores a
// snapshot. Entries are made at most maxUnknownSenders at a time per node
// and kept past that only for replica ids the group then added.
type filedAddrs struct {
	mu         sync.Mutex
	filed      map[filedAddr]int
	superseded map[filedAddr]string
	// redirects maps a filed address to the membership's address that
	// superseded it, or to "" when two superseded it with different ones.
	redirects map[string]string
}

type filedAddr struct {
	sender raftio.NodeInfo
	addr   string
}

func (f *filedAddrs) file(sender raftio.NodeInfo, addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.filed == nil {
		f.filed = make(map[filedAddr]int)
	}
	f.filed[filedAddr{sender, addr}]++
}

func (f *filedAddrs) unfile(sender raftio.NodeInfo, addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := filedAddr{sender, addr}
	if f.filed[key] > 1 {
		f.filed[key]--
	} else {
		delete(f.filed, key)
	}
}

// redirect reports the address that superseded addr: "" when two
// disagree; redirected is false when none did.
func (f *filedAddrs) redirect(addr string) (to string, redirected bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	to, redirected = f.redirects[addr]
	return to, redirected
}

// describedNodeMod is the modulus of the ids in dragonboat's description
// of a replica (logutil.DescribeNode, "[%05d:%05d]").
const describedNodeMod = 100000

// supersession is a registry conflict that supersedes a filing.
type supersession struct {
	filedAddr
	given string
	// again: the same filing was superseded by the same address before
	// (dragonboat files a member's address again as it restores a
	// snapshot). conflicting: it ended the filed address's redirect, for
	// another filing of that address was superseded by another address.
	again, conflicting bool
}

// supersede handles dragonboat's registry conflict (registryConflict: the
// replica's description, the address the registry holds, the one it was
// given): when the address held is one lockd filed for that replica while
// it was not a member, the given one supersedes it and the redirect is
// recorded; otherwise ok is false, and the conflict stays a panic.
func (f *filedAddrs) supersede(args []any) (s supersession, ok bool) {
	if len(args) != 3 {
		return s, false
	}
	described, _ := args[0].(string)
	shard, replica, parsed := parseDescribedNode(described)
	if !parsed {
		return s, false
	}
	old, given := fmt.Sprint(args[1]), fmt.Sprint(args[2])
	f.mu.Lock()
	defer f.mu.Unlock()
	for filed := range f.filed {
		if filed.addr == old && filed.sender.ShardID%describedNodeMod == shard && filed.sender.ReplicaID%describedNodeMod == replica {
			s, ok = supersession{filedAddr: filed, given: given}, true
			break
		}
	}
	if !ok {
		return s, false
	}
	if f.superseded == nil {
		f.superseded, f.redirects = make(map[filedAddr]string), make(map[string]string)
	}
	prev, seen := f.superseded[s.filedAddr]
	s.again = seen && prev == given
	f.superseded[s.filedAddr] = given
	switch to, redirected := f.redirects[old]; {
	case !redirected:
		f.redirects[old] = given
	case to != "" && to != given:
		f.redirects[old], s.conflicting = "", true
	}
	return s, true
}

// parseDescribedNode reads "[shard:replica]" as logutil.DescribeNode
// writes it (each id modulo describedNodeMod).
func parseDescribedNode(s string) (shard, replica uint64, ok bool) {
	inner, opened := strings.CutPrefix(s, "[")
	inner, closed := strings.CutSuffix(inner, "]")
	a, b, split := strings.Cut(inner, ":")
	if !opened || !closed || !split {
		return 0, 0, false
	}
	shard, errA := strconv.ParseUint(a, 10, 64)
	replica, errB := strconv.ParseUint(b, 10, 64)
	return shard, replica, errA == nil && errB == nil
}

// repairRegistryConflict is the answer to dragonboat's registry
// conflict: true, once logged and counted, when the conflict supersedes an
// address lockd filed for a sender outside the membership (the registry
// keeps it, and returning from the panic there is safe: it is the last
// thing Registry.Add does); false when it must stay a panic.
func repairRegistryConflict(log zerolog.Logger, args []any) bool {
	s, ok := unknownFiled.supersede(args)
	if !ok {
		return false
	}
	if !s.again {
		forgedAddresses.Add(1)
		log.Error().Uint64("group", s.sender.ShardID).Uint64("replica", s.sender.ReplicaID).
			Str("first_addr", s.addr).Str("member_addr", s.given).
			Msg("raft: a frame from outside the membership gave this replica its first address; the transport dials the membership's instead")
	}
	if s.conflicting {
		log.Error().Str("first_addr", s.addr).
			Msg("raft: members of two ids superseded the same first address; the transport dials neither in its place")
	}
	return true
}
