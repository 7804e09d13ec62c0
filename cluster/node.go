// Package cluster is lockd's cluster mode: the engine's lock-rule core
// applied to the replicated state of G dragonboat v4 Raft groups, every
// group replicated on every node, keys placed by a stable hash of tenant
// and key. A Node is one process's NodeHost plus an engine.Backend, so the
// gnet server speaks the same wire protocol in both modes. It owns the
// replication, the replicated time and state, and this node's requests;
// it writes no lock rule of its own and never touches sockets of the
// client protocol. docs/cluster.md describes the design.
//
// Files by responsibility:
//
//   - node.go: the Node, start, stop, drain, the data dir's record.
//   - config.go: the configuration, its defaults and checks; check.go:
//     CheckConfig and the Raft exposure check.
//   - backend.go: the engine.Backend side the server calls.
//   - registry.go: this node's requests awaiting their group, their
//     timers, and the routing of the state machine's answers to them.
//   - proposer.go: a group's proposer (group commit, proposal slots,
//     retries, re-sends on a leader change).
//   - command.go: the log's batch and command format.
//   - fsm.go: the dragonboat state machine adapter; state.go: the
//     replicated state and the apply of each command.
//   - expiry.go: the periodic pass of a group (lease ends, leader changes,
//     silent peers' waiters) and the stamping of applied leases.
//   - placement.go: leader placement; orphans.go: the release of grants
//     nobody takes.
//   - membership.go, members_http.go: online membership changes and
//     their admin endpoint, and the liveness record of peers.
//   - version.go: the log format a group may write, the format
//     statements, and a replica's halt on what it cannot read.
//   - peerlink.go: the node's own messages to its peers (frames of kind
//     'L') and their dispatch.
//   - logger.go: dragonboat's logs into zerolog; metrics.go: the
//     Prometheus collector; monitor.go: the runtime monitor anchor;
//     inspect.go: the read-only lock inspection.
//
// The Raft transport is cluster/raftnet and the Raft log store
// cluster/logdb; this package reaches them only through their exported
// factories and framing calls.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/cluster/logdb"
	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/engine"
	"github.com/rs/zerolog"
)

