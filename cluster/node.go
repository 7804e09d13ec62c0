// Package cluster is lockd's cluster mode: the engine's lock-rule core
// applied to the replicated state of G dragonboat v4 Raft groups, every
// group replicated on every node, keys placed by a stable hash of tenant
// and key. A Node is one process's NodeHost plus an engine.Backend, so the
// gnet server speaks the same wire protocol in both modes. It owns the
// replication, the replicated time and state, and this node's requests;
// it writes no lock rule of its own and never touches sockets of the
// client protocol. docs/cluster.md describes the design.
//
// Files by responsibility, in the order a request meets them:
//
//   - backend.go: the engine.Backend calls the server makes (Acquire,
//     Release, Keep, Abandon, Cancel, Flush, Shutdown's drain) and the
//     request registry: this node's requests awaiting their group, their
//     ids and their deadlines.
//   - proposer.go: a group's proposer (the one way to queue a command,
//     group commit, proposal slots, retries, re-sends on a leader
//     change).
//   - command.go: the log's batch and command format, and what of it
//     this build cannot read.
//   - clock.go: the node's monotonic clock, and the group's replicated
//     clock: the stamp a proposer puts on a batch and the rule by which
//     a replica moves time with it.
//   - fsm.go: the dragonboat state machine adapter, and the routing of
//     its answers to this node's requests.
//   - state.go: the replicated state and the apply of each command.
//
// and off that path:
//
//   - node.go: the Node, its groups, start and stop.
//   - config.go: the configuration, its defaults and checks, and the
//     data dir's record of them; check.go: CheckConfig and the Raft
//     exposure check.
//   - housekeeping.go: a group's periodic step (lease ends, dated
//     batches, leader changes, silent peers' and earlier runs' waiters,
//     orphan rechecks) and the loop that carries out its outbox.
//   - leases.go: a replica's lease deadlines on this node's clock.
//   - orphans.go: the release of grants nobody takes.
//   - snapshot.go: a group's snapshots and their format.
//   - membership.go, members_http.go: online membership changes and
//     their admin endpoint, and the liveness record of peers.
//   - version.go: the log format a group may write, the format
//     statements, and a replica's halt on what it cannot read.
//   - peerlink.go: the node's own messages to its peers (frames of kind
//     'L') and their dispatch.
//   - metrics.go: the counters, engine stats and the Prometheus
//     collector; inspect.go: the read-only lock inspection.
//
// The Raft transport is cluster/raftnet, the Raft log store
// cluster/logdb, dragonboat's logs cluster/raftlog, leader placement's
// policy cluster/placement, and the runtime
// monitor anchor internal/sysmonanchor; this package reaches them only
// through their exported calls.
//
// Locks: a group's fsm.mu is taken before its orphanQueue.mu (the
// housekeeping step), the only two held together. The node's regMu and a
// group's proposer.mu are held alone: Update releases fsm.mu before it
// hands answers to the registry (regMu), the registry releases regMu
// before it queues a command, and the proposer stamps a batch from the
// replica's atomics.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/cluster/logdb"
	"github.com/lockd/lockd/cluster/raftlog"
	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/sysmonanchor"
	"github.com/rs/zerolog"
)

