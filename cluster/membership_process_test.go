package cluster

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/lockd/lockd/internal/poll"
)

// buildLockctl builds the lockctl binary into dir.
func buildLockctl(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "lockctl")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/lockctl").CombinedOutput(); err != nil {
		t.Fatalf("build lockctl: %v\n%s", err, out)
	}
	return bin
}

// lockctlCluster runs `lockctl cluster --admin ADDR --json ARGS…` against
// p and decodes the membership it prints.
func lockctlCluster(t *testing.T, bin string, p *proc, args ...string) Membership {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"cluster", "--admin", p.admin, "--json"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("lockctl cluster %v through node %d: %v\n%s", args, p.id, err, stderr)
	}
	var m Membership
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("lockctl cluster %v: %v\n%s", args, err, out)
	}
	return m
}

// awaitAdmin waits until p's admin endpoint accepts connections.
func awaitAdmin(t *testing.T, p *proc) {
	t.Helper()
	var err error
	up := poll.Until(20*time.Second, 20*time.Millisecond, func() bool {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", p.admin, time.Second); err == nil {
			c.Close()
		}
		return err == nil
	})
	if !up {
		t.Fatalf("node %d: admin endpoint not up in 20 s: %v", p.id, err)
	}
}

// TestProcessesMembershipChanges changes a 3-node cluster's membership
// with lockctl while lock traffic runs through every member and the
// history checker watches: it grows to 4 nodes, shrinks back by removing
// a live node, then replaces a node killed -9 by a fresh one, round after
// round, until none of the first nodes is left. After each change every
// group lists the same members, and the new node serves.
func TestProcessesMembershipChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	bin, ctl := buildLockd(t, dir), buildLockctl(t, dir)
	const groups = 3
	procs := startProcesses(t, bin, dir, groups) // procs[i] is node i+1
	// join makes node len(procs)+1, new to the cluster, waiting to be added.
	join := func() *proc {
		ports := freePorts(t, 3)
		id := uint64(len(procs) + 1)
		p := &proc{
			id:     id,
			listen: fmt.Sprintf("127.0.0.1:%d", ports[1]),
			admin:  fmt.Sprintf("127.0.0.1:%d", ports[2]),
			log:    filepath.Join(dir, fmt.Sprintf("node%d.log", id)),
		}
		raft := fmt.Sprintf("127.0.0.1:%d", ports[0])
		p.args = append(p.serveArgs(raft, []string{fmt.Sprintf("%d=%s", id, raft)}, dir, groups, 2*time.Second), "--join")
		procs = append(procs, p)
		killOnCleanup(t, []*proc{p})
		return p
	}
	for g := range groups {
		groupLeader(t, procs, g)
	}
	members := []uint64{1, 2, 3}
	// checkMembers asks node via lockctl and wants exactly want in every group.
	checkMembers := func(via *proc, want []uint64, while string) {
		t.Helper()
		m := lockctlCluster(t, ctl, via, "list")
		var got []uint64
		for _, mb := range m.Members {
			if mb.Groups != groups {
				t.Fatalf("%s: node %d is a member of %d of %d groups", while, mb.ID, mb.Groups, groups)
			}
			got = append(got, mb.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: members %v, want %v", while, got, want)
		}
	}
	// live is a running member to ask, other than but.
	live := func(but uint64) *proc {
		for _, id := range members {
			if id != but && procs[id-1].alive() {
				return procs[id-1]
			}
		}
		t.Fatal("no live member")
		return nil
	}
	add := func() *proc {
		p := join()
		p.start(t, bin)
		awaitAdmin(t, p)
		lockctlCluster(t, ctl, live(0), "add", strconv.FormatUint(p.id, 10), p.raftAddr())
		members = append(members, p.id)
		checkMembers(p, members, fmt.Sprintf("node %d added", p.id))
		return p
	}
	remove := func(id uint64) {
		lockctlCluster(t, ctl, live(id), "remove", strconv.FormatUint(id, 10))
		members = slices.DeleteFunc(members, func(m uint64) bool { return m == id })
		checkMembers(live(0), members, fmt.Sprintf("node %d removed", id))
	}

	traffic := startLockTraffic(procs, []string{"member/0", "member/1", "member/2", "member/3", "member/4", "member/5"}, 6)
	traffic.awaitGrants(t, 60, "before any change")

	// Grow to four, then shrink back by removing a live node.
	traffic.serveThrough(add())
	traffic.awaitGrants(t, 40, "with four nodes")
	remove(1)
	procs[0].kill9()
	traffic.awaitGrants(t, 40, "node 1 removed")

	// Replace a dead node, round after round; every fourth round the dead
	// node is the leader of group 1.
	const rounds = 10
	var kills recoveries
	for round := range rounds {
		victim := members[round%len(members)]
		if round%4 == 0 {
			victim = groupLeader(t, procs, 0)
		}
		t.Logf("round %d: kill -9 node %d, replace it (members %v)", round, victim, members)
		killedAt := time.Now()
		procs[victim-1].kill9()
		kills = append(kills, probeRecovery(t, live(victim), "member/0", killedAt))
		remove(victim)
		traffic.serveThrough(add())
		traffic.awaitGrants(t, 30, fmt.Sprintf("round %d, node %d replaced", round, victim))
	}
	traffic.finish()

	if slices.ContainsFunc(members, func(id uint64) bool { return id <= 3 }) {
		t.Fatalf("members %v: a first node is left", members)
	}
	total := traffic.checkHistory(t)
	t.Logf("history: %d grants checked over %d membership changes; responses %v; %d late grants released",
		total, 2+2*rounds, fmtStats(traffic.stats), traffic.lateGrants)
	t.Logf("kill -9 of a member: member/0 was acquirable again after %s", kills)
}
