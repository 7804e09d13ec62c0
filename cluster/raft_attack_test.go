package cluster

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/testcerts"
)

// attackedCluster starts 3 lockd processes of one group on loopback
// (plain TCP Raft) and waits for its leader; skipped with -short. It
// returns them, the binary and the directory they run from.
func attackedCluster(t *testing.T) (procs []*proc, bin, dir string) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir = t.TempDir()
	bin = buildLockd(t, dir)
	procs = startProcesses(t, bin, dir, 1)
	groupLeader(t, procs, 0)
	return procs, bin, dir
}

// sendForged writes one frame of mb to a node's Raft port as an attacker
// that reaches it would, and waits for the node to close the connection.
func sendForged(t *testing.T, raftAddr string, mb pb.MessageBatch) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", raftAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := writeBatch(conn, mb); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("forged frame %+v: %v, want the connection closed", mb, err)
	}
}

// writeBatch writes mb to conn as one frame of the Raft transport.
func writeBatch(conn net.Conn, mb pb.MessageBatch) error {
	body, err := mb.Marshal()
	if err != nil {
		return err
	}
	return raftnet.WriteFrame(conn, raftnet.FrameMessages, body, raftnet.WriteTimeout)
}

// lockCycle acquires and releases key through p's client port.
func lockCycle(t *testing.T, p *proc, owner uint64, key string) {
	t.Helper()
	w, err := p.connect()
	if err != nil {
		t.Fatalf("node %d: %v", p.id, err)
	}
	defer w.close()
	if err := w.send(codec.AppendAcquire(nil, owner, 30, 5, key)); err != nil {
		t.Fatal(err)
	}
	r := expectResp(t, w, codec.OpAcquired, owner)
	if err := w.send(codec.AppendRelease(nil, owner, r.Token, key)); err != nil {
		t.Fatal(err)
	}
	expectResp(t, w, codec.OpReleased, owner)
}

// Forged Raft frames from an attacker who reaches a node's Raft port
// (plain TCP on loopback, the default there) are dropped with their
// connection: one naming a member at another address (dragonboat's
// address registry would panic, "inconsistent target", and the node
// exit), one naming an address that is not host:port (dragonboat's check
// panics on it), one naming no receiver (its delivery panics), one for
// no group of the node, naming
// no sender, or carrying a snapshot to install (dragonboat makes those
// locally from the chunks it received) is not heard either. The node keeps
// serving locks through its group.
func TestProcessesForgedRaftFramesAreDropped(t *testing.T) {
	procs, _, _ := attackedCluster(t)
	lockCycle(t, procs[0], 1, "forged/before")

	target := procs[0]
	raftAddr := target.raftAddr()
	group := shardID(1, 0)
	forged := func(from uint64, source string, shard uint64) pb.MessageBatch {
		return pb.MessageBatch{DeploymentId: raftnet.DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
			Requests: []pb.Message{{Type: pb.Heartbeat, ShardID: shard, From: from, To: target.id, Term: 1 << 40}}}
	}
	member2 := procs[1].raftAddr()
	toNobody := forged(2, member2, group)
	toNobody.Requests[0].To = 0
	install := forged(2, member2, group)
	install.Requests[0].Type = pb.InstallSnapshot
	for _, mb := range []pb.MessageBatch{
		forged(2, "127.0.0.1:1", group),     // a member at an address not its own
		forged(3, "not-an-address", group),  // a source dragonboat refuses to file
		forged(99, "not-an-address", group), // the same from a sender not known as a member
		forged(2, "127.0.0.1:1", 77),        // no group of this node
		forged(0, "127.0.0.1:1", group),     // no sender
		toNobody,                            // no receiver (dragonboat panics on it)
		install,                             // a snapshot to install, a message only made locally
	} {
		sendForged(t, raftAddr, mb)
	}
	for i, p := range procs {
		select {
		case <-p.done:
			t.Fatalf("node %d exited after forged frames", p.id)
		default:
		}
		lockCycle(t, p, uint64(10+i), fmt.Sprintf("forged/after/%d", i))
	}
	if l := groupLeader(t, procs, 0); l == 0 {
		t.Fatal("no leader after forged frames")
	}
}