// Node is one cluster process: a NodeHost running every group, and the
// engine.Backend the gnet server talks to.
type Node struct {
	cfg    Config
	log    zerolog.Logger
	nh     *dragonboat.NodeHost
	groups []*group

	idBase  atomic.Uint64 // waiter/request ids: random base, then +1
	idFirst uint64        // first id of this run (without the top bit)

	// regMu guards the request registry (reg, timers); it is held
	// alone (the package comment has the locks' order).
	regMu   sync.Mutex
	reg     map[uint64]*pending
	timers  engine.DeadlineHeap[*pending] // stale once done or re-armed
	wakeReg chan struct{}
	links   peerLinks        // send-agains to peers (peerlink.go)
	formats formatStatements // the log formats peers stated (version.go)
	// housekeepingDue wakes the housekeeping loop before its timer: a
	// group's leader changed.
	housekeepingDue chan struct{}

	inflight *engine.AdmissionGate
	waiters  *engine.AdmissionGate
	// quotas are the tenants' own gates. Their keys gates are asked with
	// the tenant's keys in the group's replica (AdmitCounted): keys come
	// and go on every node.
	quotas *engine.TenantQuotas

	tenants engine.Tenants // commands carry names: Namespaces are local to a process

	liveness peerLiveness

	shutting atomic.Bool
	stats    nodeStats
	obs      observations         // for /metrics (metrics.go)
	anchor   *sysmonanchor.Anchor // nil unless Config.MonitorAnchor

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var _ engine.Backend = (*Node)(nil)

// shardID names group idx of a cluster of groups groups. The group count
// is part of the id because it is part of key placement: a node started
// with another --groups than its peers then shares no Raft group with
// them and answers unavailable, instead of placing a key in a group where
// the others do not look for it and granting it twice.
func shardID(groups, idx int) uint64 { return uint64(groups)<<32 | uint64(idx+1) }

// Start creates the NodeHost and starts (or, with an existing data dir,
// restarts) every group. It returns before leaders are elected; see
// WaitReady.
func Start(cfg Config) (*Node, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	if err := checkRaftExposure(cfg); err != nil {
		return nil, err
	}
	if err := checkMeta(&cfg); err != nil {
		return nil, err
	}
	raftlog.Setup(cfg.Logger)
	n, err := newNode(cfg)
	if err != nil {
		return nil, err
	}
	sources := &raftnet.Sources{}
	// Before the NodeHost: the transport may already take a peer's
	// send-again, whose link goroutines end with it.
	n.ctx, n.cancel = context.WithCancel(context.Background())
	nh, err := dragonboat.NewNodeHost(n.nodeHostConfig(sources))
	if err != nil {
		n.cancel()
		return nil, fmt.Errorf("cluster: start NodeHost: %w", err)
	}
	n.nh = nh
	sources.Attach(nh)
	for i := range cfg.Groups {
		g := n.newGroup(i)
		n.groups = append(n.groups, g)
		if err := n.startReplica(g); err != nil {
			n.cancel()
			n.wg.Wait()
			nh.Close()
			return nil, fmt.Errorf("cluster: start group %d: %w", g.shardID, err)
		}
	}
	n.run()
	n.log.Info().Uint64("node", cfg.NodeID).Str("raft", cfg.RaftAddr).Int("groups", cfg.Groups).
		Str("data_dir", cfg.DataDir).Msg("cluster node started")
	return n, nil
}

// newNode is a node's state before its NodeHost: the request registry,
// the gates, the liveness record and this run's request ids.
func newNode(cfg Config) (*Node, error) {
	n := &Node{
		cfg:             cfg,
		log:             cfg.Logger,
		reg:             make(map[uint64]*pending),
		wakeReg:         make(chan struct{}, 1),
		housekeepingDue: make(chan struct{}, 1),
		inflight:        engine.NewAdmissionGate(cfg.MaxInflight),
		waiters:         engine.NewAdmissionGate(cfg.MaxWaiters),
		quotas:          engine.NewTenantQuotas(cfg.TenantLimits),
	}
	n.liveness.init(cfg.NodeID, cfg.Peers)
	n.links.n = n
	if cfg.MonitorAnchor {
		n.anchor = sysmonanchor.New()
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, err
	}
	// Ids must not repeat across restarts of this node (a replayed grant
	// for an old id is released as an orphan), nor be 0.
	n.idBase.Store(binary.BigEndian.Uint64(seed[:]) >> 1)
	n.idFirst = n.idBase.Load() + 1
	return n, nil
}

// nodeHostConfig is the NodeHost's configuration: its dirs and RTT, the
// log store, one step and one apply worker, the leader listener and
// lockd's own transport.
func (n *Node) nodeHostConfig(sources *raftnet.Sources) config.NodeHostConfig {
	cfg := n.cfg
	nhc := config.NodeHostConfig{
		DeploymentID:   raftnet.DeploymentID,
		NodeHostDir:    cfg.DataDir,
		WALDir:         cfg.DataDir,
		RTTMillisecond: uint64(max(cfg.RTT/time.Millisecond, 1)),
		RaftAddress:    cfg.RaftAddr,
		Expert:         config.ExpertConfig{LogDB: config.GetTinyMemLogDBConfig(), FS: cfg.FS},
	}
	nhc.Expert.LogDB.Shards = cfg.LogDBShards
	nhc.Expert.LogDBFactory = logdb.Factory{Saves: &n.obs.logSaves}
	nhc.Expert.Engine = config.GetDefaultEngineConfig()
	nhc.Expert.Engine.ExecShards = cfg.ExecShards
	// One apply worker: each of dragonboat's 16 default workers wakes 5
	// times a second even when idle, 80 of an idle node's ~250 goroutine
	// wake-ups a second. Applying is cheap beside the fsync and the
	// transport, and one worker for 3 groups is no slower at 256 and
	// 1024 callers (docs/cluster.md, Performance).
	nhc.Expert.Engine.ApplyShards = 1
	nhc.RaftEventListener = leaderListener{n}
	nhc.Expert.TransportFactory = raftnet.Factory{Log: cfg.Logger, TLS: cfg.RaftTLS, Sources: sources, Heard: n.heardFrom, Budget: raftnet.NewFrameBudget(cfg.RaftFrameBudget),
		FramesSent: &n.stats.raftFramesSent, StreamsOpened: &n.stats.raftStreams, OnPeer: n.onServedFrame, Listener: cfg.RaftListener}
	return nhc
}

// newGroup is this node's side of group idx, its first command the
// forget of this node's earlier runs' waiters.
func (n *Node) newGroup(idx int) *group {
	perGroup := max(1, (n.cfg.MaxKeys+n.cfg.Groups-1)/n.cfg.Groups)
	g := &group{n: n, idx: idx, shardID: shardID(n.cfg.Groups, idx), maxKeys: perGroup, proposer: proposer{
		kick: make(chan struct{}, 1), slots: make(chan struct{}, proposalsInFlight), freed: make(chan struct{}, 1)}}
	g.buf = make([]byte, datedHeaderLen, 4096)
	g.house.forgotten = make(map[uint64]bool)
	forget := n.pastRunsForget()
	g.queue(func(b []byte) []byte { return append(b, forget...) })
	g.newLeader.Store(new(make(chan struct{})))
	return g
}

// startReplica starts g's replica on this node's NodeHost: a new group
// from --peers, a restart from its log, or a joining node's empty one.
func (n *Node) startReplica(g *group) error {
	initial, join := make(map[uint64]dragonboat.Target, len(n.cfg.Peers)), false
	for id, addr := range n.cfg.Peers {
		initial[id] = addr
	}
	switch {
	case n.nh.HasNodeInfo(g.shardID, n.cfg.NodeID):
		initial = nil // a restart: membership comes from the log
	case n.cfg.Join:
		initial, join = nil, true // membership comes from the leader that adds us
	}
	create := func(uint64, uint64) sm.IStateMachine {
		f := newFSM(g, n.cfg.FirstToken)
		g.fsm.Store(f)
		return f
	}
	return n.nh.StartReplica(initial, join, create, n.replicaConfig(g))
}

// replicaConfig is g's Raft configuration on this node.
func (n *Node) replicaConfig(g *group) config.Config {
	return config.Config{
		ReplicaID:   n.cfg.NodeID,
		ShardID:     g.shardID,
		CheckQuorum: true,
		// A node cut off keeps campaigning; without PreVote its raised
		// term makes every healthy leader step down when the cut heals,
		// stalling the majority for most of a second.
		PreVote:            true,
		ElectionRTT:        n.cfg.ElectionRTT,
		HeartbeatRTT:       n.cfg.HeartbeatRTT,
		SnapshotEntries:    n.cfg.SnapshotEntries,
		CompactionOverhead: n.cfg.CompactionOverhead,
		// A batch's commands repeat their clients' ids and much of their
		// keys: with Snappy a loaded node writes about a third of the
		// bytes per command to its disk (WAL, flushes, compactions), its
		// followers' syncs end sooner, and entries are smaller on the wire
		// and in memory too (docs/cluster.md, Performance).
		// Dragonboat decodes an entry before Update, whichever build
		// proposed it.
		EntryCompressionType: config.Snappy,
		// No MaxInMemLogSize: with one, dragonboat refuses proposals
		// while a replica's unapplied in-memory log is over it, and for
		// that every follower reports its log to the leader each election
		// timeout, a message per group and follower that is a large share
		// of an idle cluster's CPU (docs/cluster.md, Performance). Applying is the cheapest step of a commit here (an
		// in-memory table), far below the fsync every replica makes before
		// it acknowledges, so a replica's unapplied entries stay few; what
		// goes into the log is bounded by the nodes' admission gates.
	}
}

// run starts the node's goroutines: a proposer per group, the
// housekeeping loop, the request timers and the monitor anchor; then every group's
// first proposal.
func (n *Node) run() {
	for _, g := range n.groups {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); g.proposeLoop(n.ctx) }()
	}
	n.wg.Add(3)
	go func() { defer n.wg.Done(); n.housekeepingLoop(n.ctx) }()
	go func() { defer n.wg.Done(); n.timerLoop(n.ctx) }()
	go func() { defer n.wg.Done(); n.formatLoop(n.ctx) }()
	if n.anchor != nil {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.anchor.Run(n.ctx) }()
	}
	for _, g := range n.groups {
		g.propose()
	}
}

