package cluster

// This file owns the cluster's log format, which is what lets the nodes
// of a cluster run different builds during a rolling upgrade: the
// formats, the statement by which each node tells its peers the newest
// format it reads, the raise of a group's format by its leader once every
// member reads the newer one, the check that keeps a node of an older
// build out of a group whose format it cannot read, and a replica's halt
// when it meets what its build cannot read anyway (a batch version, a
// command kind, a format or a snapshot version it does not know). It
// decides no lock rule; state.go applies cmdFormat like any command.
//
// The rule (docs/cluster.md, Upgrades): a group writes a command kind or
// snapshot form of format v only once its replicated format is v or more,
// and its leader raises the format to v only when every member of the
// group has stated that it reads v. Writers check f.state.format (under
// the fsm's lock) against the format their form belongs to.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lockd/lockd/cluster/raftnet"
)

// Log formats: what a group may write. Formats 1 and 2 were written by
// the builds before the first release (with grant claims, witnesses and
// revokes); this build reads neither, and refuses their data dirs at
// start (checkMeta), since nothing of them was released.
const (
	// logFormat3 is the oldest format this build reads, and every
	// group's when it is created: batch version 2, commands A R K D F C
	// N, snapshot version 7.
	logFormat3 = 3
	// logFormat4 adds SPEC §6a: acquires tagged with their requester
	// (cmdAcquireBy), ABANDON (cmdAbandon), and snapshot version 8 (the
	// requesters of grants and waiters, and the tombstones). A node
	// serves §6a only once every group is at format 4 (ServesAbandon).
	logFormat4 = 4
	// logFormat5 dates batches by the leader's monotonic clock rather
	// than proposers' wall clocks (clock.go): batch version 3 and
	// snapshot version 9 (the group clock's leadership, and the origins
	// of starts not yet dated).
	logFormat5 = 5
	// logFormatBase is the format a new group starts at, and the oldest
	// this build reads.
	logFormatBase = logFormat3
	// logFormatNewest is the newest format this build reads and states.
	logFormatNewest = logFormat5
)

// The statement of a node's format, inside a transport frame of kind
// 'L' (peerlink.go, onPeerFrame):
//
//	'n' | node u64 | format u32
//
// A node sends its own to a peer, which records it and answers with its
// own on the same connection. A peer that does not answer states none.
const (
	peerFormat   = 'n'
	statementLen = 1 + 8 + 4
	// defaultStatementInterval is Config.StatementInterval's default:
	// often, because a node's clients get SPEC §6a only on connections
	// greeted once every group rose (ServesAbandon), and a new cluster
	// starts at the base format.
	defaultStatementInterval = 250 * time.Millisecond
	// statementFresh is how long a peer's statement counts: a peer
	// restarted on an older build stops answering, and its statement
	// lapses before a leader could raise a format on it.
	statementFresh = 3 * time.Second
	// statementTimeout bounds one exchange of statements with a peer.
	statementTimeout = 500 * time.Millisecond
)

// ErrMemberFormat refuses to add a node whose build cannot read the
// format of the cluster's groups.
var ErrMemberFormat = errors.New("cluster: the node's build cannot read the groups' log format")

// formatStatements are the formats the node's peers stated, when.
type formatStatements struct {
	mu   sync.Mutex
	seen map[uint64]statement
	// passes counts the format loop's passes, so that a test can wait
	// for one that would have raised a format.
	passes atomic.Uint64
}

type statement struct {
	format uint32
	at     time.Duration // the node's clock when heard
}

func (s *formatStatements) record(node uint64, format uint32, at time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = make(map[uint64]statement)
	}
	s.seen[node] = statement{format: format, at: at}
}

// of is the format node stated within statementFresh of now, 0 when it
// stated none.
func (s *formatStatements) of(node uint64, now time.Duration) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.seen[node]
	if !ok || now-st.at > statementFresh {
		return 0
	}
	return st.format
}

func appendStatement(b []byte, node uint64, format uint32) []byte {
	b = append(b, peerFormat)
	b = binary.BigEndian.AppendUint64(b, node)
	return binary.BigEndian.AppendUint32(b, format)
}

// readStatement decodes a statement's body (after the 'n').
func readStatement(b []byte) (node uint64, format uint32, ok bool) {
	if len(b) < statementLen-1 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]), true
}

