package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"golang.org/x/sys/unix"
)

// netnsNetwork is a private network for the partition test: one network
// namespace per node, each joined by a veth pair to a bridge that lives in
// a namespace of its own, with addresses in 10.213.0.0/24 that exist only
// in those namespaces. Nothing is created in, or changed in, the host's
// network namespace: every link is made inside the test's namespaces.
type netnsNetwork struct {
	t      *testing.T
	prefix string   // lockd-t<pid>: names unique to this test process
	made   []string // namespaces created so far, deleted on cleanup
}

func (n *netnsNetwork) bridgeNS() string          { return n.prefix + "-br" }
func (n *netnsNetwork) nodeNS(id uint64) string   { return fmt.Sprintf("%s-n%d", n.prefix, id) }
func (n *netnsNetwork) nodeAddr(id uint64) string { return fmt.Sprintf("10.213.0.%d", id) }

// bridgePort is the bridge-side end of node id's veth pair; taking it down
// cuts the node off from every other node and nothing else.
func (n *netnsNetwork) bridgePort(id uint64) string { return fmt.Sprintf("n%d", id) }

// runIP runs iproute2's ip with args.
func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetnsNetwork builds the network for nodes 1..nodes, each node's
// eth0 one end of a veth pair whose other end is its bridge port.
func newNetnsNetwork(t *testing.T, nodes int) *netnsNetwork {
	t.Helper()
	return buildNetnsNetwork(t, "lockd-t", "the partition test", nodes, func(n *netnsNetwork, id uint64) [][]string {
		return [][]string{{"-n", n.bridgeNS(), "link", "add", n.bridgePort(id), "type", "veth", "peer", "name", "eth0", "netns", n.nodeNS(id)}}
	})
}

