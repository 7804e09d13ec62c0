// Package cluster is lockd's cluster mode: the lock rules of SPEC §5 as
// the deterministic state machine of G dragonboat v4 Raft groups, every
// group replicated on every node, keys placed by a stable hash of tenant
// and key. A Node is one process's NodeHost plus a server.Backend, so the
// gnet server speaks the same wire protocol in both modes. docs/cluster.md
// describes the design.
package cluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/server"
	"github.com/rs/zerolog"
)

// Defaults of Config.
const (
	// DefaultGroups is 3: every group's leader pays a fixed cost per Raft
	// proposal (an entry, a fsync'd step on every replica, ~7 transport
	// messages) and batches only what its own node queued for that
	// group, so more groups mean smaller batches and more proposals for
	// the same load. Measured with fsync on (docs/cluster.md,
	// Performance): 16 groups gave about half the lock cycles/s of 3 at
	// 64 and 256 callers, and 1.8x the idle CPU (ticks, heartbeats).
	DefaultGroups             = 3
	DefaultRTT                = 10 * time.Millisecond
	DefaultElectionRTT        = 30
	DefaultHeartbeatRTT       = 5
	DefaultSnapshotEntries    = 10000
	DefaultCompactionOverhead = 2000
	DefaultMaxInMemLogSize    = 8 << 20
	DefaultProposeTimeout     = 2 * time.Second
	// expiryTick is how often the expiry driver looks at its heaps; a
	// lease ends at most this much late on top of the apply lag.
	expiryTick = 10 * time.Millisecond
	// expireRetry re-arms a due lease whose expire proposal may be lost.
	expireRetry  = 500 * time.Millisecond
	deploymentID = 0x6c6f636b64 // "lockd"
	// proposalsInFlight per group and node: enough to overlap one batch's
	// commit with the next one's send, few enough that requests arriving
	// meanwhile are batched (group commit).
	proposalsInFlight = 2
	pipelineMin       = 16
)

// Config configures one cluster node.
type Config struct {
	NodeID   uint64            // this node's replica id, a key of Peers
	RaftAddr string            // this node's Raft address; must equal Peers[NodeID]
	Peers    map[uint64]string // every node, itself included: 3 or 5
	DataDir  string            // NodeHost directory; the same dir on restart rejoins
	Groups   int               // Raft groups, fixed at bootstrap (default 3)

	RTT                time.Duration // network round trip (default 10 ms)
	ElectionRTT        uint64        // election timeout in RTTs (default 30)
	HeartbeatRTT       uint64        // heartbeat interval in RTTs (default 5)
	SnapshotEntries    uint64        // snapshot every N applied entries per group
	CompactionOverhead uint64        // entries kept after a snapshot
	MaxInMemLogSize    uint64        // per group; over it proposals get ErrSystemBusy
	// ProposeTimeout bounds how long a request waits for its group to
	// commit it before the answer is E unavailable (default 2 s).
	ProposeTimeout time.Duration

	MaxKeys     int // live keys, all groups (each group gets its share)
	MaxWaiters  int // queued waiters on this node
	MaxInflight int // acquires in flight on this node, pending in Raft included
	// FirstToken starts every group's counter (default 1); the same on
	// every node. For tests of token exhaustion.
	FirstToken uint64

	// ExecShards is dragonboat's number of step workers; every worker
	// writes the Raft state of its groups with one fsync, so fewer
	// workers batch more groups into one fsync (default 1). LogDBShards
	// is the number of LogDB (Pebble) instances, each with its own WAL
	// (default 1); it is fixed when the data dir is created.
	ExecShards  uint64
	LogDBShards uint64

	// FixedLeaders turns leader placement off: a group's leadership then
	// stays wherever elections put it (placement.go).
	FixedLeaders bool

	// RaftTLS, when set, runs the Raft transport over mutual TLS
	// (LoadRaftTLS); nil is plain TCP.
	RaftTLS *tls.Config

	// FS, when set, keeps the NodeHost's files there (vfs.NewMem in tests).
	FS     config.IFS
	Logger zerolog.Logger
}