// onStatement records a peer's statement and, on a connection the peer
// opened (sink), answers with this node's own.
func (n *Node) onStatement(b []byte, sink replySink) {
	node, format, ok := readStatement(b)
	if !ok || node == 0 || node == n.cfg.NodeID {
		return
	}
	n.formats.record(node, format, n.clock())
	if sink != nil {
		sink.reply(appendStatement(nil, n.cfg.NodeID, logFormatNewest))
	}
}

// exchangeStatements states this node's format to the peer at addr and
// returns the peer's, an error when it does not answer within
// statementTimeout (a peer that is down).
func (n *Node) exchangeStatements(ctx context.Context, addr string) (uint64, uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	conn, err := raftnet.Dial(ctx, n.cfg.RaftTLS, n.log, addr)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := raftnet.WriteFrame(conn, raftnet.FrameLockd, appendStatement(nil, n.cfg.NodeID, logFormatNewest), time.Until(deadline)); err != nil {
		return 0, 0, err
	}
	if err := conn.SetReadDeadline(deadline); err != nil {
		return 0, 0, err
	}
	for {
		kind, body, err := raftnet.ReadFrame(conn, nil)
		if err != nil {
			return 0, 0, err
		}
		if kind == raftnet.FrameLockd && len(body) > 0 && body[0] == peerFormat {
			if node, format, ok := readStatement(body[1:]); ok {
				return node, format, nil
			}
		}
	}
}

// stateFormat exchanges statements with every peer of this node's groups
// at once; what they answer is recorded.
func (n *Node) stateFormat(ctx context.Context) {
	var wg sync.WaitGroup
	for peer, addr := range n.peersOfGroups() {
		wg.Go(func() {
			node, format, err := n.exchangeStatements(ctx, addr)
			if err == nil && node == peer {
				n.formats.record(peer, format, n.clock())
			}
		})
	}
	wg.Wait()
}

// peersOfGroups is every other member of this node's groups, as this node
// last applied their membership, with its Raft address.
func (n *Node) peersOfGroups() map[uint64]string {
	peers := make(map[uint64]string)
	info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	if info != nil {
		for _, s := range info.ShardInfoList {
			for id, addr := range s.Replicas {
				peers[id] = addr
			}
		}
	}
	delete(peers, n.cfg.NodeID)
	return peers
}

// formatLoop states this node's format and raises its groups' while some
// group is below the newest, asks for a snapshot of each group once its
// format rose (so that an older build refuses the data dir at start
// instead of replaying past a format it cannot read), and hands off the
// leadership of a group whose replica halted.
func (n *Node) formatLoop(ctx context.Context) {
	tick := time.NewTicker(n.cfg.StatementInterval)
	defer tick.Stop()
	snapshotted := make([]uint32, len(n.groups)) // the format each group's snapshot was asked at
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		behind := false
		for _, g := range n.groups {
			f := g.fsm.Load()
			behind = behind || f != nil && f.halted.Load() == nil && f.format() < logFormatNewest
		}
		if behind {
			n.stateFormat(ctx)
		}
		for i, g := range n.groups {
			f := g.fsm.Load()
			switch {
			case f == nil:
			case f.halted.Load() != nil:
				n.leaveHaltedGroup(g)
			case f.format() < logFormatNewest:
				if n.Leader(i) == n.cfg.NodeID {
					n.raiseFormat(ctx, g)
				}
			case snapshotted[i] < f.format():
				if n.snapshotGroup(ctx, g) {
					snapshotted[i] = f.format()
				}
			}
		}
		n.formats.passes.Add(1)
	}
}

// raiseFormat proposes g's format to logFormatNewest when every member
// of g stated it reads it. The membership is read through Raft (the
// leader's latest), so a member added since the last statements counts.
func (n *Node) raiseFormat(ctx context.Context, g *group) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ProposeTimeout)
	defer cancel()
	m, err := n.nh.SyncGetShardMembership(ctx, g.shardID)
	if err != nil {
		return
	}
	now := n.clock()
	for _, members := range []map[uint64]string{m.Nodes, m.NonVotings, m.Witnesses} {
		for id := range members {
			if id != n.cfg.NodeID && n.formats.of(id, now) < logFormatNewest {
				return
			}
		}
	}
	// A batch of its own: no request's command waits on the raise. In
	// the form the group reads until it rose, stamped as that form is
	// (clock.go): the first leader-dated batch continues from its time.
	b := make([]byte, headerLen, headerLen+16)
	putHeader(b, n.cfg.wall().UnixNano(), 1)
	b = appendFormat(b, logFormatNewest)
	if _, err := n.nh.SyncPropose(ctx, n.nh.GetNoOPSession(g.shardID), b); err != nil {
		n.log.Debug().Err(err).Uint64("group", g.shardID).Msg("log format raise not committed; asked again")
		return
	}
	n.log.Info().Uint64("group", g.shardID).Int("format", logFormatNewest).Msg("group log format raised: every member reads it")
}

