package cluster

// This file owns the node's Prometheus exposition.

import (
	"fmt"
	"io"
)

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