func (c *Config) applyDefaults() error {
	if c.Groups <= 0 {
		c.Groups = DefaultGroups
	}
	if c.RTT <= 0 {
		c.RTT = DefaultRTT
	}
	if c.ElectionRTT == 0 {
		c.ElectionRTT = DefaultElectionRTT
	}
	if c.HeartbeatRTT == 0 {
		c.HeartbeatRTT = DefaultHeartbeatRTT
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = DefaultSnapshotEntries
	}
	if c.CompactionOverhead == 0 {
		c.CompactionOverhead = DefaultCompactionOverhead
	}
	if c.MaxInMemLogSize == 0 {
		c.MaxInMemLogSize = DefaultMaxInMemLogSize
	}
	if c.ProposeTimeout <= 0 {
		c.ProposeTimeout = DefaultProposeTimeout
	}
	if c.ExecShards == 0 {
		c.ExecShards = 1
	}
	if c.LogDBShards == 0 {
		c.LogDBShards = 1
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = engine.DefaultMaxKeys
	}
	if c.MaxWaiters <= 0 {
		c.MaxWaiters = engine.DefaultMaxWaiters
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = engine.DefaultMaxInflight
	}
	switch {
	case c.NodeID == 0:
		return errors.New("cluster: --node-id must be >= 1")
	case len(c.Peers) < 1:
		return errors.New("cluster: --peers is empty")
	case c.Peers[c.NodeID] == "":
		return fmt.Errorf("cluster: --peers has no entry for node %d", c.NodeID)
	case c.RaftAddr == "":
		c.RaftAddr = c.Peers[c.NodeID]
	case c.RaftAddr != c.Peers[c.NodeID]:
		return fmt.Errorf("cluster: --raft-addr %s differs from --peers %d=%s", c.RaftAddr, c.NodeID, c.Peers[c.NodeID])
	case c.DataDir == "":
		return errors.New("cluster: --data-dir is required")
	}
	if c.DataDir == "" {
		return errors.New("cluster: --data-dir is required")
	}
	return nil
}

// ParsePeers reads "1=host:port,2=host:port,…".
func ParsePeers(s string) (map[uint64]string, error) {
	peers := make(map[uint64]string)
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		n, err := strconv.ParseUint(id, 10, 64)
		if !ok || err != nil || n == 0 || addr == "" {
			return nil, fmt.Errorf("cluster: peer %q is not N=HOST:PORT with N >= 1", part)
		}
		if _, dup := peers[n]; dup {
			return nil, fmt.Errorf("cluster: peer %d given twice", n)
		}
		peers[n] = addr
	}
	if len(peers) == 0 {
		return nil, errors.New("cluster: no peers")
	}
	return peers, nil
}

// Node is one cluster process: a NodeHost running every group, and the
// server.Backend the gnet server talks to.
type Node struct {
	cfg    Config
	log    zerolog.Logger
	nh     *dragonboat.NodeHost
	groups []*group
	start  time.Time

	idBase  atomic.Uint64 // waiter/request ids: random base, then +1
	idFirst uint64        // first id of this run (without the top bit)

	regMu   sync.Mutex
	reg     map[uint64]*pending
	timers  engine.DeadlineHeap[*pending] // stale once done or re-armed
	wakeReg chan struct{}

	inflight *engine.AdmissionGate
	waiters  *engine.AdmissionGate

	tenants engine.Tenants // commands carry names: Namespaces are local to a process

	shutting atomic.Bool
	stats    nodeStats
	// attemptTimeout bounds one Raft proposal attempt: about two election
	// timeouts, so a proposal lost with a dead leader is sent again to
	// the next one.
	attemptTimeout time.Duration

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
	expires         atomic.Uint64
	leaderTransfers atomic.Uint64
}

var _ server.Backend = (*Node)(nil)

// pending is a request of this node's connections awaiting its group.
type pending struct {
	id       uint64
	w        engine.Waiter
	owner    uint64
	start    time.Duration // node clock at receipt
	wait     time.Duration
	deadline time.Duration // Unavailable (proposal) or TimedOut (queued) at this instant
	// ungated marks a release or keep: it holds no gate, and it is still
	// answered after Shutdown.
	ungated bool
	queued  bool // the state machine queued it
	done    bool // resolved or cancelled
}

// group is this node's side of one Raft group.
type group struct {
	n       *Node
	idx     int
	shardID uint64
	maxKeys int
	fsm     atomic.Pointer[fsm]

	mu    sync.Mutex
	buf   []byte // header space + commands not yet proposed
	count uint32
	// orphans are grants to waiters gone from this node, to release;
	// releasing are those proposed, to be checked again later in case
	// their proposal was given up (recheckOrphans).
	orphans   []expiry
	releasing []orphanCheck
	dirty     atomic.Bool
	kick      chan struct{}
	// slots bounds this node's proposals in flight for the group: while
	// they are all out, new commands gather into the next batch. A second
	// proposal only goes out beside the first when pipelineMin commands
	// wait; freed signals a slot coming back.
	slots chan struct{}
	freed chan struct{}

	wasLeader  bool            // expiry driver only
	leaderSeen uint64          // expiry driver only
	placement  leaderPlacement // expiry driver only
	// newLeader is closed, and replaced, when the group's leader changes:
	// proposals in flight then go out again at once (see watch).
	newLeader atomic.Pointer[chan struct{}]
}

// metaFile pins the group count and node id of a data dir.
const metaFile = "lockd-cluster.json"

type meta struct {
	NodeID uint64 `json:"node_id"`
	Groups int    `json:"groups"`
}

