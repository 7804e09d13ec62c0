package cluster

// This file owns the node's Prometheus collector: the server registers a
// backend that is a prometheus.Collector beside its own families.

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/histogram"
)

var (
	groupLeaderDesc    = prometheus.NewDesc("lockd_cluster_group_leader", "This node's view of each group's leader (0 unknown).", []string{"group"}, nil)
	groupHasLeaderDesc = prometheus.NewDesc("lockd_cluster_group_has_leader", "1 when this node knows a leader for the group, 0 during an election or without a quorum.", []string{"group"}, nil)
	leaderChangesDesc  = prometheus.NewDesc("lockd_cluster_leader_changes_total", "Leaders this node saw elected for the group: one per term that had a leader.", []string{"group"}, nil)
	nodeIDDesc         = prometheus.NewDesc("lockd_cluster_node_id", "This node's id.", nil, nil)
	proposalApplyDesc  = prometheus.NewDesc("lockd_cluster_proposal_apply_duration_seconds", "This node's Raft proposals (a batch of commands each) from their proposal to their apply on this node.", nil, nil)
	raftLogSyncDesc    = prometheus.NewDesc("lockd_cluster_raft_log_sync_duration_seconds", "Durable writes of this node's Raft log: one Pebble commit, fsync included, each.", nil, nil)
	logFormatDesc      = prometheus.NewDesc("lockd_cluster_log_format", "Each group's log format as this node's replica applied it: what the group may write (docs/cluster.md, Upgrades).", []string{"group"}, nil)
	replicaHaltedDesc  = prometheus.NewDesc("lockd_replica_halted", "1 when this node's replica of the group stopped applying it on a log entry or snapshot its build cannot read; the node answers the group's requests E unavailable.", []string{"group"}, nil)
)

// observations are what the node measures for /metrics alone.
type observations struct {
	proposeToApply histogram.Histogram
	logSaves       histogram.Histogram
	// leaders holds a *leaderSeen per Raft shard id, written by
	// dragonboat's event goroutine and read by scrapes.
	leaders sync.Map
}

type leaderSeen struct {
	leader  atomic.Uint64
	term    atomic.Uint64 // of the last leader counted
	changes atomic.Uint64
}

// leaderUpdated records a leadership change dragonboat reports: a leader
// in a new term is one change; a lost leader (id 0) is not counted.
func (o *observations) leaderUpdated(info raftio.LeaderInfo) {
	v, ok := o.leaders.Load(info.ShardID)
	if !ok {
		v, _ = o.leaders.LoadOrStore(info.ShardID, new(leaderSeen))
	}
	seen := v.(*leaderSeen)
	seen.leader.Store(info.LeaderID)
	if info.LeaderID != 0 && seen.term.Swap(info.Term) != info.Term {
		seen.changes.Add(1)
	}
}

// leaderChanges is the count for one group.
func (o *observations) leaderChanges(shardID uint64) uint64 {
	if v, ok := o.leaders.Load(shardID); ok {
		return v.(*leaderSeen).changes.Load()
	}
	return 0
}

// clusterCounters are the node's Raft-side counters, in ClusterStats.
var clusterCounters = []struct {
	desc  *prometheus.Desc
	value func(ClusterStats) uint64
}{
	{counterDesc("lockd_cluster_proposals_total", "Raft proposals made by this node (one per group per batch)."), func(s ClusterStats) uint64 { return s.Proposals }},
	{counterDesc("lockd_cluster_proposed_commands_total", "Commands carried by those proposals."), func(s ClusterStats) uint64 { return s.Commands }},
	{counterDesc("lockd_cluster_propose_retries_total", "Proposals retried because the group certainly did not take them."), func(s ClusterStats) uint64 { return s.ProposeRetries }},
	{counterDesc("lockd_cluster_propose_failures_total", "Proposals given up (the requests were answered E unavailable)."), func(s ClusterStats) uint64 { return s.ProposeFailures }},
	{counterDesc("lockd_cluster_unavailable_total", "Requests answered E unavailable."), func(s ClusterStats) uint64 { return s.Unavailable }},
	{counterDesc("lockd_cluster_orphan_releases_total", "Release proposals, retries included, for grants whose waiter is gone from this node."), func(s ClusterStats) uint64 { return s.OrphanReleases }},
	{counterDesc("lockd_cluster_expires_total", "Lease expiries proposed by this node as a group leader."), func(s ClusterStats) uint64 { return s.Expires }},
	{counterDesc("lockd_cluster_leader_transfers_total", "Leader transfers this node asked for, as a group leader, toward the node proposing most."), func(s ClusterStats) uint64 { return s.LeaderTransfers }},
	{counterDesc("lockd_cluster_raft_frames_sent_total", "Raft message frames this node wrote to its peers, one network hop each."), func(s ClusterStats) uint64 { return s.RaftFramesSent }},
	{counterDesc("lockd_cluster_raft_connections_opened_total", "Raft message connections this node dialed to its peers, redials included: one per peer while the links hold."), func(s ClusterStats) uint64 { return s.RaftStreamsOpened }},
	{counterDesc("lockd_cluster_raft_forged_addresses_total", "Raft addresses a frame from outside the membership gave a replica id before the membership added it at another address: each is logged, and the membership's address is dialed instead."), func(s ClusterStats) uint64 { return s.RaftForgedAddresses }},
}

func counterDesc(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }

var _ prometheus.Collector = (*Node)(nil)

