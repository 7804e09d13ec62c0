package cluster

// This file owns a node's configuration: its defaults, their checks, the
// peer list format of the --peers flag, and the data dir's record of the
// node id, group count and log format it was created with.

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lni/dragonboat/v4/config"
	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/defaults"
	"github.com/rs/zerolog"
)

// Defaults of Config.
const (
	// DefaultGroups is 1. Every group's leader pays a fixed cost per Raft
	// proposal (an entry, a fsync'd step on every replica, ~7 transport
	// messages) and batches only what its own node queued for that
	// group, so more groups mean smaller batches and more proposals for
	// the same load; and a node steps and applies all its groups on one
	// step worker and one apply worker (ExecShards, ApplyShards), so more
	// groups buy it no parallelism (docs/cluster.md, Performance, has the
	// paired runs). What more groups do buy is leaders on
	// several nodes when clients spread evenly over the nodes (Leader
	// placement), which spreads the leaders' work.
	DefaultGroups = 1
	// DefaultRTT, DefaultElectionRTT and DefaultHeartbeatRTT size what an
	// idle cluster costs against how soon it notices a dead leader.
	// dragonboat ticks every group on every node once per RTT and a
	// leader heart-beats each follower every HeartbeatRTT ticks, so an
	// idle cluster's cost is mostly ticks and heartbeats: a 100 ms tick
	// with heartbeat 1 and election 4 gives etcd's heartbeat interval
	// with few ticks (docs/cluster.md, Time and Performance). The
	// election timeout is 400 ms (randomised to 400–800 ms), not etcd's
	// 1 s, because a dead leader's keys wait that long; a
	// heartbeat every 100 ms (etcd's default) is four per election
	// timeout, enough for CheckQuorum not to depose a leader that lost
	// one or two. With one heartbeat per tick, the heartbeats of all the
	// groups a node leads leave in the same step, one batch per peer.
	DefaultRTT                = 100 * time.Millisecond
	DefaultElectionRTT        = 4
	DefaultHeartbeatRTT       = 1
	DefaultSnapshotEntries    = 10000
	DefaultCompactionOverhead = 2000
	DefaultProposeTimeout     = 2 * time.Second
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
	Peers    map[uint64]string // the groups' first members, itself included: 3 or 5 (see Join)
	DataDir  string            // NodeHost directory; the same dir on restart rejoins
	Groups   int               // Raft groups, fixed at bootstrap; 0: the data dir's, DefaultGroups for a new one
	// Join starts a node new to a running cluster: its groups start
	// empty and wait until a member adds it (Node.AddMember), and Peers
	// needs only its own entry. A restart, joined or not, takes the
	// membership from the log.
	Join bool

	RTT                time.Duration // dragonboat's tick (default 100 ms)
	ElectionRTT        uint64        // election timeout in RTTs (default 4)
	HeartbeatRTT       uint64        // heartbeat interval in RTTs (default 1)
	SnapshotEntries    uint64        // snapshot every N applied entries per group
	CompactionOverhead uint64        // entries kept after a snapshot
	// ProposeTimeout bounds how long a request waits for its group to
	// commit it before the answer is E unavailable (default 2 s).
	ProposeTimeout time.Duration

	MaxKeys     int // live keys, all groups (each group gets its share)
	MaxWaiters  int // queued waiters on this node
	MaxInflight int // acquires in flight on this node, pending in Raft included
	// TenantLimits gives each tenant its share of the limits, as
	// engine.Config.TenantLimits does: in-flight acquires and waiters on
	// this node, and keys as this node's replicas of all groups count
	// them.
	TenantLimits func(tenant string) engine.TenantLimits
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

	// MonitorAnchor keeps one Go processor in a system call while the
	// node applies commands (internal/sysmonanchor), so that the Go
	// runtime's monitor thread does not fall into its deep sleep between
	// two Raft messages and wake up polling every 20 µs. It needs a processor of its own:
	// set it only where GOMAXPROCS counts one for it (lockd serve does).
	MonitorAnchor bool

	// FixedLeaders turns leader placement off: a group's leadership then
	// stays wherever elections put it (cluster/placement).
	FixedLeaders bool

	// StatementInterval is how often the node states its log format to
	// its peers, and its leaders look at raising their groups' formats,
	// while a group is below the newest (version.go); default 250 ms.
	StatementInterval time.Duration

	// AttemptTimeout bounds one Raft proposal attempt, so that a proposal
	// lost with a dead leader is sent again to the next one; default two
	// election timeouts, at least 100 ms.
	AttemptTimeout time.Duration

	// ForgetAfter is how long a group leader waits, hearing nothing from a
	// peer, before it drops that peer's queued waiters (cmdForget), so
	// that a freed lock goes to a live waiter; default two election
	// timeouts. The group's previous leader is given one election timeout
	// at most (housekeeping.go, silentPeers).
	ForgetAfter time.Duration

	// RaftTLS, when set, runs the Raft transport over mutual TLS
	// (LoadRaftTLS); nil is plain TCP.
	RaftTLS *tls.Config
	// RaftListener, when set, is the bound Raft port (on RaftAddr) the
	// transport serves, instead of listening itself: a caller that picks
	// ports by listening on port 0 hands the listener over, so no other
	// process can take the port in between. The node closes it when it
	// stops (the caller does when Start fails).
	RaftListener net.Listener
	// InsecureRaft allows plain TCP Raft on an address other machines can
	// reach (checkRaftExposure).
	InsecureRaft bool
	// RaftFrameBudget bounds, in bytes, the bodies of the Raft frames
	// past 64 KiB that peers' connections hold at once (raftnet.FrameBudget);
	// 0: raftnet.DefaultFrameBudget, at least raftnet.MinFrameBudget.
	RaftFrameBudget int

	// Build names this binary's build (its version and commit), for the
	// error of a replica that halts on what its build cannot read.
	Build string

	// FS, when set, keeps the NodeHost's files there (vfs.NewMem in tests).
	FS     config.IFS
	Logger zerolog.Logger

	// Clock, when set, is this node's monotonic clock, the time since an
	// arbitrary origin: leases, waits, request deadlines, peer liveness
	// and the housekeeping pass read it. nil is the process's monotonic
	// clock from Start; tests pass a fake one.
	Clock func() time.Duration

	// WallClock, when set, is this node's wall clock instead of
	// time.Now: a test hook that skews or steps it. A wall clock dates
	// only the batches of the log formats before 5 (clock.go).
	WallClock func() time.Time

	// beforeUpdate, when set, runs before each batch this node's replicas
	// apply, on dragonboat's apply worker: a test holds a replica's apply
	// back with it, as a busy follower's lags behind its commit index.
	beforeUpdate func()
}