func checkMeta(cfg *Config) error {
	if cfg.FS != nil {
		return nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return fmt.Errorf("cluster: data dir: %w", err)
	}
	path := filepath.Join(cfg.DataDir, metaFile)
	want := meta{NodeID: cfg.NodeID, Groups: cfg.Groups}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b, _ = json.Marshal(want)
		return os.WriteFile(path, b, 0o640)
	}
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	var have meta
	if err := json.Unmarshal(b, &have); err != nil {
		return fmt.Errorf("cluster: %s: %w", path, err)
	}
	if have != want {
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
	if err := checkMeta(&cfg); err != nil {
		return nil, err
	}
	setupLogging(cfg.Logger)
	n := &Node{
		cfg:            cfg,
		attemptTimeout: max(100*time.Millisecond, 2*time.Duration(cfg.ElectionRTT)*cfg.RTT),
		log:            cfg.Logger,
		start:          time.Now(),
		reg:            make(map[uint64]*pending),
		wakeReg:        make(chan struct{}, 1),
		inflight:       engine.NewAdmissionGate(cfg.MaxInflight),
		waiters:        engine.NewAdmissionGate(cfg.MaxWaiters),
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, err
	}
	// Ids must not repeat across restarts of this node (a replayed grant
	// for an old id is released as an orphan), nor be 0.
	n.idBase.Store(binary.BigEndian.Uint64(seed[:]) >> 1)
	n.idFirst = n.idBase.Load() + 1

	nhc := config.NodeHostConfig{
		DeploymentID:   deploymentID,
		NodeHostDir:    cfg.DataDir,
		WALDir:         cfg.DataDir,
		RTTMillisecond: uint64(max(cfg.RTT/time.Millisecond, 1)),
		RaftAddress:    cfg.RaftAddr,
		Expert:         config.ExpertConfig{LogDB: config.GetTinyMemLogDBConfig(), FS: cfg.FS},
	}
	nhc.Expert.LogDB.Shards = cfg.LogDBShards
	nhc.Expert.Engine = config.GetDefaultEngineConfig()
	nhc.Expert.Engine.ExecShards = cfg.ExecShards
	nhc.Expert.TransportFactory = raftTransportFactory{log: cfg.Logger, tls: cfg.RaftTLS}
	nh, err := dragonboat.NewNodeHost(nhc)
	if err != nil {
		return nil, fmt.Errorf("cluster: start NodeHost: %w", err)
	}
	n.nh = nh
	members := make(map[uint64]dragonboat.Target, len(cfg.Peers))
	for id, addr := range cfg.Peers {
		members[id] = addr
	}
	perGroup := max(1, (cfg.MaxKeys+cfg.Groups-1)/cfg.Groups)
	for i := range cfg.Groups {
		g := &group{n: n, idx: i, shardID: shardID(cfg.Groups, i), maxKeys: perGroup,
			kick: make(chan struct{}, 1), slots: make(chan struct{}, proposalsInFlight), freed: make(chan struct{}, 1)}
		g.buf = make([]byte, headerLen, 4096)
		g.newLeader.Store(new(make(chan struct{})))
		n.groups = append(n.groups, g)
		rc := config.Config{
			ReplicaID:   cfg.NodeID,
			ShardID:     g.shardID,
			CheckQuorum: true,
			// A node cut off keeps campaigning; without PreVote its raised
			// term makes every healthy leader step down when the cut heals
			// (measured: the majority stalled 0.3–0.9 s; with PreVote 6–25 ms).
			PreVote:            true,
			ElectionRTT:        cfg.ElectionRTT,
			HeartbeatRTT:       cfg.HeartbeatRTT,
			SnapshotEntries:    cfg.SnapshotEntries,
			CompactionOverhead: cfg.CompactionOverhead,
			MaxInMemLogSize:    cfg.MaxInMemLogSize,
		}
		initial := members
		if nh.HasNodeInfo(g.shardID, cfg.NodeID) {
			initial = nil // a restart: membership comes from the log
		}
		create := func(uint64, uint64) sm.IStateMachine {
			f := newFSM(g, cfg.FirstToken)
			g.fsm.Store(f)
			return f
		}
		if err := nh.StartReplica(initial, false, create, rc); err != nil {
			nh.Close()
			return nil, fmt.Errorf("cluster: start group %d: %w", g.shardID, err)
		}
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	for _, g := range n.groups {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); g.proposeLoop(n.ctx) }()
	}
	n.wg.Add(2)
	go func() { defer n.wg.Done(); n.expiryLoop(n.ctx) }()
	go func() { defer n.wg.Done(); n.timerLoop(n.ctx) }()
	n.log.Info().Uint64("node", cfg.NodeID).Str("raft", cfg.RaftAddr).Int("groups", cfg.Groups).
		Str("data_dir", cfg.DataDir).Msg("cluster node started")
	return n, nil
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
	v, _ := f.Lookup(lockKey([]byte(tenant), key))
	return v.(uint64)
}