// snapshotGroup asks for a snapshot of g's replica here; it reports
// whether one was taken (or none was needed).
func (n *Node) snapshotGroup(ctx context.Context, g *group) bool {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ProposeTimeout)
	defer cancel()
	_, err := n.nh.SyncRequestSnapshot(ctx, g.shardID, dragonboat.SnapshotOption{})
	return err == nil || errors.Is(err, dragonboat.ErrRejected)
}

// leaveHaltedGroup hands the leadership of g, whose replica here halted,
// to a peer: a halted leader would time leases and propose their ends on
// a state it no longer applies.
func (n *Node) leaveHaltedGroup(g *group) {
	if n.Leader(g.idx) != n.cfg.NodeID {
		return
	}
	if to := n.liveness.freshest(n.clock(), n.cfg.ForgetAfter); to != 0 {
		n.moveLeader(g, to)
	}
}

// checkJoinerFormat refuses to add the node id at addr to g when its build
// cannot read g's format: it must state one at least as new. A group at
// the base format needs no statement: every build that joins it reads
// the base (a build of the formats before it halts at the group's first
// batch, batchVersion).
func (n *Node) checkJoinerFormat(ctx context.Context, g *group, id uint64, addr string) error {
	f := g.fsm.Load()
	if f == nil || f.format() <= logFormatBase {
		return nil
	}
	node, format, err := n.exchangeStatements(ctx, addr)
	switch {
	case err == nil && node != id:
		return fmt.Errorf("group %d: %s answered as node %d, not %d: %w", g.shardID, addr, node, id, ErrMemberFormat)
	case err != nil:
		return fmt.Errorf("group %d is at log format %d; node %d at %s stated none (%v): %w",
			g.shardID, f.format(), id, addr, err, ErrMemberFormat)
	case format < f.format():
		return fmt.Errorf("group %d is at log format %d; node %d at %s reads up to %d: %w", g.shardID, f.format(), id, addr, format, ErrMemberFormat)
	}
	return nil
}

// format is the group's log format as this replica applied it.
func (f *fsm) format() uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.format
}

// halt stops this replica applying its group, for good in this process:
// it met what (at entry index, 0 for a snapshot) that its build cannot
// read. Skipping it would leave this replica's state different from its
// group's; applying nothing more and refusing to snapshot keeps its data
// dir as it was, so that a newer build started on it replays the log from
// the last snapshot. Called with f.mu held.
func (f *fsm) halt(index uint64, what error) {
	n := f.g.n
	at := "a snapshot"
	if index != 0 {
		at = fmt.Sprintf("log entry %d", index)
	}
	reason := fmt.Sprintf("group %d halted at %s: %v; this build (%s) cannot apply it: start a build that reads it on the same data dir",
		f.g.shardID, at, what, n.cfg.buildName())
	if f.halted.CompareAndSwap(nil, &reason) {
		n.log.Error().Uint64("group", f.g.shardID).Uint64("index", index).Str("build", n.cfg.buildName()).
			Err(what).Msg("replica halted: " + reason)
	}
}

// buildName is the build named in a halted replica's error.
func (c *Config) buildName() string {
	if c.Build == "" {
		return "unnamed build"
	}
	return c.Build
}

// HaltedGroups is why each of this node's halted replicas halted, by
// group index; empty while every replica applies its group.
func (n *Node) HaltedGroups() map[int]string {
	out := make(map[int]string)
	for i, g := range n.groups {
		if f := g.fsm.Load(); f != nil {
			if r := f.halted.Load(); r != nil {
				out[i] = *r
			}
		}
	}
	return out
}

// LogFormat is group idx's log format as this node's replica applied it.
func (n *Node) LogFormat(idx int) int {
	f := n.groups[idx].fsm.Load()
	if f == nil {
		return logFormatBase
	}
	return int(f.format())
}
