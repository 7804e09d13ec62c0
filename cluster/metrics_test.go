package cluster

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lockd/lockd/codec"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestClusterMetrics: a cluster node's /metrics is the server's families
// with the node's own, each family once, parsed as Prometheus does: the
// node's id, its view of every group's leader, its Raft counters, and the
// standard go_* ones.
func TestClusterMetrics(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	srvs := clusterServers(t, tc)
	w := mustWire(t, srvs[0].Addr())
	if err := w.send(codec.AppendAcquire(nil, 1, 30, 0, "metrics-key")); err != nil {
		t.Fatal(err)
	}
	expectResp(t, w, codec.OpAcquired, 1)

	resp, err := http.Get("http://" + srvs[0].AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	for name := range families {
		if n := strings.Count(string(body), "# TYPE "+name+" "); n != 1 {
			t.Errorf("%d TYPE lines for %s", n, name)
		}
	}
	if id := families["lockd_cluster_node_id"]; id == nil || id.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("lockd_cluster_node_id: %v", id)
	}
	leaders := families["lockd_cluster_group_leader"]
	if leaders == nil || len(leaders.GetMetric()) != tc.cfgs[0].Groups {
		t.Errorf("lockd_cluster_group_leader: %v, want one series per group (%d)", leaders, tc.cfgs[0].Groups)
	}
	for _, m := range leaders.GetMetric() {
		if v := m.GetGauge().GetValue(); v < 1 || v > 3 {
			t.Errorf("group %s: leader %v, want a node id of a ready cluster", m.GetLabel()[0].GetValue(), v)
		}
	}
	if p := families["lockd_cluster_proposals_total"]; p == nil || p.GetMetric()[0].GetCounter().GetValue() < 1 {
		t.Errorf("lockd_cluster_proposals_total: %v, want the acquire's proposal", p)
	}
	// Node 1 took part in the acquire's commit (as its leader or as the
	// follower that forwarded it), so it wrote frames to its peers.
	if f := families["lockd_cluster_raft_frames_sent_total"]; f == nil || f.GetMetric()[0].GetCounter().GetValue() < 1 {
		t.Errorf("lockd_cluster_raft_frames_sent_total: %v, want the commit's frames", f)
	}
	// Every group has elected a leader, and node 1 saw it.
	for _, name := range []string{"lockd_cluster_group_has_leader", "lockd_cluster_leader_changes_total"} {
		f := families[name]
		if f == nil || len(f.GetMetric()) != tc.cfgs[0].Groups {
			t.Errorf("%s: %v, want one series per group", name, f)
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetGauge().GetValue() + m.GetCounter().GetValue(); v < 1 {
				t.Errorf("%s group %s: %v, want 1 or more for a led group", name, m.GetLabel()[0].GetValue(), v)
			}
		}
	}
	// The acquire was proposed and applied, its entry written to the Raft
	// log, and its answer (A, through Raft) observed from arrival to write.
	for _, name := range []string{"lockd_cluster_proposal_apply_duration_seconds", "lockd_cluster_raft_log_sync_duration_seconds", "lockd_acquire_duration_seconds"} {
		f := families[name]
		if f == nil {
			t.Errorf("/metrics has no %s", name)
			continue
		}
		var n uint64
		for _, m := range f.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
		if n < 1 {
			t.Errorf("%s observed nothing", name)
		}
	}
	for _, name := range []string{"lockd_keys", "lockd_tokens_issued_total", "lockd_cluster_leader_transfers_total", "lockd_cluster_raft_connections_opened_total", "go_goroutines"} {
		if families[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if t.Failed() {
		t.Logf("%s", body)
	}
}