func (n *Node) clock() time.Duration { return time.Since(n.start) }

func (n *Node) nextID() uint64 { return n.idBase.Add(1) | 1<<63 }

// ownRun reports whether id was issued by this run of the node: a grant to
// an id of a previous run may have been delivered, so it must not be
// released here (its lease bounds it).
func (n *Node) ownRun(id uint64) bool {
	v := id &^ (1 << 63)
	return v >= n.idFirst && v <= n.idBase.Load()
}

// ---- server.Backend ----

// Namespace interns a tenant; commands carry the tenant's name, since
// interned numbers are local to a process.
func (n *Node) Namespace(tenant string) engine.Namespace { return n.tenants.Intern(tenant) }

func (n *Node) tenant(ns engine.Namespace) string { return n.tenants.Name(ns) }

// Acquire proposes the acquire to the key's group and answers Queued: the
// outcome comes through w once the group applied it, or Unavailable when
// it did not within ProposeTimeout (or the wait, if shorter).
func (n *Node) Acquire(ns engine.Namespace, key []byte, owner uint64, lease, wait time.Duration, w engine.Waiter) (engine.Result, server.Handle) {
	if n.shutting.Load() {
		return engine.Result{Outcome: engine.ShuttingDown}, nil
	}
	if !n.inflight.Admit() {
		return engine.Result{Outcome: engine.Busy}, nil
	}
	tenant := n.tenant(ns)
	now := n.clock()
	limit := n.cfg.ProposeTimeout
	if wait > 0 && wait < limit {
		limit = wait
	}
	p := &pending{id: n.nextID(), w: w, owner: owner, start: now, wait: wait, deadline: now + limit}
	if !n.register(p) {
		n.inflight.Leave()
		return engine.Result{Outcome: engine.ShuttingDown}, nil
	}
	g := n.groups[groupOf(tenant, key, len(n.groups))]
	g.mu.Lock()
	g.buf = appendAcquire(g.buf, n.cfg.NodeID, p.id, uint16(lease/time.Second), int64(wait), uint32(g.maxKeys), tenant, key)
	g.count++
	g.mu.Unlock()
	g.dirty.Store(true)
	return engine.Result{Outcome: engine.Queued}, p
}

// AsyncRelease: releases and keeps are answered through the Waiter once
// applied.
func (n *Node) AsyncRelease() bool { return true }

// Release proposes the release; the answer comes through w. A nil w is
// the server releasing an orphaned grant: nobody is told.
func (n *Node) Release(ns engine.Namespace, key []byte, owner, token uint64, w engine.Waiter) engine.Result {
	tenant := n.tenant(ns)
	var id uint64
	if w != nil {
		id = n.registerUngated(owner, w)
	}
	g := n.groups[groupOf(tenant, key, len(n.groups))]
	g.enqueueRelease(id, token, tenant, key)
	if w == nil {
		g.propose()
	}
	return engine.Result{Outcome: engine.Queued}
}

// Keep proposes the renewal (SPEC §5 KEEP); the answer comes through w:
// Renewed with the same token, NotHeld, or Unavailable when the group did
// not apply it within ProposeTimeout (the lease may or may not have been
// renewed). Like Release it passes no gate.
func (n *Node) Keep(ns engine.Namespace, key []byte, owner, token uint64, lease time.Duration, w engine.Waiter) engine.Result {
	tenant := n.tenant(ns)
	var id uint64
	if w != nil {
		id = n.registerUngated(owner, w)
	}
	g := n.groups[groupOf(tenant, key, len(n.groups))]
	renewals := g.fsm.Load().renewalsOf(lockKey([]byte(tenant), key), token)
	g.mu.Lock()
	g.buf = appendKeep(g.buf, n.cfg.NodeID, id, token, renewals, uint16(lease/time.Second), tenant, key)
	g.count++
	g.mu.Unlock()
	g.dirty.Store(true)
	return engine.Result{Outcome: engine.Queued}
}

// staleKeep is called by g's state machine for a KEEP that named an older
// renewal than the lock's current one. If its request still waits on this
// node, the KEEP was proposed from a lagging view (this replica has now
// applied everything before it): it is proposed again, naming the current
// renewal. Otherwise it was a duplicate of one already answered. It runs
// inside Update, so it only queues.
func (g *group) staleKeep(c *command, renewals uint32) {
	n := g.n
	if c.node != n.cfg.NodeID || c.id == 0 {
		return
	}
	n.regMu.Lock()
	p := n.reg[c.id]
	n.regMu.Unlock()
	if p == nil {
		return
	}
	g.mu.Lock()
	g.buf = appendKeep(g.buf, n.cfg.NodeID, c.id, c.token, renewals, c.lease, string(c.tenant), c.key)
	g.count++
	g.mu.Unlock()
	g.dirty.Store(true)
	g.propose()
}