// adminMembers asks p's admin endpoint to add (id, addr) or, with addr
// empty, to remove id, and fails the test unless it answers 200.
func adminMembers(t *testing.T, p *proc, id uint64, addr string) {
	t.Helper()
	method, path, body := http.MethodPost, MembersPath, fmt.Sprintf(`{"id": %d, "raft_addr": %q}`, id, addr)
	if addr == "" {
		method, path, body = http.MethodDelete, fmt.Sprintf("%s/%d", MembersPath, id), ""
	}
	r, err := http.NewRequest(method, "http://"+p.admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s %s", method, path, resp.Status, out)
	}
}

// forgeUntilClosed writes mb to raftAddr on a new connection and waits for
// the node to close it.
func forgeUntilClosed(raftAddr string, mb pb.MessageBatch) error {
	conn, err := net.DialTimeout("tcp", raftAddr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := writeBatch(conn, mb); err != nil {
		return err
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, conn)
	return err
}

// A frame naming a member added a moment ago, at another address than the
// membership gives it, is refused: the node reads the memberships again
// before it takes a sender for unknown, even while other frames keep the
// last reading recent; a frame that reached dragonboat's address registry
// with its address would make the registry panic ("inconsistent target")
// and the node exit. Each round adds a
// member (on no running node) through the node attacked, then forges its
// frames, then removes it.
func TestProcessesForgedFramesRightAfterAnAddition(t *testing.T) {
	procs, _, _ := attackedCluster(t)
	target := procs[0]
	awaitAdmin(t, target)
	raftAddr := target.raftAddr()
	group := shardID(1, 0)
	forged := func(from uint64, source string) pb.MessageBatch {
		return pb.MessageBatch{DeploymentId: raftnet.DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
			Requests: []pb.Message{{Type: pb.Heartbeat, ShardID: group, From: from, To: target.id, Term: 1 << 40}}}
	}

	// Member 2 at another address, over and over: each is refused, and
	// each made the node read the memberships if it had not lately.
	stop, keepReading := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				keepReading <- nil
				return
			default:
			}
			if err := forgeUntilClosed(raftAddr, forged(2, "127.0.0.1:1")); err != nil {
				keepReading <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-keepReading; err != nil {
			t.Errorf("forged frames of member 2: %v", err)
		}
	}()

	unused := freePorts(t, 2*3)
	for round := range 3 {
		id := uint64(4 + round)
		// The groups' log format is above the base by now: the member's
		// address must state that it reads it (AddMember).
		stopStating := stateFormatAt(t, fmt.Sprintf("127.0.0.1:%d", unused[2*round]), id)
		adminMembers(t, target, id, fmt.Sprintf("127.0.0.1:%d", unused[2*round]))
		stopStating()
		for range 5 {
			if err := forgeUntilClosed(raftAddr, forged(id, fmt.Sprintf("127.0.0.1:%d", unused[2*round+1]))); err != nil {
				t.Fatalf("round %d: a forged frame of the member just added: %v, want the connection closed", round, err)
			}
		}
		select {
		case <-target.done:
			t.Fatalf("round %d: node %d exited after a forged frame of member %d", round, target.id, id)
		default:
		}
		adminMembers(t, target, id, "")
	}
	lockCycle(t, target, 1, "forged/added")
}

