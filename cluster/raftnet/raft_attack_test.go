package raftnet

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/lockd/lockd/internal/loopback"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/rs/zerolog"
)

// A frame's header alone cannot make the transport allocate past its
// frame budget: 30 connections declaring the largest frame and sending a
// few bytes of it took a node from 28 MB to 2.16 GB when each buffer was
// allocated at once. Now one such frame is granted the guests' share, its
// body mapped outside the heap, and the others wait, allocating nothing;
// the granted one, silent after its first bytes, loses its grant with its
// connection after WriteTimeout, and the next is granted. And the
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
		hdr[2] = FrameMessages
		binary.BigEndian.PutUint32(hdr[3:], MaxFrame)
		if _, err := c.Write(hdr); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, "one frame granted, the others waiting", func() bool {
		held, waiting := server.budget.inUse()
		return held == MaxFrame && waiting == conns-1
	})
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > conns*4*frameReadStep+(8<<20) {
		t.Fatalf("%d connections that declared %d MiB frames and sent 100 bytes made the node allocate %d MiB", conns, MaxFrame>>20, grown>>20)
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
	waitUntil(t, WriteTimeout+5*time.Second, "the silent granted frame dropped and the next granted", func() bool {
		held, waiting := server.budget.inUse()
		return held == MaxFrame && waiting == conns-2
	})
	if waited := time.Since(start); waited < WriteTimeout-time.Second {
		t.Fatalf("the next frame was granted after %v, before the silent one's %v deadline", waited, WriteTimeout)
	}
}

// A connection that sends no frame is closed after DialTimeout, so
// idle connections cannot hold the connection cap.
func TestRaftTransportClosesASilentConnection(t *testing.T) {
	server, _, _ := startTransport(t, false)
	c, err := net.Dial("tcp", server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(DialTimeout + 10*time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("silent connection: read %v after %v, want EOF (closed by the node)", err, time.Since(start))
	}
}

// Over mutual TLS a node speaks only for the members at a host its
// certificate names: a frame giving another member's address is dropped
// with its connection, one giving its own is delivered, without its
// address (dragonboat files addresses from the membership only).
func TestRaftTLSPeerSpeaksOnlyForItsHost(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd raft CA")
	sources := &Sources{}
	sources.view.Store(&sourcesView{groups: map[uint64]uint64{5: 3}, addrs: map[raftio.NodeInfo]string{
		{ShardID: 5, ReplicaID: 1}: "127.0.0.1:7001", {ShardID: 5, ReplicaID: 2}: "127.0.0.2:7002"}})
	batches := make(chan pb.MessageBatch, 4)
	ln := loopback.Listeners(t, 1)[0]
	addr := ln.Addr().String()
	server := Factory{Log: zerolog.Nop(), TLS: ca.Loaded(t, "server", LoadTLS), Sources: sources, Listener: ln}.Create(
		config.NodeHostConfig{RaftAddress: addr}, func(mb pb.MessageBatch) { batches <- mb }, func(pb.Chunk) bool { return true }).(*raftTransport)
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	client, _ := startTLSTransport(t, ca.Loaded(t, "client", LoadTLS), io.Discard) // its certificate names 127.0.0.1
	send := func(from uint64, source string) error {
		conn, err := client.GetConnection(context.Background(), server.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.SendMessageBatch(pb.MessageBatch{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
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
	sources := &Sources{}
	sources.shards.Store(&read)
	batch := func(from uint64, source string) *pb.MessageBatch {
		return &pb.MessageBatch{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source,
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
	sources := &Sources{}
	sources.view.Store(&sourcesView{groups: map[uint64]uint64{5: 1}, addrs: map[raftio.NodeInfo]string{{ShardID: 5, ReplicaID: 1}: "127.0.0.1:7001"}})
	panics := registryConflict
	tr := &raftTransport{log: zerolog.Nop(), sources: sources, onChunk: func(pb.Chunk) bool { return true },
		onMessages: func(mb pb.MessageBatch) {
			Panicf(zerolog.Nop(), panics, "[00005:00004]", "127.0.0.1:7004", mb.SourceAddress)
		}}
	mb := pb.MessageBatch{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: "127.0.0.1:1",
		Requests: []pb.Message{{Type: pb.Heartbeat, ShardID: 5, From: 4, To: 1, Term: 1}}}
	body, err := mb.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	p := peerConn{t: tr}
	if err := p.handle(FrameMessages, body); !errors.Is(err, errForeignSource) {
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
	_ = p.handle(FrameMessages, body)
}

// Senders not known as members are pinned, and filed by dragonboat, up to
// maxUnknownSenders: without a bound, frames naming new replica ids (one
// frame can name millions) would grow both by an entry each. Past the
// bound a new one is refused, while members and senders already pinned
// still get through; a pinned sender that becomes a member frees its room
// at the next reading.
func TestRaftSourcesBoundTheUnknownSenders(t *testing.T) {
	var members atomic.Pointer[map[uint64]string]
	members.Store(&map[uint64]string{1: "127.0.0.1:7001", 2: "127.0.0.1:7002"})
	read := func() []dragonboat.ShardInfo {
		return []dragonboat.ShardInfo{{ShardID: 5, ReplicaID: 1, Replicas: *members.Load()}}
	}
	sources := &Sources{}
	sources.shards.Store(&read)
	batch := func(source string, from ...uint64) *pb.MessageBatch {
		mb := &pb.MessageBatch{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source}
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
	ls := loopback.Listeners(t, 6)
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

// fakeMemberships is a Sources reading the memberships the test
// stores: shard -> member -> Raft address, this node replica 1 in each.
func fakeMemberships(t *testing.T, shards map[uint64]map[uint64]string) (*Sources, *atomic.Pointer[map[uint64]map[uint64]string]) {
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
	sources := &Sources{}
	sources.shards.Store(&read)
	return sources, &current
}

// heartbeatFrom is a batch of heartbeats to replica 1 of shard, one from
// each sender, giving source as their address.
func heartbeatFrom(shard uint64, source string, senders ...uint64) *pb.MessageBatch {
	mb := &pb.MessageBatch{DeploymentId: DeploymentID, BinVer: raftio.TransportBinVersion, SourceAddress: source}
	for _, from := range senders {
		mb.Requests = append(mb.Requests, pb.Message{Type: pb.Heartbeat, ShardID: shard, From: from, To: 1, Term: 1})
	}
	return mb
}

// registryConflictOf makes the registry's conflict as dragonboat's
// Registry.Add does, through Panicf, and reports whether it
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
	Panicf(log, registryConflict, described, any(held), given)
	return false
}