// registerUngated registers a release or keep answered through w and
// returns its request id.
func (n *Node) registerUngated(owner uint64, w engine.Waiter) uint64 {
	now := n.clock()
	p := &pending{id: n.nextID(), w: w, owner: owner, start: now, deadline: now + n.cfg.ProposeTimeout, ungated: true}
	n.register(p)
	return p.id
}

func (g *group) enqueueRelease(id, token uint64, tenant string, key []byte) {
	g.mu.Lock()
	g.buf = appendRelease(g.buf, g.n.cfg.NodeID, id, token, tenant, key)
	g.count++
	g.mu.Unlock()
	g.dirty.Store(true)
}

// Cancel drops a waiter whose connection closed. Its replicated queue
// entry stays; if it is ever granted, this node releases the grant.
func (n *Node) Cancel(h server.Handle) {
	p, ok := h.(*pending)
	if !ok || p == nil {
		return
	}
	n.regMu.Lock()
	n.finishLocked(p)
	n.regMu.Unlock()
}

// Flush proposes what this event-loop batch queued: one proposal per
// touched group (group commit).
func (n *Node) Flush() {
	for _, g := range n.groups {
		if g.dirty.Load() {
			g.propose()
		}
	}
}

// Stats sums the replicated tables of this replica (keys, tokens) and the
// node's own gates (waiters, in-flight).
func (n *Node) Stats() engine.Stats {
	var st engine.Stats
	for _, g := range n.groups {
		f := g.fsm.Load()
		if f == nil {
			continue
		}
		f.mu.Lock()
		st.Keys += len(f.locks)
		st.TokensIssued += f.issued
		st.LastToken = max(st.LastToken, f.lastToken)
		f.mu.Unlock()
	}
	st.HeldLocks = st.Keys
	st.WaitersGate, st.InflightGate = n.waiters.Stats(), n.inflight.Stats()
	st.Waiters, st.Inflight = st.WaitersGate.Count, st.InflightGate.Count
	st.KeysGate = engine.GateStats{Open: true, Limit: n.cfg.MaxKeys, Count: st.Keys}
	return st
}

// ClusterStats are counters for benchmarks and tests.
type ClusterStats struct {
	Proposals, Commands, ProposeRetries, ProposeFailures, Unavailable, OrphanReleases, Expires, LeaderTransfers uint64
}

// ClusterStats returns the node's Raft-side counters.
func (n *Node) ClusterStats() ClusterStats {
	s := &n.stats
	return ClusterStats{
		Proposals: s.proposals.Load(), Commands: s.commands.Load(), ProposeRetries: s.proposeRetries.Load(),
		ProposeFailures: s.proposeFailures.Load(), Unavailable: s.unavailable.Load(),
		OrphanReleases: s.orphanReleases.Load(), Expires: s.expires.Load(), LeaderTransfers: s.leaderTransfers.Load(),
	}
}

// Shutdown answers every queued or pending acquire ShuttingDown. Locks
// stay in the cluster; pending releases and keeps are still answered.
func (n *Node) Shutdown() {
	var done []*pending
	n.regMu.Lock()
	n.shutting.Store(true)
	for _, p := range n.reg {
		if !p.ungated && n.finishLocked(p) {
			done = append(done, p)
		}
	}
	n.regMu.Unlock()
	for _, p := range done {
		p.w.Resolve(p.owner, engine.Result{Outcome: engine.ShuttingDown})
	}
}

// Run returns when ctx is done: the node's goroutines run from Start to
// Close.
func (n *Node) Run(ctx context.Context) { <-ctx.Done() }

// ---- local requests ----

// register adds p; an acquire is refused once Shutdown ran, checked under
// the lock Shutdown takes, so that no acquire escapes its sweep.
func (n *Node) register(p *pending) bool {
	n.regMu.Lock()
	if !p.ungated && n.shutting.Load() {
		n.regMu.Unlock()
		return false
	}
	n.reg[p.id] = p
	next, ok := n.timers.Next()
	wake := !ok || p.deadline < next
	n.timers.Push(p.deadline, p)
	// Answered requests stay in the heap until their deadline (up to a
	// 255 s wait): drop them once they outnumber the live ones. A queued
	// request keeps its stale first entry too, so the heap stays within
	// twice the live requests after a pass: passes are rare.
	if len(n.timers) > 64 && len(n.timers) > 3*len(n.reg) {
		n.timers.Retain(func(p *pending) bool { return !p.done })
	}
	n.regMu.Unlock()
	if wake {
		select {
		case n.wakeReg <- struct{}{}:
		default:
		}
	}
	return true
}

// claim retires the request registered as id and returns it, or nil if
// none is (answered, cancelled, or not of this node's current run).
func (n *Node) claim(id uint64) *pending {
	n.regMu.Lock()
	defer n.regMu.Unlock()
	p := n.reg[id]
	if p != nil {
		n.finishLocked(p)
	}
	return p
}