// A frame naming a replica id the group does not have yet, at a made-up
// address, is let through with that address (a joining or lagging node
// must be able to answer senders it does not know as members yet), and
// dragonboat's registry keeps it. When the operator then adds that id at
// its real address, the registry panics on dragonboat's apply path in
// every node told the forged one; each repairs it instead: it stays up,
// counts it, and dials the member's real address, so the new node gets
// the group's log and serves locks.
func TestProcessesForgedAddressOfAReplicaAddedLater(t *testing.T) {
	procs, bin, dir := attackedCluster(t)
	group := shardID(1, 0)

	for _, p := range procs {
		conn, err := net.DialTimeout("tcp", p.raftAddr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		frame := func(from uint64) pb.MessageBatch {
			return pb.MessageBatch{DeploymentId: raftnet.DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: "127.0.0.1:1",
				Requests: []pb.Message{{Type: pb.HeartbeatResp, ShardID: group, From: from, To: p.id, Term: 1}}}
		}
		// Replica 4 at a made-up address, taken; then a frame naming no
		// sender, refused: the node closing the connection shows it
		// handled the first.
		for _, from := range []uint64{4, 0} {
			if err := writeBatch(conn, frame(from)); err != nil {
				t.Fatal(err)
			}
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, conn); err != nil {
			t.Fatalf("node %d: %v, want the connection closed after the frame naming no sender", p.id, err)
		}
		conn.Close()
	}

	ports := freePorts(t, 3)
	joiner := &proc{id: 4, listen: fmt.Sprintf("127.0.0.1:%d", ports[1]), admin: fmt.Sprintf("127.0.0.1:%d", ports[2]),
		log: filepath.Join(dir, "node4.log")}
	joinerRaft := fmt.Sprintf("127.0.0.1:%d", ports[0])
	joiner.args = append(joiner.serveArgs(joinerRaft, []string{"4=" + joinerRaft}, dir, 1, 2*time.Second), "--join")
	killOnCleanup(t, []*proc{joiner})
	joiner.start(t, bin)
	awaitAdmin(t, joiner)
	adminMembers(t, procs[0], 4, joinerRaft)

	const forgedSeries = "lockd_cluster_raft_forged_addresses_total"
	for _, p := range procs {
		waitUntil(t, 20*time.Second, fmt.Sprintf("node %d applies the addition of node 4 (or exits)", p.id), func() bool {
			n, err := p.metric(forgedSeries)
			return isClosed(p.done) || err == nil && n > 0
		})
		if isClosed(p.done) {
			t.Fatalf("node %d exited as it applied the addition of node 4 at its real address", p.id)
		}
	}
	all := append(slices.Clone(procs), joiner)
	waitUntil(t, 20*time.Second, "node 4 knows the group's leader", func() bool {
		l, err := joiner.leaderView(0)
		return err == nil && l != 0
	})
	lockCycle(t, joiner, 4, "forged/joined")
	for i, p := range all {
		if isClosed(p.done) {
			t.Fatalf("node %d exited", p.id)
		}
		lockCycle(t, p, uint64(40+i), fmt.Sprintf("forged/joined/%d", p.id))
	}
	for _, p := range procs {
		if n, err := p.metric(forgedSeries); err != nil || n != 1 {
			t.Errorf("node %d: %s %d, %v; want 1", p.id, forgedSeries, n, err)
		}
		if log, err := os.ReadFile(p.log); err != nil || !strings.Contains(string(log), "outside the membership gave this replica its first address") {
			t.Errorf("node %d: the repair is not in its log (%v)", p.id, err)
		}
	}
}

// Plain TCP Raft where other machines reach it let anyone forge a
// member's higher-term messages and keep a group without a leader: a node
// refuses to start on such an address without mutual TLS, unless told
// --insecure-raft.
func TestStartRefusesPlainRaftOffLoopback(t *testing.T) {
	base := Config{NodeID: 1, Peers: map[uint64]string{1: "0.0.0.0:7451"}, DataDir: t.TempDir(), Logger: testLogger()}
	n, err := Start(base)
	if err == nil {
		n.Close()
		t.Fatal("a node started plain TCP Raft on 0.0.0.0")
	}
	if !strings.Contains(err.Error(), "--insecure-raft") || !strings.Contains(err.Error(), "--raft-tls-cert") {
		t.Fatalf("refusal %q names neither way out", err)
	}
	for _, cfg := range []Config{
		{RaftAddr: "0.0.0.0:7451", InsecureRaft: true},
		{RaftAddr: "10.1.2.3:7451", RaftTLS: &tls.Config{}},
		{RaftAddr: "127.0.0.1:7451"},
		{RaftAddr: "localhost:7451"},
	} {
		if err := checkRaftExposure(cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// A rogue join without the admin token: a node restarted with
// --admin-token-file answers 401 to adding or removing a member without
// it, and the membership stays as it was (both answered 200 before, and
// the rogue node then read and released locks through its own replica).
// lockctl with the token file lists the members.
func TestProcessesRogueJoinNeedsTheAdminToken(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	bin, ctl := buildLockd(t, dir), buildLockctl(t, dir)
	procs := startProcesses(t, bin, dir, 1)
	groupLeader(t, procs, 0)
	tokenFile := filepath.Join(dir, "admin-token")
	const token = "0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := procs[0]
	p.kill9()
	p.args = append(p.args, "--admin-token-file", tokenFile)
	p.start(t, bin)
	awaitAdmin(t, p)

	for _, req := range []struct{ method, path, body string }{
		{http.MethodPost, MembersPath, `{"id": 9, "raft_addr": "127.0.0.1:1"}`},
		{http.MethodDelete, MembersPath + "/3", ""},
		{http.MethodGet, "/v1/locks/default/k", ""},
	} {
		r, err := http.NewRequest(req.method, "http://"+p.admin+req.path, strings.NewReader(req.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s %s without the token: %s, want 401", req.method, req.path, resp.Status)
		}
	}
	out, err := exec.Command(ctl, "cluster", "--admin", p.admin, "--admin-token-file", tokenFile, "--json", "list").Output()
	if err != nil {
		t.Fatalf("lockctl cluster list with the token: %v", err)
	}
	var m Membership
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if got := memberIDs(m); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("members after the rogue requests: %v, want 1 2 3", got)
	}
}

// A node restarted with --admin-tls-cert, --admin-tls-key and
// --admin-tls-client-ca changes its membership for a client certificate
// its CA signed only: without one it answers 401, one of another CA fails
// the handshake, and lockctl with its --admin-ca, --admin-cert and
// --admin-key lists the members and removes one.
func TestProcessesMembershipNeedsAnAdminCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	bin, ctl := buildLockd(t, dir), buildLockctl(t, dir)
	procs := startProcesses(t, bin, dir, 1)
	groupLeader(t, procs, 0)
	ca, rogue := testcerts.NewCA(t, "lockd admin CA"), testcerts.NewCA(t, "rogue CA")
	files := ca.WriteFiles(t, dir, "admin", "127.0.0.1")
	operator := ca.WriteFiles(t, dir, "operator", "operator")
	p := procs[0]
	p.kill9()
	p.args = append(p.args, "--admin-tls-cert", files.Cert, "--admin-tls-key", files.Key, "--admin-tls-client-ca", files.CA)
	p.start(t, bin)
	awaitAdmin(t, p)

	intruderCert := rogue.Issue(t, "intruder")
	anonymous := &tls.Config{RootCAs: ca.Pool()}
	intruder := &tls.Config{RootCAs: ca.Pool(), GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &intruderCert, nil
	}}
	post := func(cfg *tls.Config) (*http.Response, error) {
		c := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
		return c.Post("https://"+p.admin+MembersPath, "application/json", strings.NewReader(`{"id": 9, "raft_addr": "127.0.0.1:1"}`))
	}
	resp, err := post(anonymous)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("adding a member without a certificate: %s, want 401", resp.Status)
	}
	if resp, err := post(intruder); err == nil {
		resp.Body.Close()
		t.Fatalf("adding a member with a certificate of another CA: %s, want the handshake refused", resp.Status)
	}

	admin := []string{"cluster", "--admin", p.admin, "--admin-ca", files.CA, "--admin-cert", operator.Cert, "--admin-key", operator.Key}
	list := func() []uint64 {
		t.Helper()
		out, err := exec.Command(ctl, append(admin, "--json", "list")...).Output()
		if err != nil {
			t.Fatalf("lockctl cluster list with a certificate of the CA: %v", err)
		}
		var m Membership
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatal(err)
		}
		return memberIDs(m)
	}
	if got := list(); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("members after the refused requests: %v, want 1 2 3", got)
	}
	if out, err := exec.Command(ctl, append(admin, "remove", "3")...).CombinedOutput(); err != nil {
		t.Fatalf("lockctl cluster remove 3 with a certificate of the CA: %v\n%s", err, out)
	}
	if got := list(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("members after removing 3: %v, want 1 2", got)
	}
}

// stateFormatAt answers, at addr, every statement of a log format with
// node id's, of this build's newest format: a node added there passes
// AddMember's format check without running. The returned func stops it.
func stateFormatAt(t *testing.T, addr string, id uint64) func() {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if kind, body, err := raftnet.ReadFrame(conn, nil); err == nil && kind == raftnet.FrameLockd && len(body) > 0 && body[0] == peerFormat {
				_ = raftnet.WriteFrame(conn, raftnet.FrameLockd, appendStatement(nil, id, logFormatNewest), time.Second)
			}
			conn.Close()
		}
	}()
	return func() { ln.Close(); <-done }
}
