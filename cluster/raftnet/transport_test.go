package raftnet

import (
	"context"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/config"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/lockd/lockd/internal/loopback"
)

// startTransport listens on a free loopback port and forwards what it
// receives to the returned channels.
func startTransport(t *testing.T, acceptChunks bool) (*raftTransport, chan pb.MessageBatch, chan pb.Chunk) {
	t.Helper()
	ln := loopback.Listeners(t, 1)[0]
	return startTransportAt(t, Factory{Listener: ln}, ln.Addr().String(), acceptChunks)
}

// startTransportAt is startTransport on addr, through f (listening on
// addr itself unless f has a listener).
func startTransportAt(t *testing.T, f Factory, addr string, acceptChunks bool) (*raftTransport, chan pb.MessageBatch, chan pb.Chunk) {
	t.Helper()
	batches, chunks := make(chan pb.MessageBatch, 16), make(chan pb.Chunk, 16)
	tr := f.Create(config.NodeHostConfig{RaftAddress: addr},
		func(mb pb.MessageBatch) { batches <- mb },
		func(c pb.Chunk) bool { chunks <- c; return acceptChunks }).(*raftTransport)
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, batches, chunks
}

func receive[T any](t *testing.T, ch chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("nothing received in 5 s")
	}
	var zero T
	return zero
}