// finishLocked retires p, giving back its gates; false if it was already.
func (n *Node) finishLocked(p *pending) bool {
	if p.done {
		return false
	}
	p.done = true
	delete(n.reg, p.id)
	if !p.ungated {
		n.inflight.Leave()
		if p.queued {
			n.waiters.Leave()
		}
	}
	return true
}

// timerLoop answers requests whose deadline passed: Unavailable while the
// group has not applied them, TimedOut once queued.
func (n *Node) timerLoop(ctx context.Context) {
	tm := time.NewTimer(time.Hour)
	defer tm.Stop()
	var due []*pending
	for {
		now := n.clock()
		next := time.Hour
		n.regMu.Lock()
		for at, ok := n.timers.Next(); ok; at, ok = n.timers.Next() {
			p := n.timers[0].Item
			if p.done || p.deadline != at {
				n.timers.Pop()
				continue
			}
			if at > now {
				next = at - now
				break
			}
			n.timers.Pop()
			n.finishLocked(p)
			due = append(due, p)
		}
		n.regMu.Unlock()
		for i, p := range due {
			r := engine.Result{Outcome: engine.TimedOut}
			if !p.queued {
				r.Outcome = engine.Unavailable
				n.stats.unavailable.Add(1)
			}
			p.w.Resolve(p.owner, r)
			due[i] = nil
		}
		due = due[:0]
		tm.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-tm.C:
		case <-n.wakeReg:
		}
	}
}

// result is called by g's state machine for every command outcome; only
// the node that owns id acts on it.
func (g *group) result(key string, node, id uint64, r engine.Result) {
	n := g.n
	if node != n.cfg.NodeID || id == 0 {
		return
	}
	n.regMu.Lock()
	p := n.reg[id]
	if p == nil {
		n.regMu.Unlock()
		if r.Outcome == engine.Granted && n.ownRun(id) {
			// Answered already (unavailable, cancelled, or a duplicate of
			// a retried proposal): nobody will use this grant.
			g.orphan(key, r.Token)
		}
		return
	}
	if r.Outcome == engine.Queued {
		if p.queued { // a retried proposal applied twice; its grant will be released
			n.regMu.Unlock()
			return
		}
		if !n.waiters.Admit() {
			// The replicated entry stays; a grant for it will be released.
			n.finishLocked(p)
			n.regMu.Unlock()
			p.w.Resolve(p.owner, engine.Result{Outcome: engine.Busy})
			return
		}
		p.queued = true
		p.deadline = p.start + p.wait
		n.timers.Push(p.deadline, p)
		n.regMu.Unlock()
		select {
		case n.wakeReg <- struct{}{}:
		default:
		}
		return
	}
	n.finishLocked(p)
	n.regMu.Unlock()
	if r.Outcome == engine.Granted {
		r.Waited = 0 // an immediate grant: the lease starts at apply, after receipt
	}
	p.w.Resolve(p.owner, r)
}

// granted is called by g's state machine when a queued waiter gets the
// lock. The owning node delivers it, or releases it when the waiter is
// gone (timed out here, cancelled, answered unavailable, or from a
// previous run of this node).
func (g *group) granted(key string, node, id uint64, r engine.Result) {
	n := g.n
	if node != n.cfg.NodeID {
		return
	}
	p := n.claim(id)
	if p == nil {
		if n.ownRun(id) {
			g.orphan(key, r.Token)
		}
		return
	}
	// waited_ms must not overstate the wait: take the smaller of the
	// replicated estimate and this node's own elapsed time.
	r.Waited = max(0, min(r.Waited, n.clock()-p.start))
	p.w.Resolve(p.owner, r)
}

// restoredGrant delivers a grant this node learnt of only from a snapshot
// (it had fallen behind its group), if request id still waits for it. A
// request no longer registered may have been answered with this very
// grant before the node fell behind, so that lock is left to its lease,
// never released here. Waited is 0: the client's validity bound then ends
// at its send instant + lease, before the lease ends on any replica.
func (g *group) restoredGrant(id, token uint64) {
	if p := g.n.claim(id); p != nil {
		p.w.Resolve(p.owner, engine.Result{Outcome: engine.Granted, Token: token})
	}
}

// orphan queues the release of a grant nobody waits for. It runs inside
// Update, so it only queues; the proposer drops the ones no longer
// current before proposing (a restarted node replaying its log finds
// many such historical grants).
func (g *group) orphan(key string, token uint64) {
	g.mu.Lock()
	g.orphans = append(g.orphans, expiry{key: key, token: token})
	g.mu.Unlock()
	g.propose()
}

