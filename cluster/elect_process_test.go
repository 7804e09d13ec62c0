package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
)

// failoverBound is the cluster's documented failover target (docs/cluster.md:
// a key acquirable again within 2.5 s of kill -9 of its group's leader),
// plus room for a shared, busy test machine.
const failoverBound = 2500*time.Millisecond + 1500*time.Millisecond

// TestProcessesElectionFailsOverWhenTheLeadersNodeDies runs an election
// with one candidate on each of two nodes of a 3-process cluster, the
// leader on the node that leads the name's Raft group. kill -9 of that
// node cuts the leader off: its Lost closes on its own before its lease
// could lapse, and the other candidate wins with a higher term within
// the lease plus the failover bound.
func TestProcessesElectionFailsOverWhenTheLeadersNodeDies(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	bin := buildLockd(t, dir)
	const groups = 2
	procs := startProcesses(t, bin, dir, groups)
	const name = "svc/scheduler"
	raftLeader := groupLeader(t, procs, groupOf("default", []byte(name), groups))
	leaderNode, otherNode := procs[raftLeader-1], procs[raftLeader%3]
	for _, p := range procs {
		awaitAdmin(t, p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const lease = 3 * time.Second
	opts := client.ElectionOptions{Lease: lease, Round: 2 * time.Second}
	dial := func(p *proc) *client.Client {
		c, err := client.Dial(ctx, client.Config{Addrs: []string{p.listen}})
		if err != nil {
			t.Fatalf("dial node %d: %v", p.id, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	first, err := dial(leaderNode).Campaign(ctx, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan *client.Leadership, 1)
	second := dial(otherNode)
	go func() {
		l, err := second.Campaign(ctx, name, opts)
		if err != nil {
			t.Error(err)
		}
		won <- l
	}()

	// Two rounds of the second candidate run out, longer than the lease:
	// the leader holds on through renewals confirmed by the Raft group.
	for second.Stats().AbandonedSessions < 2 {
		select {
		case <-first.Lost():
			t.Fatalf("the leader lost its leadership with every node up: %v", first.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	select {
	case <-first.Lost():
		t.Fatalf("the leader lost its leadership with every node up: %v", first.Err())
	case <-won:
		t.Fatal("the second candidate won while the first led")
	default:
	}

	t.Logf("kill -9 node %d, the leader's node and leader of the name's group", leaderNode.id)
	killed := time.Now()
	leaderNode.kill9()
	var next *client.Leadership
	select {
	case next = <-won:
	case <-time.After(lease + failoverBound):
		t.Fatalf("no new leader within the lease %v plus the failover bound %v of the kill", lease, failoverBound)
	}
	if next == nil {
		t.FailNow()
	}
	took := time.Since(killed)
	if !isClosed(first.Lost()) {
		t.Fatal("a new leader was elected before the cut-off leader's Lost closed")
	}
	if next.Term() <= first.Term() {
		t.Fatalf("the new leader's term %d is not above the old one's %d", next.Term(), first.Term())
	}
	t.Logf("term %d won %v after the kill (term %d's Lost: %v)", next.Term(), took.Round(time.Millisecond), first.Term(), first.Err())
	if err := next.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