// Node is one cluster process: a NodeHost running every group, and the
// engine.Backend the gnet server talks to.
type Node struct {
	cfg    Config
	log    zerolog.Logger
	nh     *dragonboat.NodeHost
	groups []*group
	start  time.Time

	idBase  atomic.Uint64 // waiter/request ids: random base, then +1
	idFirst uint64        // first id of this run (without the top bit)

	// regMu guards the request registry (reg, timers). Lock order:
	// regMu before a group's fsm.mu and group.mu. No path holds them
	// together: the state machine hands its answers to the registry
	// after it releases fsm.mu (group.deliver), and the registry releases
	// regMu before it queues a command.
	regMu   sync.Mutex
	reg     map[uint64]*pending
	timers  engine.DeadlineHeap[*pending] // stale once done or re-armed
	wakeReg chan struct{}
	links   peerLinks        // send-agains to peers (peerlink.go)
	formats formatStatements // the log formats peers stated (version.go)
	// wakeExpiry wakes the expiry driver before its timer: a group's
	// leader changed.
	wakeExpiry chan struct{}

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
	obs      observations   // for /metrics (metrics.go)
	anchor   *monitorAnchor // nil unless Config.MonitorAnchor

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type nodeStats struct {
	proposals       atomic.Uint64 // Raft proposals made
	commands        atomic.Uint64 // commands carried by them
	proposeRetries  atomic.Uint64
	proposeFailures atomic.Uint64
	unavailable     atomic.Uint64
	orphanReleases  atomic.Uint64
	abandoned       atomic.Uint64 // grants nobody takes, handed to the orphan releases
	expires         atomic.Uint64
	leaderTransfers atomic.Uint64
	raftFramesSent  atomic.Uint64 // Raft message frames written to peers
	raftStreams     atomic.Uint64 // Raft message connections dialed, redials included
}

var _ engine.Backend = (*Node)(nil)

// metaFile pins the group count, node id and log format of a data dir.
const metaFile = "lockd-cluster.json"

type meta struct {
	NodeID uint64 `json:"node_id"`
	Groups int    `json:"groups"`
	// LogFormat is the log format the data dir was created at
	// (version.go); the builds of the formats before logFormatBase wrote
	// none.
	LogFormat int `json:"log_format"`
}

// ErrOldDataDir refuses a data dir written by a build of a log format
// before logFormatBase.
var ErrOldDataDir = errors.New("cluster: data dir of an unreleased log format")

// checkMeta ties a data dir to the node id and group count it was
// bootstrapped with. A Groups of 0 takes the dir's count (DefaultGroups
// for a new dir), so a restart needs no --groups and a later change of
// the default cannot strand a cluster bootstrapped before it. A dir of a
// log format before logFormatBase is refused: its log and snapshots are
// of forms this build does not read, and no release wrote them, so there
// is no upgrade path.
func checkMeta(cfg *Config) error {
	var have *meta // nil: a new data dir, or files kept in cfg.FS
	path := filepath.Join(cfg.DataDir, metaFile)
	if cfg.FS == nil {
		if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
			return fmt.Errorf("cluster: data dir: %w", err)
		}
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			have = new(meta)
			if err := json.Unmarshal(b, have); err != nil {
				return fmt.Errorf("cluster: %s: %w", path, err)
			}
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("cluster: %w", err)
		}
	}
	if have != nil && have.LogFormat < logFormatBase {
		return fmt.Errorf("%w: %s was written by a build before v0.1.0 (a log format before %d), which this build cannot read; "+
			"move the data dir aside and start this node on an empty one: with --join to add it to a running cluster, or bootstrap a new cluster from empty data dirs",
			ErrOldDataDir, cfg.DataDir, logFormatBase)
	}
	if cfg.Groups == 0 {
		cfg.Groups = DefaultGroups
		if have != nil {
			cfg.Groups = have.Groups
		}
	}
	want := meta{NodeID: cfg.NodeID, Groups: cfg.Groups, LogFormat: logFormatBase}
	switch {
	case cfg.FS != nil:
		return nil
	case have == nil:
		b, _ := json.Marshal(want)
		return os.WriteFile(path, b, 0o640)
	case have.NodeID != want.NodeID || have.Groups != want.Groups:
		return fmt.Errorf("cluster: %s was bootstrapped as node %d with %d groups; --node-id %d --groups %d cannot reuse it",
			cfg.DataDir, have.NodeID, have.Groups, cfg.NodeID, cfg.Groups)
	}
	return nil
}

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
	setupLogging(cfg.Logger)
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
		cfg:        cfg,
		log:        cfg.Logger,
		start:      time.Now(),
		reg:        make(map[uint64]*pending),
		wakeReg:    make(chan struct{}, 1),
		wakeExpiry: make(chan struct{}, 1),
		inflight:   engine.NewAdmissionGate(cfg.MaxInflight),
		waiters:    engine.NewAdmissionGate(cfg.MaxWaiters),
		quotas:     engine.NewTenantQuotas(cfg.TenantLimits),
	}
	n.liveness.init(cfg.NodeID, cfg.Peers)
	n.links.n = n
	if cfg.MonitorAnchor {
		n.anchor = newMonitorAnchor()
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
	g := &group{n: n, idx: idx, shardID: shardID(n.cfg.Groups, idx), maxKeys: perGroup,
		kick: make(chan struct{}, 1), slots: make(chan struct{}, proposalsInFlight), freed: make(chan struct{}, 1)}
	g.buf = make([]byte, datedHeaderLen, 4096)
	g.forgotten = make(map[uint64]bool)
	g.forgetPastRuns()
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

// run starts the node's goroutines: a proposer per group, the expiry
// driver, the request timers and the monitor anchor; then every group's
// first proposal.
func (n *Node) run() {
	for _, g := range n.groups {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); g.proposeLoop(n.ctx) }()
	}
	n.wg.Add(3)
	go func() { defer n.wg.Done(); n.expiryLoop(n.ctx) }()
	go func() { defer n.wg.Done(); n.timerLoop(n.ctx) }()
	go func() { defer n.wg.Done(); n.formatLoop(n.ctx) }()
	if n.anchor != nil {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.anchor.run(n.ctx) }()
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
func (n *Node) Leader(idx int) uint64 {
	id, _, ok, err := n.nh.GetLeaderID(n.groups[idx].shardID)
	if err != nil || !ok {
		return 0
	}
	return id
}

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