// buildNetnsNetwork makes a bridge namespace and one namespace per node,
// links each node's eth0 to a bridge port with the steps link gives, and
// brings everything up with the node's address. As root it fails the
// test, rather than skipping it, when namespaces cannot be made: CI runs
// as root with iproute2, so a failure there is a broken environment to
// look at. Only a developer who is not root is told to rerun as root.
func buildNetnsNetwork(t *testing.T, prefix, test string, nodes int, link func(n *netnsNetwork, id uint64) [][]string) *netnsNetwork {
	t.Helper()
	n := &netnsNetwork{t: t, prefix: fmt.Sprintf("%s%d", prefix, os.Getpid())}
	// Registered before anything exists, so a half-built network goes too.
	t.Cleanup(n.destroy)
	if err := n.addNS(n.bridgeNS()); err != nil {
		t.Fatalf("cannot create a network namespace; %s needs root and iproute2's `ip netns` (uid %d): %v", test, os.Getuid(), err)
	}
	br := n.bridgeNS()
	steps := [][]string{
		{"-n", br, "link", "add", "br0", "type", "bridge"},
		{"-n", br, "link", "set", "br0", "up"},
	}
	for id := uint64(1); id <= uint64(nodes); id++ {
		if err := n.addNS(n.nodeNS(id)); err != nil {
			t.Fatal(err)
		}
		ns := n.nodeNS(id)
		steps = append(steps, link(n, id)...)
		steps = append(steps,
			[]string{"-n", br, "link", "set", n.bridgePort(id), "master", "br0", "up"},
			[]string{"-n", ns, "addr", "add", n.nodeAddr(id) + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
			// Clients and /metrics use the namespace's own 127.0.0.1.
			[]string{"-n", ns, "link", "set", "lo", "up"},
		)
	}
	for _, args := range steps {
		if err := runIP(args...); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func (n *netnsNetwork) addNS(name string) error {
	if err := runIP("netns", "add", name); err != nil {
		return err
	}
	n.made = append(n.made, name)
	return nil
}

// destroy deletes the namespaces this test made, by name; their veth pairs
// and the bridge go with them. Processes inside must be gone first.
func (n *netnsNetwork) destroy() {
	for _, name := range n.made {
		if err := runIP("netns", "del", name); err != nil {
			n.t.Errorf("cleanup: %v", err)
		}
	}
}

func (n *netnsNetwork) isolate(id uint64) {
	n.t.Helper()
	if err := runIP("-n", n.bridgeNS(), "link", "set", n.bridgePort(id), "down"); err != nil {
		n.t.Fatal(err)
	}
}

func (n *netnsNetwork) heal(id uint64) {
	n.t.Helper()
	if err := runIP("-n", n.bridgeNS(), "link", "set", n.bridgePort(id), "up"); err != nil {
		n.t.Fatal(err)
	}
}

// dialer connects from inside node id's namespace, where the node's client
// and admin ports listen on that namespace's 127.0.0.1.
func (n *netnsNetwork) dialer(id uint64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	ns := n.nodeNS(id)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialInNetns(ctx, ns, network, addr)
	}
}

// dialInNetns connects from inside the network namespace ns. A socket
// belongs to the namespace of the thread that created it, for good, so the
// inNetns runs f on an OS thread locked to a goroutine and moved into
// ns. The thread is never unlocked: when the goroutine returns, the
// runtime ends the thread instead of reusing it in the wrong namespace.
func inNetns[T any](ns string, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		nsf, err := os.Open(filepath.Join("/var/run/netns", ns))
		if err != nil {
			done <- result{err: err}
			return
		}
		err = unix.Setns(int(nsf.Fd()), unix.CLONE_NEWNET)
		nsf.Close()
		if err != nil {
			done <- result{err: fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		v, err := f()
		done <- result{v, err}
	}()
	r := <-done
	return r.v, r.err
}

// dialInNetns dials addr from inside ns.
func dialInNetns(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	return inNetns(ns, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
}

// startNetnsProcesses starts 3 lockd cluster processes of bin, node id in
// network's namespace of node id, with groups Raft groups, their data and
// logs in dir, killed at the end of the test (before the namespaces go).
// It returns them and the executable their start takes (ip, which execs
// lockd in place, so the PID a signal goes to is lockd's).
func startNetnsProcesses(t *testing.T, network *netnsNetwork, bin, dir string, groups int) ([]*proc, string) {
	t.Helper()
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal(err)
	}
	var peers []string
	for id := uint64(1); id <= 3; id++ {
		peers = append(peers, fmt.Sprintf("%d=%s:7451", id, network.nodeAddr(id)))
	}
	procs := make([]*proc, 3)
	for i := range procs {
		id := uint64(i + 1)
		p := &proc{
			id:     id,
			listen: "127.0.0.1:7431",
			admin:  "127.0.0.1:7441",
			log:    filepath.Join(dir, fmt.Sprintf("node%d.log", id)),
			dial:   network.dialer(id),
		}
		p.args = append([]string{"netns", "exec", network.nodeNS(id), bin},
			append(p.serveArgs(network.nodeAddr(id)+":7451", peers, dir, groups, 2*time.Second), "--insecure-raft")...)
		procs[i] = p
	}
	// Registered after the network's cleanup, so it runs first: the
	// namespaces are deleted only once the processes in them are gone.
	killOnCleanup(t, procs)
	for _, p := range procs {
		p.start(t, ipPath)
	}
	return procs, ipPath
}

// keyInGroup returns a key named after prefix that hashes to group g.
func keyInGroup(prefix string, g, groups int) string {
	for i := 0; ; i++ {
		if key := fmt.Sprintf("%s/%d", prefix, i); groupOf("default", []byte(key), groups) == g {
			return key
		}
	}
}

// probeAcquire sends one ACQUIRE of key, waiting up to waitS seconds, to p on a connection of its
// own and returns the answer and how long it took. A grant is released at
// once, so probes never hold a lock for long.
func probeAcquire(p *proc, key string, waitS uint8) (codec.Response, time.Duration, error) {
	c, err := p.connect()
	if err != nil {
		return codec.Response{}, 0, err
	}
	defer c.close()
	sent := time.Now()
	if err := c.send(codec.AppendAcquire(nil, 1, trafficLease, waitS, key)); err != nil {
		return codec.Response{}, 0, err
	}
	r, err := c.read(10 * time.Second)
	took := time.Since(sent)
	if err == nil && r.Op == codec.OpAcquired {
		if c.send(codec.AppendRelease(nil, 2, r.Token, key)) == nil {
			_, _ = c.read(5 * time.Second)
		}
	}
	return r, took, err
}

// TestProcessesPartitions runs 3 lockd processes in network namespaces of
// their own under continuous lock traffic and, several times, cuts the
// leader of one group off from the other two nodes, then heals the cut.
// While cut, the isolated node must answer E unavailable — before the cut
// heals — and the other two must elect a leader and grant; after healing,
// the isolated node must grant again. At the end the recorded history is
// checked: no two clients held a key at once and tokens never went back.
// Every wait is for one of those events; a side that does not get there in
// a minute (probeRecovery) fails the test as hung, and no wall-clock bound is asserted.
//
// Raft runs on 10.213.0.N inside the namespaces; clients reach each node on
// its namespace's 127.0.0.1, so a cut separates nodes but never a node from
// its clients, which is what makes the minority side's answers observable.
func TestProcessesPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root: run `sudo make test` (CI runs as root, so it always runs there)")
	}
	testStart := time.Now()
	network := newNetnsNetwork(t, 3)
	dir := t.TempDir()
	const (
		groups = 4
		rounds = 4
	)
	procs, _ := startNetnsProcesses(t, network, buildLockd(t, dir), dir, groups)
	const key0 = "part/0"
	g0 := groupOf("default", []byte(key0), groups)
	groupLeader(t, procs, g0)

	traffic := startLockTraffic(procs, []string{key0, "part/1", "part/2", "part/3", "part/4", "part/5"}, 6)
	var unavailableProbes int
	var cuts recoveries
	for round := range rounds {
		traffic.awaitGrants(t, 40, fmt.Sprintf("round %d, before the cut", round))
		cut := groupLeader(t, procs, g0)
		other := procs[cut%3] // a node on the majority side
		network.isolate(cut)
		cutAt := time.Now()

		// Both sides at once: the minority must refuse while it is still
		// cut off (the cut heals only after its answer; the probe's read
		// deadline, five propose timeouts, fails a node that never
		// answers), and the majority must elect a leader and grant.
		var (
			wg          sync.WaitGroup
			minority    codec.Response
			minorityIn  time.Duration
			minorityErr error
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			minority, minorityIn, minorityErr = probeAcquire(procs[cut-1], keyInGroup(fmt.Sprintf("minority/%d", round), g0, groups), 0)
		}()
		majorityIn := probeRecovery(t, other, keyInGroup(fmt.Sprintf("majority/%d", round), g0, groups), cutAt)
		cuts = append(cuts, majorityIn)
		wg.Wait()
		if minorityErr != nil {
			t.Fatalf("round %d: isolated node %d did not answer: %v", round, cut, minorityErr)
		}
		if minority.Op != codec.OpError || minority.Reason != codec.Unavailable {
			t.Fatalf("round %d: isolated node %d answered %q (reason %s), want E unavailable", round, cut, minority.Op, minority.Reason.String())
		}
		unavailableProbes++

		// Requests the isolated node took before the probe were proposed
		// no later, so they too have met their propose timeout: the cut
		// has been seen by the traffic on that node as well.
		network.heal(cut)
		healedAt := time.Now()
		// The healed node must grant a free key again (no lease holds it).
		// A proposal attempt made before its Raft connections resume and
		// it hears from a leader may be lost, so it is probed until it
		// grants.
		recoveredIn := probeRecovery(t, procs[cut-1], keyInGroup(fmt.Sprintf("recover/%d", round), g0, groups), healedAt)
		t.Logf("round %d: cut node %d (leader of group %d): E unavailable there in %v; node %d granted %v after the cut; node %d granted again %v after healing",
			round, cut, g0+1, minorityIn.Round(time.Millisecond), other.id, majorityIn.Round(time.Millisecond),
			cut, recoveredIn.Round(time.Millisecond))
	}
	traffic.awaitGrants(t, 40, "after the last heal")
	traffic.finish()

	total := traffic.checkHistory(t)
	t.Logf("history: %d grants checked; responses %v (E unavailable: %d); %d rounds, %d E unavailable probes; %v in all",
		total, fmtStats(traffic.stats), traffic.errors[codec.Unavailable], rounds, unavailableProbes,
		time.Since(testStart).Round(time.Millisecond))
	t.Logf("partition of the leader: its group was acquirable again on the majority side after %s", cuts)
	for reason, n := range traffic.errors {
		if reason != codec.Unavailable {
			t.Errorf("%d answers E %s; only E unavailable is expected under partitions", n, reason.String())
		}
	}
	if total < 50 {
		t.Fatalf("only %d grants in the whole run", total)
	}
}