// Message batches and snapshot chunks arrive as sent, frame after frame
// on one connection.
func TestRaftTransportDeliversBatchesAndChunks(t *testing.T) {
	server, batches, chunks := startTransport(t, true)
	client, _, _ := startTransport(t, true)
	conn, err := client.GetConnection(context.Background(), server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range 3 {
		want := pb.MessageBatch{
			DeploymentId: DeploymentID, SourceAddress: client.addr, BinVer: 7,
			Requests: []pb.Message{{
				Type: pb.Replicate, To: 2, From: 1, ShardID: 5, Term: 3, LogIndex: uint64(10 + i), Commit: 9,
				Entries: []pb.Entry{{Term: 3, Index: uint64(11 + i), Cmd: []byte("acquire k")}},
			}, {Type: pb.Heartbeat, To: 3, From: 1, ShardID: 5, Term: 3}},
		}
		if err := conn.SendMessageBatch(want); err != nil {
			t.Fatal(err)
		}
		if got := receive(t, batches); !reflect.DeepEqual(got, want) {
			t.Fatalf("batch %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
	snap, err := client.GetSnapshotConnection(context.Background(), server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	want := pb.Chunk{ShardID: 5, ReplicaID: 2, From: 1, ChunkId: 0, ChunkCount: 1, Index: 100, Term: 3,
		Data: make([]byte, 3<<20), DeploymentId: DeploymentID, BinVer: 7, FileSize: 3 << 20}
	want.Data[12345] = 0xab
	if err := snap.SendChunk(want); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, chunks); !reflect.DeepEqual(got, want) {
		t.Fatalf("chunk differs: got %d bytes, want %d", len(got.Data), len(want.Data))
	}
}

// A peer that sends anything but frames, or a frame that fails its
// checksum, is disconnected unheard, and so is a snapshot stream whose
// chunk dragonboat refused.
// A message stream outlives its peer's restart: the write that finds the
// old connection dropped is made again on a new one, and the sender sees
// no error (an error would trip dragonboat's breaker for the peer).
func TestRaftTransportStreamSurvivesAPeerRestart(t *testing.T) {
	server, batches, _ := startTransport(t, true)
	client, _, _ := startTransport(t, true)
	conn, err := client.GetConnection(context.Background(), server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	batch := func(i int) pb.MessageBatch {
		return pb.MessageBatch{DeploymentId: DeploymentID, SourceAddress: client.addr, BinVer: 7,
			Requests: []pb.Message{{Type: pb.Heartbeat, To: 2, From: 1, ShardID: 5, Term: uint64(i)}}}
	}
	if err := conn.SendMessageBatch(batch(0)); err != nil {
		t.Fatal(err)
	}
	receive(t, batches)
	server.Close()
	_, restarted, _ := startTransportAt(t, Factory{}, server.addr, true)
	// The first writes after the restart may still vanish into the old
	// connection before its reset arrives; what matters is that none fails
	// and that the stream reaches the new process.
	for i := 1; ; i++ {
		if err := conn.SendMessageBatch(batch(i)); err != nil {
			t.Fatalf("send %d after the peer restarted: %v", i, err)
		}
		select {
		case got := <-restarted:
			if got.Requests[0].Term == 0 || got.Requests[0].Term > uint64(i) {
				t.Fatalf("the restarted peer got %+v", got)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if i == 100 {
			t.Fatal("100 sends after the restart, none reached the restarted peer")
		}
	}
}

func TestRaftTransportDropsBadPeers(t *testing.T) {
	server, batches, chunks := startTransport(t, false)
	raw, err := net.Dial("tcp", server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := raw.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("garbage peer: read %v, want EOF (closed)", err)
	}

	// A batch damaged on the way fails its checksum.
	raw2, err := net.Dial("tcp", server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw2.Close()
	damaged := &frameConn{conn: flipLastBit{raw2}}
	if err := damaged.SendMessageBatch(pb.MessageBatch{DeploymentId: DeploymentID, Requests: []pb.Message{{Type: pb.Heartbeat, To: 2}}}); err != nil {
		t.Fatal(err)
	}
	raw2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := raw2.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("damaged frame: read %v, want EOF (closed)", err)
	}

	client, _, _ := startTransport(t, false)
	snap, err := client.GetSnapshotConnection(context.Background(), server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	chunk := pb.Chunk{ShardID: 5, ChunkCount: 2, Data: []byte("x"), DeploymentId: DeploymentID}
	if err := snap.SendChunk(chunk); err != nil {
		t.Fatal(err)
	}
	receive(t, chunks)
	deadline := time.Now().Add(5 * time.Second)
	for snap.SendChunk(chunk) == nil {
		if time.Now().After(deadline) {
			t.Fatal("refused snapshot stream still open after 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case mb := <-batches:
		t.Fatalf("a bad peer's bytes were delivered: %+v", mb)
	default:
	}
}

// flipLastBit damages every write's last byte, as a faulty link would.
type flipLastBit struct{ net.Conn }

func (c flipLastBit) Write(b []byte) (int, error) {
	d := append([]byte(nil), b...)
	d[len(d)-1] ^= 1
	return c.Conn.Write(d)
}

// Only batches that no peer needs in order to commit may give way to the
// apply: commit notices (replicate messages without entries) and
// heartbeats. Entries and acknowledgements go out at once.
func TestOnlyNoticesGiveWay(t *testing.T) {
	notice := pb.Message{Type: pb.Replicate, Commit: 7}
	entries := pb.Message{Type: pb.Replicate, Entries: []pb.Entry{{Index: 8}}}
	for _, c := range []struct {
		name string
		msgs []pb.Message
		want bool
	}{
		{"commit notice", []pb.Message{notice}, true},
		{"heartbeats", []pb.Message{{Type: pb.Heartbeat}, {Type: pb.Heartbeat}}, true},
		{"notice and heartbeat", []pb.Message{notice, {Type: pb.Heartbeat}}, true},
		{"entries", []pb.Message{entries}, false},
		{"notice and entries", []pb.Message{notice, entries}, false},
		{"acknowledgement", []pb.Message{{Type: pb.ReplicateResp}}, false},
		{"heartbeat answer", []pb.Message{{Type: pb.HeartbeatResp}}, false},
		{"vote", []pb.Message{{Type: pb.RequestVote}}, false},
	} {
		if got := onlyNotices(pb.MessageBatch{Requests: c.msgs}); got != c.want {
			t.Errorf("%s: onlyNotices = %v, want %v", c.name, got, c.want)
		}
	}
}
