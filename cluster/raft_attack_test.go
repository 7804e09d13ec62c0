package cluster

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/rs/zerolog"
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
	fc := &frameConn{conn: conn}
	if err := fc.SendMessageBatch(mb); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("forged frame %+v: %v, want the connection closed", mb, err)
	}
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
// connection: one naming a member at another address made dragonboat's
// address registry panic ("inconsistent target") and the node exit; one
// naming an address that is not host:port panicked on its check, and one
// naming no receiver on its delivery; one for no group of the node, naming
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
		return pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
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
		toNobody,                            // no receiver (dragonboat panicked on it)
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
	if err := (&frameConn{conn: conn}).SendMessageBatch(mb); err != nil {
		return err
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, conn)
	return err
}

// A frame naming a member added a moment ago, at another address than the
// membership gives it, is refused: the node reads the memberships again
// before it takes a sender for unknown. It read them at most every 50 ms,
// so such a frame, sent while others kept that reading recent, reached
// dragonboat's address registry with its address, and the registry
// panicked ("inconsistent target") and the node exited. Each round adds a
// member (on no running node) through the node attacked, then forges its
// frames, then removes it.
func TestProcessesForgedFramesRightAfterAnAddition(t *testing.T) {
	procs, _, _ := attackedCluster(t)
	target := procs[0]
	awaitAdmin(t, target)
	raftAddr := target.raftAddr()
	group := shardID(1, 0)
	forged := func(from uint64, source string) pb.MessageBatch {
		return pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
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
// dragonboat's registry keeps it. When the operator then added that id at
// its real address, every node told the forged one exited as it applied
// the addition (the registry panicked on dragonboat's apply path). Now
// each repairs it: it stays up, counts it, and dials the member's real
// address, so the new node gets the group's log and serves locks.
func TestProcessesForgedAddressOfAReplicaAddedLater(t *testing.T) {
	procs, bin, dir := attackedCluster(t)
	group := shardID(1, 0)

	for _, p := range procs {
		conn, err := net.DialTimeout("tcp", p.raftAddr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		fc := &frameConn{conn: conn}
		frame := func(from uint64) pb.MessageBatch {
			return pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: "127.0.0.1:1",
				Requests: []pb.Message{{Type: pb.HeartbeatResp, ShardID: group, From: from, To: p.id, Term: 1}}}
		}
		// Replica 4 at a made-up address, taken; then a frame naming no
		// sender, refused: the node closing the connection shows it
		// handled the first.
		for _, from := range []uint64{4, 0} {
			if err := fc.SendMessageBatch(frame(from)); err != nil {
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

// A frame's header alone cannot make the transport allocate past its
// frame budget: 30 connections declaring the largest frame and sending a
// few bytes of it took a node from 28 MB to 2.16 GB when each buffer was
// allocated at once. Now one such frame is granted the guests' share, its
// body mapped outside the heap, and the others wait, allocating nothing;
// the granted one, silent after its first bytes, loses its grant with its
// connection after raftWriteTimeout, and the next is granted. And the
// connections one host may hold open are capped: one more than
// maxRaftConnsPerHost is closed at once.
func TestRaftTransportAllocatesWithinItsFrameBudget(t *testing.T) {
	server, _, _ := startTransport(t, false)
	const conns = maxRaftConnsPerHost
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range conns {
		c, err := net.Dial("tcp", server.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hdr := make([]byte, frameHeaderLen+100)
		binary.BigEndian.PutUint16(hdr, frameMagic)
		hdr[2] = frameMessages
		binary.BigEndian.PutUint32(hdr[3:], maxFrame)
		if _, err := c.Write(hdr); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, "one frame granted, the others waiting", func() bool {
		held, waiting := server.budget.inUse()
		return held == maxFrame && waiting == conns-1
	})
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > conns*4*frameReadStep+(8<<20) {
		t.Fatalf("%d connections that declared %d MiB frames and sent 100 bytes made the node allocate %d MiB", conns, maxFrame>>20, grown>>20)
	}
	extra, err := net.Dial("tcp", server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection %d from one host: read %v, want EOF (refused)", conns+1, err)
	}

	start := time.Now()
	waitUntil(t, raftWriteTimeout+5*time.Second, "the silent granted frame dropped and the next granted", func() bool {
		held, waiting := server.budget.inUse()
		return held == maxFrame && waiting == conns-2
	})
	if waited := time.Since(start); waited < raftWriteTimeout-time.Second {
		t.Fatalf("the next frame was granted after %v, before the silent one's %v deadline", waited, raftWriteTimeout)
	}
}

// A connection that sends no frame is closed after raftDialTimeout, so
// idle connections cannot hold the connection cap.
func TestRaftTransportClosesASilentConnection(t *testing.T) {
	server, _, _ := startTransport(t, false)
	c, err := net.Dial("tcp", server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(raftDialTimeout + 10*time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("silent connection: read %v after %v, want EOF (closed by the node)", err, time.Since(start))
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

// Over mutual TLS a node speaks only for the members at a host its
// certificate names: a frame giving another member's address is dropped
// with its connection, one giving its own is delivered, without its
// address (dragonboat files addresses from the membership only).
func TestRaftTLSPeerSpeaksOnlyForItsHost(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd raft CA")
	sources := &raftSources{}
	sources.view.Store(&sourcesView{groups: map[uint64]uint64{5: 3}, addrs: map[raftio.NodeInfo]string{
		{ShardID: 5, ReplicaID: 1}: "127.0.0.1:7001", {ShardID: 5, ReplicaID: 2}: "127.0.0.2:7002"}})
	batches := make(chan pb.MessageBatch, 4)
	ln := raftListeners(t, 1)[0]
	addr := ln.Addr().String()
	server := raftTransportFactory{log: zerolog.Nop(), tls: raftTLSFor(t, ca, "server"), sources: sources, listener: ln}.Create(
		config.NodeHostConfig{RaftAddress: addr}, func(mb pb.MessageBatch) { batches <- mb }, func(pb.Chunk) bool { return true }).(*raftTransport)
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	client, _ := startTLSTransport(t, raftTLSFor(t, ca, "client"), io.Discard) // its certificate names 127.0.0.1
	send := func(from uint64, source string) error {
		conn, err := client.GetConnection(context.Background(), server.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.SendMessageBatch(pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
			Requests: []pb.Message{{Type: pb.Heartbeat, ShardID: 5, From: from, To: 3, Term: 1}}})
	}
	if err := send(2, "127.0.0.2:7002"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the impersonating connection closed", func() bool {
		server.mu.Lock()
		defer server.mu.Unlock()
		return len(server.conns) == 0
	})
	if err := send(1, "127.0.0.1:7001"); err != nil {
		t.Fatal(err)
	}
	got := receive(t, batches)
	if got.SourceAddress != "" || got.Requests[0].From != 1 {
		t.Fatalf("delivered %+v; want member 1's batch without its address", got)
	}
	select {
	case mb := <-batches:
		t.Fatalf("a batch for another host's member was delivered too: %+v", mb)
	default:
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

// A sender not known as a member is taken for unknown only on a reading of
// the memberships made after its frame arrived: a member added since the
// last reading, given another address than its own, is refused at once
// (the last reading stood for up to 50 ms, and the frame went through
// with its address), and given its own, goes through without it. A flood
// of frames from unknown senders costs one reading per sourcesReadEvery.
func TestRaftSourcesReadTheMembershipsAfterAFrameArrives(t *testing.T) {
	var members atomic.Pointer[map[uint64]string]
	var readings atomic.Int64
	members.Store(&map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002"})
	read := func() []dragonboat.ShardInfo {
		readings.Add(1)
		return []dragonboat.ShardInfo{{ShardID: 5, ReplicaID: 1, Replicas: *members.Load()}}
	}
	sources := &raftSources{}
	sources.shards.Store(&read)
	batch := func(from uint64, source string) *pb.MessageBatch {
		return &pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
			Requests: []pb.Message{{Type: pb.Heartbeat, ShardID: 5, From: from, To: 1, Term: 1}}}
	}
	if keep, err := sources.checkBatch(batch(9, "127.0.0.1:7009")); err != nil || !keep {
		t.Fatalf("unknown sender 9: keep source %v, %v; want it delivered with its address", keep, err)
	}

	members.Store(&map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002", 3: "127.0.0.1:7003"})
	if _, err := sources.checkBatch(batch(3, "127.0.0.1:1")); !errors.Is(err, errForeignSource) {
		t.Fatalf("member 3 added a moment ago, at another address: %v, want refused", err)
	}
	if keep, err := sources.checkBatch(batch(3, "127.0.0.1:7003")); err != nil || keep {
		t.Fatalf("member 3 at its address: keep source %v, %v; want it delivered without", keep, err)
	}

	// A flood of them: readings are sourcesReadEvery apart.
	before, start := readings.Load(), time.Now()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := sources.checkBatch(batch(uint64(20+i), fmt.Sprintf("127.0.0.1:%d", 7020+i))); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if n, most := readings.Load()-before, 1+int64(elapsed/sourcesReadEvery); n > most {
		t.Fatalf("50 frames of unknown senders in %v made %d readings, want at most %d", elapsed, n, most)
	}
}

// Dragonboat files an added member's address a moment before its
// membership shows the member; a frame giving that member another address
// in that instant makes its address registry panic. The transport takes
// that panic back and closes the connection; any other panic stays one.
func TestRaftTransportSurvivesTheRegistryConflict(t *testing.T) {
	sources := &raftSources{}
	sources.view.Store(&sourcesView{groups: map[uint64]uint64{5: 1}, addrs: map[raftio.NodeInfo]string{{ShardID: 5, ReplicaID: 1}: "127.0.0.1:7001"}})
	registry := newZlog(zerolog.Nop(), "registry")
	panics := registryConflict
	tr := &raftTransport{log: zerolog.Nop(), sources: sources, onChunk: func(pb.Chunk) bool { return true },
		onMessages: func(mb pb.MessageBatch) {
			registry.Panicf(panics, "[00005:00004]", "127.0.0.1:7004", mb.SourceAddress)
		}}
	mb := pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: "127.0.0.1:1",
		Requests: []pb.Message{{Type: pb.Heartbeat, ShardID: 5, From: 4, To: 1, Term: 1}}}
	body, err := mb.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	p := peerConn{t: tr}
	if err := p.handle(frameMessages, body); !errors.Is(err, errForeignSource) {
		t.Fatalf("a frame the registry panicked on: %v, want the connection closed as foreign", err)
	}
	if _, pinned := sources.pinned[raftio.NodeInfo{ShardID: 5, ReplicaID: 4}]; pinned {
		t.Fatal("the refused address stays pinned for replica 4")
	}

	panics = "to field not set, %s%s%s"
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("another panic of dragonboat was taken back")
		}
	}()
	_ = p.handle(frameMessages, body)
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

// Senders not known as members are pinned, and filed by dragonboat, up to
// maxUnknownSenders: without a bound, frames naming new replica ids (one
// frame can name millions) grew both by an entry each. Past the bound a new one is refused, while members
// and senders already pinned still get through; a pinned sender that
// becomes a member frees its room at the next reading.
func TestRaftSourcesBoundTheUnknownSenders(t *testing.T) {
	var members atomic.Pointer[map[uint64]string]
	members.Store(&map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002"})
	read := func() []dragonboat.ShardInfo {
		return []dragonboat.ShardInfo{{ShardID: 5, ReplicaID: 1, Replicas: *members.Load()}}
	}
	sources := &raftSources{}
	sources.shards.Store(&read)
	batch := func(source string, from ...uint64) *pb.MessageBatch {
		mb := &pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source}
		for _, f := range from {
			mb.Requests = append(mb.Requests, pb.Message{Type: pb.Heartbeat, ShardID: 5, From: f, To: 1, Term: 1})
		}
		return mb
	}
	var flood []uint64
	for id := range uint64(maxUnknownSenders) {
		flood = append(flood, 100+id)
	}
	if keep, err := sources.checkBatch(batch("127.0.0.1:9", flood...)); err != nil || !keep {
		t.Fatalf("%d unknown senders: keep source %v, %v", len(flood), keep, err)
	}
	if _, err := sources.checkBatch(batch("127.0.0.1:9", 1_000_000)); !errors.Is(err, errForeignSource) {
		t.Fatalf("one unknown sender past the bound: %v, want refused", err)
	}
	if keep, err := sources.checkBatch(batch("127.0.0.1:7002", 2)); err != nil || keep {
		t.Fatalf("member 2 past the bound: keep source %v, %v", keep, err)
	}
	if keep, err := sources.checkBatch(batch("127.0.0.1:9", 100)); err != nil || !keep {
		t.Fatalf("a pinned sender past the bound: keep source %v, %v", keep, err)
	}
	members.Store(&map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002", 100: "127.0.0.1:9"})
	if keep, err := sources.checkBatch(batch("127.0.0.1:10", 1_000_000)); err != nil || !keep {
		t.Fatalf("an unknown sender once a pinned one became a member: keep source %v, %v", keep, err)
	}
}

// fakeMemberships is a raftSources reading the memberships the test
// stores: shard -> member -> Raft address, this node replica 1 in each.
func fakeMemberships(t *testing.T, shards map[uint64]map[uint64]string) (*raftSources, *atomic.Pointer[map[uint64]map[uint64]string]) {
	t.Helper()
	var current atomic.Pointer[map[uint64]map[uint64]string]
	current.Store(&shards)
	read := func() []dragonboat.ShardInfo {
		var infos []dragonboat.ShardInfo
		for shard, members := range *current.Load() {
			infos = append(infos, dragonboat.ShardInfo{ShardID: shard, ReplicaID: 1, Replicas: maps.Clone(members)})
		}
		return infos
	}
	sources := &raftSources{}
	sources.shards.Store(&read)
	return sources, &current
}

// heartbeatFrom is a batch of heartbeats to replica 1 of shard, one from
// each sender, giving source as their address.
func heartbeatFrom(shard uint64, source string, senders ...uint64) *pb.MessageBatch {
	mb := &pb.MessageBatch{DeploymentId: deploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source}
	for _, from := range senders {
		mb.Requests = append(mb.Requests, pb.Message{Type: pb.Heartbeat, ShardID: shard, From: from, To: 1, Term: 1})
	}
	return mb
}

// registryConflictOf makes the registry's conflict as dragonboat's
// Registry.Add does, through a logger of lockd's, and reports whether it
// panicked.
func registryConflictOf(log zerolog.Logger, shard, replica uint64, held, given string) (panicked bool) {
	defer func() {
		r := recover()
		if p, ok := r.(dragonboatPanic); ok && p.format == registryConflict {
			panicked = true
		} else if r != nil {
			panic(r)
		}
	}()
	described := fmt.Sprintf("[%05d:%05d]", shard%describedNodeMod, replica%describedNodeMod) // logutil.DescribeNode
	newZlog(log, "registry").Panicf(registryConflict, described, any(held), given)
	return false
}

// Dragonboat's registry panics when the membership gives a replica id an
// address after a frame from outside the membership gave it another one;
// on its apply path nothing took that panic back and the node exited. The
// conflict on an address lockd let through for that id is repaired
// (logged, counted, the membership's address dialed instead); any other
// stays a panic: on an address lockd did not file, and on one it filed
// for another id or another group's replica. A forged address is counted
// once, however often dragonboat files the member's address again.
func TestRaftRegistryConflictOnAnUnknownSendersAddressIsRepaired(t *testing.T) {
	const shard = 1001
	sources, _ := fakeMemberships(t, map[uint64]map[uint64]string{shard: {1: "127.0.0.1:7001", 2: "127.0.0.1:7002"}})
	if keep, err := sources.checkBatch(heartbeatFrom(shard, "127.0.0.1:61004", 4)); err != nil || !keep {
		t.Fatalf("unknown sender 4: keep source %v, %v; want it delivered with its address", keep, err)
	}
	var logged strings.Builder
	log := zerolog.New(&logged)
	before := forgedAddresses.Load()
	if registryConflictOf(log, shard, 4, "127.0.0.1:61004", "127.0.0.1:7004") {
		t.Fatal("the membership's address for replica 4 after a frame gave it another: panicked, want repaired")
	}
	// Dragonboat files the member's address again as it restores a snapshot.
	if registryConflictOf(zerolog.Nop(), shard, 4, "127.0.0.1:61004", "127.0.0.1:7004") {
		t.Fatal("the same conflict again: panicked, want repaired")
	}
	if got := forgedAddresses.Load() - before; got != 1 {
		t.Fatalf("forged addresses counted: %d, want 1", got)
	}
	for _, want := range []string{`"replica":4`, `"group":1001`, "127.0.0.1:61004", "127.0.0.1:7004", "outside the membership", `"level":"error"`} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("repair log %q lacks %s", logged.String(), want)
		}
	}
	if to, ok := unknownFiled.redirect("127.0.0.1:61004"); !ok || to != "127.0.0.1:7004" {
		t.Fatalf("redirect of the first address: %q %v, want the membership's", to, ok)
	}

	for _, c := range []struct {
		what           string
		shard, replica uint64
		held, given    string
	}{
		{"member 2's address, which lockd never filed", shard, 2, "127.0.0.1:7002", "127.0.0.1:1"},
		{"the address filed for 4, held for replica 5", shard, 5, "127.0.0.1:61004", "127.0.0.1:7005"},
		{"the address filed for 4, held for replica 4 of another group", shard + 1, 4, "127.0.0.1:61004", "127.0.0.1:7004"},
	} {
		if !registryConflictOf(zerolog.Nop(), c.shard, c.replica, c.held, c.given) {
			t.Errorf("%s: repaired, want the panic", c.what)
		}
	}
	if got := forgedAddresses.Load() - before; got != 1 {
		t.Fatalf("repairs counted: %d, want still 1", got)
	}
}

// A sender outside the membership that the membership then adds at the
// address its frames gave is a member like any other: lockd forgets that
// it filed the address, and a conflict on it stays a panic.
func TestRaftSourcesForgetAFilingTheMembershipConfirms(t *testing.T) {
	const shard = 1003
	sources, members := fakeMemberships(t, map[uint64]map[uint64]string{shard: {1: "127.0.0.1:7001"}})
	if keep, err := sources.checkBatch(heartbeatFrom(shard, "127.0.0.1:61009", 9)); err != nil || !keep {
		t.Fatalf("unknown sender 9: keep source %v, %v", keep, err)
	}
	members.Store(&map[uint64]map[uint64]string{shard: {1: "127.0.0.1:7001", 9: "127.0.0.1:61009"}})
	if keep, err := sources.checkBatch(heartbeatFrom(shard, "127.0.0.1:61009", 9)); err != nil || keep {
		t.Fatalf("member 9 at its address: keep source %v, %v; want it delivered without", keep, err)
	}
	if !registryConflictOf(zerolog.Nop(), shard, 9, "127.0.0.1:61009", "127.0.0.1:1") {
		t.Fatal("a conflict on member 9's own address was repaired, want the panic")
	}
}

// The transport dials the membership's address in place of a first
// address it superseded; never in place of an address that is a member's
// (its traffic would go elsewhere), nor to one no member has, nor when two
// members superseded the same first address.
func TestRaftTransportDialsTheMembershipsAddressInPlaceOfAForgedOne(t *testing.T) {
	const shard = 1005
	ls := raftListeners(t, 6)
	for _, l := range ls {
		t.Cleanup(func() { l.Close() })
	}
	addr := func(i int) string { return ls[i].Addr().String() }
	forged, member4, shared, member6, member8, takenLater := addr(0), addr(1), addr(2), addr(3), addr(4), addr(5)
	sources, members := fakeMemberships(t, map[uint64]map[uint64]string{shard: {1: "127.0.0.1:7001"}})
	for _, mb := range []*pb.MessageBatch{
		heartbeatFrom(shard, forged, 4),
		heartbeatFrom(shard, shared, 6, 8),
		heartbeatFrom(shard, takenLater, 10),
	} {
		if keep, err := sources.checkBatch(mb); err != nil || !keep {
			t.Fatalf("unknown senders at %s: keep source %v, %v", mb.SourceAddress, keep, err)
		}
	}
	tr := &raftTransport{log: zerolog.Nop(), sources: sources}
	dialed := func(target string) string {
		t.Helper()
		conn, err := tr.GetConnection(context.Background(), target)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.(*frameConn).conn.RemoteAddr().String()
	}

	if got := dialed(forged); got != forged {
		t.Fatalf("before any conflict: dialed %s, want %s itself", got, forged)
	}
	// The groups add 4, 6, 8 and 10: the registry conflicts as each is
	// filed; 10's first address becomes member 3's.
	for _, c := range []struct {
		replica     uint64
		held, given string
	}{{4, forged, member4}, {6, shared, member6}, {8, shared, member8}, {10, takenLater, member4}} {
		if registryConflictOf(zerolog.Nop(), shard, c.replica, c.held, c.given) {
			t.Fatalf("replica %d: the conflict on its first address panicked", c.replica)
		}
	}
	if got := dialed(forged); got != forged {
		t.Fatalf("before the membership shows member 4: dialed %s, want %s (no member's address yet)", got, forged)
	}
	members.Store(&map[uint64]map[uint64]string{shard: {1: "127.0.0.1:7001", 3: takenLater, 4: member4, 6: member6, 8: member8, 10: member4}})
	for _, c := range []struct{ what, target, want string }{
		{"replica 4's forged first address", forged, member4},
		{"the first address two members superseded", shared, shared},
		{"a first address that is now member 3's", takenLater, takenLater},
	} {
		if got := dialed(c.target); got != c.want {
			t.Errorf("%s: dialed %s, want %s", c.what, got, c.want)
		}
	}
}

// An unknown sender may not give a member's address: lockd's replica id
// is its node id in every group, so such a frame is forged, and
// dragonboat would send that id's messages to the member. It is refused
// whichever group the member is in; a member at its own address, and an
// unknown sender at an address no member has, still get through.
func TestRaftSourcesRefuseAnUnknownSenderAtAMembersAddress(t *testing.T) {
	sources, _ := fakeMemberships(t, map[uint64]map[uint64]string{
		1007: {1: "127.0.0.1:7001", 2: "127.0.0.1:7002"},
		1008: {1: "127.0.0.1:7001", 3: "127.0.0.1:7003"},
	})
	for _, c := range []struct {
		what   string
		mb     *pb.MessageBatch
		refuse bool
		keep   bool
	}{
		{"sender 4 at member 2's address", heartbeatFrom(1007, "127.0.0.1:7002", 4), true, false},
		{"sender 4 at member 3's address, of another group", heartbeatFrom(1007, "127.0.0.1:7003", 4), true, false},
		{"member 2 with sender 4 at its address", heartbeatFrom(1007, "127.0.0.1:7002", 2, 4), true, false},
		{"member 2 at its address", heartbeatFrom(1007, "127.0.0.1:7002", 2), false, false},
		{"sender 3, a member elsewhere, at its address", heartbeatFrom(1007, "127.0.0.1:7003", 3), false, true},
		{"sender 4 at an address of no member", heartbeatFrom(1007, "127.0.0.1:7004", 4), false, true},
	} {
		keep, err := sources.checkBatch(c.mb)
		if refused := errors.Is(err, errForeignSource); refused != c.refuse || (!refused && (err != nil || keep != c.keep)) {
			t.Errorf("%s: keep source %v, %v; want refused %v, keep source %v", c.what, keep, err, c.refuse, c.keep)
		}
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
			if kind, body, err := readFrame(conn, nil); err == nil && kind == frameLockd && len(body) > 0 && body[0] == peerFormat {
				_ = writeFrame(conn, frameLockd, appendStatement(nil, id, logFormatNewest), time.Second)
			}
			conn.Close()
		}
	}()
	return func() { ln.Close(); <-done }
}