// Close stops the node's goroutines and its NodeHost. Call it after the
// server using it is closed. Safe to call more than once.
func (n *Node) Close() {
	n.closeOnce.Do(func() {
		n.cancel()
		n.wg.Wait()
		n.nh.Close()
	})
}

// NodeHost exposes the dragonboat NodeHost, for tests and tools.
func (n *Node) NodeHost() *dragonboat.NodeHost { return n.nh }

// ID is this node's replica id.
func (n *Node) ID() uint64 { return n.cfg.NodeID }

// Groups is the number of Raft groups.
func (n *Node) Groups() int { return len(n.groups) }

// GroupOf is the group index (0-based; Raft shard id = index+1) of a key.
func (n *Node) GroupOf(tenant string, key []byte) int { return groupOf(tenant, key, len(n.groups)) }

// Leader reports this node's view of group idx's leader (0 when unknown).
func (n *Node) Leader(idx int) uint64 { return n.groups[idx].leader() }

// WaitReady waits until every group has a known leader.
func (n *Node) WaitReady(ctx context.Context) error {
	for {
		ready := true
		for i := range n.groups {
			if n.Leader(i) == 0 {
				ready = false
				break
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: groups without a leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Token is this replica's (possibly lagging) view of the current token of
// a key, 0 when free. For tests and tools.
func (n *Node) Token(tenant string, key []byte) uint64 {
	f := n.groups[n.GroupOf(tenant, key)].fsm.Load()
	if f == nil {
		return 0
	}
	return f.tokenOf(lockKey([]byte(tenant), key))
}

// Run returns when ctx is done: the node's goroutines run from Start to
// Close.
func (n *Node) Run(ctx context.Context) { <-ctx.Done() }