// releaseOrphans turns the queued orphans still holding their lock into
// release commands.
func (g *group) releaseOrphans() {
	g.mu.Lock()
	orphans := g.orphans
	g.orphans = nil
	g.mu.Unlock()
	if len(orphans) == 0 {
		return
	}
	f := g.fsm.Load()
	kept := orphans[:0]
	f.mu.Lock()
	for _, o := range orphans {
		if f.valid(o) {
			kept = append(kept, o)
		}
	}
	f.mu.Unlock()
	if len(kept) == 0 {
		return
	}
	g.n.stats.orphanReleases.Add(uint64(len(kept)))
	// A batch may wait up to a propose timeout for a free slot, then be
	// proposed for another one.
	checkAt := g.n.clock() + 2*g.n.cfg.ProposeTimeout + g.n.attemptTimeout
	g.mu.Lock()
	for _, o := range kept {
		tenant, key := splitLockKey(o.key)
		g.buf = appendRelease(g.buf, g.n.cfg.NodeID, 0, o.token, tenant, key)
		g.count++
		g.releasing = append(g.releasing, orphanCheck{expiry: o, at: checkAt})
	}
	g.mu.Unlock()
}

// orphanCheck is an orphan release to look at again at instant at: if
// its token is still current then, the proposal was most likely given up
// (the group had no leader for the whole propose timeout) and it is
// released again; a duplicate release of a token no longer current is a
// no-op.
type orphanCheck struct {
	expiry
	at time.Duration
}

// recheckOrphans queues again the orphan releases due for a check whose
// lock is still held by the orphaned grant. Run by the expiry driver.
func (g *group) recheckOrphans(now time.Duration, f *fsm) {
	g.mu.Lock()
	n := 0
	for n < len(g.releasing) && g.releasing[n].at <= now {
		n++
	}
	due := g.releasing[:n:n]
	g.releasing = g.releasing[n:]
	g.mu.Unlock()
	if n == 0 {
		return
	}
	f.mu.Lock()
	var again []expiry
	for _, c := range due {
		if f.valid(c.expiry) {
			again = append(again, c.expiry)
		}
	}
	f.mu.Unlock()
	if len(again) == 0 {
		return
	}
	g.mu.Lock()
	g.orphans = append(g.orphans, again...)
	g.mu.Unlock()
	g.propose()
}

// ---- proposals ----

func (g *group) pending() uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count
}

// freeSlot gives back a proposal slot and tells the proposer.
func (g *group) freeSlot() {
	<-g.slots
	select {
	case g.freed <- struct{}{}:
	default:
	}
}

// propose wakes the group's proposer.
func (g *group) propose() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// take swaps out the commands gathered so far as one stamped proposal.
func (g *group) take() []byte {
	g.dirty.Store(false)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.count == 0 {
		return nil
	}
	b := g.buf
	putHeader(b, time.Now().UnixNano(), g.count)
	g.buf = make([]byte, headerLen, max(4096, min(len(b), 1<<20)))
	g.count = 0
	return b
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
			if len(g.slots) > 1 && g.pending() < pipelineMin {
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
				g.freeSlot()
			}
		}
	}
}

// send proposes b until it is applied or deadline passes, retrying when
// the group did not take it (busy, no leader yet, dropped) and when an
// attempt timed out (e.g. it was forwarded to a leader that just died).
// Retrying a proposal that may also have been applied is safe: every
// command is idempotent in effect. A duplicate release or lease end names
// a token (or renewal) that can never be current again, and so does a
// duplicate keep, which therefore changes nothing; a duplicate acquire's second
// outcome finds its request already answered, and if it is a grant the
// node releases it as an orphan. Same for a batch that applies after its
// requests were answered E unavailable.
//
// It reports whether a watcher took over b (and the group's slot, which
// it frees when b's fate is known).
func (g *group) send(ctx context.Context, b []byte, deadline time.Time) bool {
	n := g.n
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			n.stats.proposeFailures.Add(1)
			return false
		}
		leaderChanged := *g.newLeader.Load()
		rs, err := n.nh.Propose(n.nh.GetNoOPSession(g.shardID), b, min(left, n.attemptTimeout))
		if err == nil {
			n.stats.proposals.Add(1)
			n.stats.commands.Add(uint64(binaryCount(b)))
			go g.watch(ctx, rs, leaderChanged, b, deadline)
			return true
		}
		if !dragonboat.IsTempError(err) {
			n.stats.proposeFailures.Add(1)
			n.log.Warn().Err(err).Uint64("group", g.shardID).Msg("proposal refused")
			return false
		}
		n.stats.proposeRetries.Add(1)
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func binaryCount(b []byte) uint32 { return binary.BigEndian.Uint32(b[9:]) }