// Describe is prometheus.Collector's.
func (n *Node) Describe(ch chan<- *prometheus.Desc) {
	ch <- groupLeaderDesc
	ch <- groupHasLeaderDesc
	ch <- leaderChangesDesc
	ch <- nodeIDDesc
	ch <- proposalApplyDesc
	ch <- raftLogSyncDesc
	ch <- logFormatDesc
	ch <- replicaHaltedDesc
	for _, c := range clusterCounters {
		ch <- c.desc
	}
}

// Collect reads the leaders and counters at scrape time.
func (n *Node) Collect(ch chan<- prometheus.Metric) {
	for i, g := range n.groups {
		group := strconv.Itoa(i + 1)
		leader := n.Leader(i)
		hasLeader := 0.0
		if leader != 0 {
			hasLeader = 1
		}
		ch <- prometheus.MustNewConstMetric(groupLeaderDesc, prometheus.GaugeValue, float64(leader), group)
		ch <- prometheus.MustNewConstMetric(groupHasLeaderDesc, prometheus.GaugeValue, hasLeader, group)
		ch <- prometheus.MustNewConstMetric(leaderChangesDesc, prometheus.CounterValue, float64(n.obs.leaderChanges(g.shardID)), group)
		halted := 0.0
		if g.halted() {
			halted = 1
		}
		ch <- prometheus.MustNewConstMetric(logFormatDesc, prometheus.GaugeValue, float64(n.LogFormat(i)), group)
		ch <- prometheus.MustNewConstMetric(replicaHaltedDesc, prometheus.GaugeValue, halted, group)
	}
	for _, h := range []struct {
		desc *prometheus.Desc
		h    *histogram.Histogram
	}{{proposalApplyDesc, &n.obs.proposeToApply}, {raftLogSyncDesc, &n.obs.logSaves}} {
		var s histogram.Snapshot
		h.h.AddTo(&s)
		ch <- prometheus.MustNewConstHistogram(h.desc, s.Count(), s.Sum.Seconds(), s.Cumulative())
	}
	ch <- prometheus.MustNewConstMetric(nodeIDDesc, prometheus.GaugeValue, float64(n.cfg.NodeID))
	s := n.ClusterStats()
	for _, c := range clusterCounters {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.value(s)))
	}
}

// AcquireAge is how long ago the acquire h (a request this node
// received) arrived, for the server's acquire latency.
func (n *Node) AcquireAge(h engine.Handle) (time.Duration, bool) {
	p, ok := h.(*pending)
	if !ok {
		return 0, false
	}
	return n.clock() - p.start, true
}

// Stats sums the replicated tables of this replica (keys, tokens, the keys
// gates: closed when any group's is) and the node's own gates (waiters,
// in-flight).
func (n *Node) Stats() engine.Stats {
	var st engine.Stats
	var keysClosed bool
	var keysRefused uint64
	for _, g := range n.groups {
		f := g.fsm.Load()
		if f == nil {
			continue
		}
		f.mu.Lock()
		st.Keys += len(f.state.locks)
		st.TokensIssued += f.state.tokens.Issued
		st.LastToken = max(st.LastToken, f.state.tokens.Last)
		// The replicated flag changes only when an acquire asks; the gate
		// is open again as soon as the count is below its reopening mark.
		f.holdTimes.AddTo(&st.HoldTimes)
		keys := int64(len(f.state.locks))
		keysClosed = keysClosed || f.state.keysClosed && !engine.NewGateRule(int64(g.maxKeys)).Reopens(keys)
		f.mu.Unlock()
		keysRefused += f.keysRefused.Load()
	}
	st.WaitersGate, st.InflightGate = n.waiters.Stats(), n.inflight.Stats()
	st.Waiters, st.Inflight = st.WaitersGate.Count, st.InflightGate.Count
	st.KeysGate = engine.GateStats{Open: !keysClosed, Limit: n.cfg.MaxKeys, Count: st.Keys, Refused: keysRefused}
	st.UndeliveredQueued = n.stats.abandoned.Load()
	st.LeaseExpiries = n.stats.expires.Load()
	st.Tenants = n.quotas.Stats(n.Namespace)
	for i := range st.Tenants {
		// The keys gate holds no units here: the replicas count the keys.
		st.Tenants[i].KeysGate.Count = n.tenantKeys(st.Tenants[i].Tenant)
	}
	return st
}

// ClusterStats are counters for benchmarks and tests.
type ClusterStats struct {
	Proposals, Commands, ProposeRetries, ProposeFailures, Unavailable, OrphanReleases, Expires, LeaderTransfers uint64
	RaftFramesSent, RaftStreamsOpened                                                                           uint64
	// RaftForgedAddresses counts, for the whole process, the addresses a
	// frame from outside the membership gave a replica id first that the
	// membership then superseded (raftnet, raft_sources.go).
	RaftForgedAddresses uint64
}

// ClusterStats returns the node's Raft-side counters.
func (n *Node) ClusterStats() ClusterStats {
	s := &n.stats
	return ClusterStats{
		Proposals: s.proposals.Load(), Commands: s.commands.Load(), ProposeRetries: s.proposeRetries.Load(),
		ProposeFailures: s.proposeFailures.Load(), Unavailable: s.unavailable.Load(),
		OrphanReleases: s.orphanReleases.Load(), Expires: s.expires.Load(), LeaderTransfers: s.leaderTransfers.Load(),
		RaftFramesSent: s.raftFramesSent.Load(), RaftStreamsOpened: s.raftStreams.Load(),
		RaftForgedAddresses: raftnet.ForgedAddresses(),
	}
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