func (n *Node) clock() time.Duration { return time.Since(n.start) }

func (n *Node) nextID() uint64 { return n.idBase.Add(1) | 1<<63 }

// runIDSpan bounds the request ids one run of a node issues.
const runIDSpan = 1 << 40

// heardFrom records a Raft message from replica (the transport's hook).
func (n *Node) heardFrom(replica uint64) { n.liveness.heard(replica, n.clock()) }

// ownRun reports whether id was issued by this run of the node: a grant to
// an id of a previous run may have been delivered, so it must not be
// released here (its lease bounds it).
func (n *Node) ownRun(id uint64) bool {
	v := id &^ (1 << 63)
	return v >= n.idFirst && v <= n.idBase.Load()
}

// Shutdown starts the node's drain: it first hands the leadership of the
// groups it leads to a live peer (handOverLeadership), so that the
// cluster does not wait out an election when it stops, then answers its
// queued waiters ShuttingDown and drops them from their queues: they were
// never granted. An acquire still on its way through Raft gets its real
// answer (a grant, T, or E unavailable), or ShuttingDown if it applies as
// queued; releases and keeps are answered as usual. Locks stay in the
// cluster.
func (n *Node) Shutdown() {
	n.handOverLeadership()
	var done []*pending
	n.regMu.Lock()
	n.shutting.Store(true)
	for _, p := range n.reg {
		if p.queued && n.finishLocked(p) {
			done = append(done, p)
		}
	}
	n.regMu.Unlock()
	for _, p := range done {
		p.group.cancel(p.key, p.id)
		p.w.Resolve(p.owner, engine.Result{Outcome: engine.ShuttingDown})
	}
}

// handOverLeadership asks for every group this node leads to pass to the
// peer heard from most recently, and waits until none is led here any
// more or handOverTimeout passed (a transfer Raft gives up leaves this
// node leader until it stops; its peers then elect after the election
// timeout, as after a crash).
//
// Under load the hand-over fails often without a pause first: dragonboat's
// target skips the campaign a TimeoutNow asks for while it has committed
// entries it has not applied, and its followers apply a moment after they
// learn of a commit, which under load is always. So the leader first asks
// every voter, and itself, to start no proposal (peerHold) and waits two
// heartbeats: the last proposals commit, the commit index reaches the
// followers with a heartbeat, and they apply it. The followers' requests
// wait in their batches meanwhile, and go to the new leader.
func (n *Node) handOverLeadership() {
	holding := false
	for i, g := range n.groups {
		if n.Leader(i) == n.cfg.NodeID {
			g.hold(n.cfg.NodeID, n.clock()+n.handOverTimeout())
			n.sendToVoters(g, appendHold(nil, n.cfg.NodeID, g.shardID))
			holding = true
		}
	}
	if holding {
		time.Sleep(2 * time.Duration(n.cfg.HeartbeatRTT) * n.cfg.RTT)
	}
	deadline := time.Now().Add(n.handOverTimeout())
	for {
		asked := 0
		for i, g := range n.groups {
			if n.Leader(i) != n.cfg.NodeID {
				continue
			}
			if to := n.liveness.freshest(n.clock(), n.cfg.ForgetAfter); to != 0 {
				n.moveLeader(g, to)
				asked++
			}
		}
		if asked == 0 {
			return // nothing led here, or no live peer to take it
		}
		if time.Now().After(deadline) {
			for i, g := range n.groups {
				if n.Leader(i) == n.cfg.NodeID {
					n.resendProposals(g) // the followers' it dropped meanwhile
				}
			}
			return
		}
		time.Sleep(n.cfg.RTT)
	}
}

// handOverTimeout bounds a drain's hand-over: two election timeouts.
func (n *Node) handOverTimeout() time.Duration {
	return 2 * time.Duration(n.cfg.ElectionRTT) * n.cfg.RTT
}

// Run returns when ctx is done: the node's goroutines run from Start to
// Close.
func (n *Node) Run(ctx context.Context) { <-ctx.Done() }