// watch waits for a proposal's fate and sends it again when it was
// dropped or timed out, or at once when the group's leader changed while
// it was out: a dead leader loses what a follower forwarded to it, and a
// leader handing over drops it, without telling the follower, which
// would otherwise learn only at the attempt timeout (two election
// timeouts). Sending a proposal twice is safe (see send).
func (g *group) watch(ctx context.Context, rs *dragonboat.RequestState, leaderChanged <-chan struct{}, b []byte, deadline time.Time) {
	var r dragonboat.RequestResult
	select {
	case r = <-rs.ResultC():
	case <-leaderChanged:
		// rs completes on its own; its outcome no longer matters.
		g.n.stats.proposeRetries.Add(1)
		if g.send(ctx, b, deadline) {
			return // the new watcher owns the slot
		}
		g.freeSlot()
		return
	case <-ctx.Done():
		g.freeSlot()
		return
	}
	rs.Release()
	if r.Dropped() || r.Timeout() {
		g.n.stats.proposeRetries.Add(1)
		time.Sleep(5 * time.Millisecond)
		if g.send(ctx, b, deadline) {
			return // the new watcher owns the slot
		}
	}
	g.freeSlot()
}

// ---- lease expiry ----

// expiryLoop drives lease expiry. Every replica keeps a deadline heap per
// group (grants are stamped with this process's clock after they apply);
// only the leader acts on it, proposing an expire for each due entry that
// still names the key's current token. A replica that becomes leader
// rebuilds its heap from the replicated table, keeping what it knew.
func (n *Node) expiryLoop(ctx context.Context) {
	t := time.NewTicker(expiryTick)
	defer t.Stop()
	var due []expiry
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i, g := range n.groups {
			f := g.fsm.Load()
			if f == nil {
				continue
			}
			leaderID := n.Leader(i)
			if leaderID != 0 && leaderID != g.leaderSeen {
				if g.leaderSeen != 0 {
					close(*g.newLeader.Swap(new(make(chan struct{}))))
				}
				g.leaderSeen = leaderID
			}
			leader := leaderID == n.cfg.NodeID
			now := n.clock()
			f.mu.Lock()
			f.stampFresh(now)
			if leader && !g.wasLeader {
				f.rebuild(now)
			}
			if leader {
				due = f.due(now, expireRetry, due[:0])
			}
			var moveTo uint64
			if g.placement.due(now) {
				busiest, own := f.takeLoad(n.cfg.NodeID)
				if !n.cfg.FixedLeaders {
					moveTo = g.placement.observe(now, leader, busiest, own)
				}
			}
			f.mu.Unlock()
			g.wasLeader = leader
			if moveTo != 0 {
				n.moveLeader(g, moveTo)
			}
			g.recheckOrphans(now, f)
			if len(due) == 0 {
				continue
			}
			g.mu.Lock()
			for _, e := range due {
				tenant, key := splitLockKey(e.key)
				g.buf = appendLeaseEnd(g.buf, e.token, e.renewals, tenant, key)
				g.count++
			}
			g.mu.Unlock()
			n.stats.expires.Add(uint64(len(due)))
			clear(due)
			g.propose()
		}
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

// PeerList formats peers as the --peers flag does, sorted by id.
func PeerList(peers map[uint64]string) string {
	ids := make([]uint64, 0, len(peers))
	for id := range peers {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%d=%s", id, peers[id])
	}
	return strings.Join(parts, ",")
}

// WritePrometheus adds cluster series to the server's /metrics.
func (n *Node) WritePrometheus(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# HELP lockd_cluster_group_leader This node's view of each group's leader (0 unknown).\n# TYPE lockd_cluster_group_leader gauge\n")
	for i := range n.groups {
		p("lockd_cluster_group_leader{group=\"%d\"} %d\n", i+1, n.Leader(i))
	}
	p("# HELP lockd_cluster_node_id This node's id.\n# TYPE lockd_cluster_node_id gauge\nlockd_cluster_node_id %d\n", n.cfg.NodeID)
	s := n.ClusterStats()
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"lockd_cluster_proposals_total", "Raft proposals made by this node (one per group per batch).", s.Proposals},
		{"lockd_cluster_proposed_commands_total", "Commands carried by those proposals.", s.Commands},
		{"lockd_cluster_propose_retries_total", "Proposals retried because the group certainly did not take them.", s.ProposeRetries},
		{"lockd_cluster_propose_failures_total", "Proposals given up (the requests were answered E unavailable).", s.ProposeFailures},
		{"lockd_cluster_unavailable_total", "Requests answered E unavailable.", s.Unavailable},
		{"lockd_cluster_orphan_releases_total", "Release proposals, retries included, for grants whose waiter is gone from this node.", s.OrphanReleases},
		{"lockd_cluster_expires_total", "Lease expiries proposed by this node as a group leader.", s.Expires},
		{"lockd_cluster_leader_transfers_total", "Leader transfers this node asked for, as a group leader, toward the node proposing most.", s.LeaderTransfers},
	} {
		p("# HELP %s %s\n# TYPE %s counter\n%s %d\n", c.name, c.help, c.name, c.name, c.v)
	}
}