// wall is the node's wall clock.
func (c *Config) wall() time.Time {
	if c.WallClock != nil {
		return c.WallClock()
	}
	return time.Now()
}

func (c *Config) applyDefaults() error {
	if c.Clock == nil {
		c.Clock = monotonicClock()
	}
	c.RTT = defaults.Or(c.RTT, DefaultRTT)
	c.ElectionRTT = defaults.Or(c.ElectionRTT, DefaultElectionRTT)
	c.AttemptTimeout = defaults.Or(c.AttemptTimeout, max(100*time.Millisecond, 2*time.Duration(c.ElectionRTT)*c.RTT))
	c.ForgetAfter = defaults.Or(c.ForgetAfter, 2*time.Duration(c.ElectionRTT)*c.RTT)
	c.HeartbeatRTT = defaults.Or(c.HeartbeatRTT, DefaultHeartbeatRTT)
	c.SnapshotEntries = defaults.Or(c.SnapshotEntries, DefaultSnapshotEntries)
	c.CompactionOverhead = defaults.Or(c.CompactionOverhead, DefaultCompactionOverhead)
	c.ProposeTimeout = defaults.Or(c.ProposeTimeout, DefaultProposeTimeout)
	c.StatementInterval = defaults.Or(c.StatementInterval, defaultStatementInterval)
	c.ExecShards = defaults.Or(c.ExecShards, 1)
	c.LogDBShards = defaults.Or(c.LogDBShards, 1)
	c.MaxKeys = defaults.Or(c.MaxKeys, engine.DefaultMaxKeys)
	c.MaxWaiters = defaults.Or(c.MaxWaiters, engine.DefaultMaxWaiters)
	c.MaxInflight = defaults.Or(c.MaxInflight, engine.DefaultMaxInflight)
	if c.RaftFrameBudget == 0 {
		c.RaftFrameBudget = raftnet.DefaultFrameBudget
	}
	switch {
	case c.RaftFrameBudget < raftnet.MinFrameBudget:
		return fmt.Errorf("cluster: --raft-frame-budget-mib %d: want >= %d (a frame of the largest size and room for members' frames)", c.RaftFrameBudget>>20, raftnet.MinFrameBudget>>20)
	case c.Groups < 0:
		return fmt.Errorf("cluster: --groups %d: want >= 1, or 0 for the data dir's count", c.Groups)
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
	// A request's acquire is proposed again until ProposeTimeout, the last
	// attempt lasting two RTTs at least (proposeOnce); a tombstone (SPEC
	// §6a) must outlast that with room to spare (docs/cluster.md, Why it
	// is safe).
	if c.ProposeTimeout+2*c.RTT > engine.TombstoneLife/2 {
		return fmt.Errorf("cluster: propose timeout %v: want at most %v with the RTT's two attempts, half an abandon's tombstone life",
			c.ProposeTimeout, engine.TombstoneLife/2)
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
