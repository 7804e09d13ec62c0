package cluster

// This file owns the node's Prometheus collector: the server registers a
// backend that is a prometheus.Collector beside its own families.

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	groupLeaderDesc = prometheus.NewDesc("lockd_cluster_group_leader", "This node's view of each group's leader (0 unknown).", []string{"group"}, nil)
	nodeIDDesc      = prometheus.NewDesc("lockd_cluster_node_id", "This node's id.", nil, nil)
)

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
}

func counterDesc(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }

var _ prometheus.Collector = (*Node)(nil)

// Describe is prometheus.Collector's.
func (n *Node) Describe(ch chan<- *prometheus.Desc) {
	ch <- groupLeaderDesc
	ch <- nodeIDDesc
	for _, c := range clusterCounters {
		ch <- c.desc
	}
}

// Collect reads the leaders and counters at scrape time.
func (n *Node) Collect(ch chan<- prometheus.Metric) {
	for i := range n.groups {
		ch <- prometheus.MustNewConstMetric(groupLeaderDesc, prometheus.GaugeValue, float64(n.Leader(i)), strconv.Itoa(i+1))
	}
	ch <- prometheus.MustNewConstMetric(nodeIDDesc, prometheus.GaugeValue, float64(n.cfg.NodeID))
	s := n.ClusterStats()
	for _, c := range clusterCounters {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.value(s)))
	}
}
