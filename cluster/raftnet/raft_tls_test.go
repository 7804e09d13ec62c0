package raftnet

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/config"
	pb "github.com/lni/dragonboat/v4/raftpb"
	"github.com/lockd/lockd/internal/logwatch"
	"github.com/lockd/lockd/internal/loopback"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/rs/zerolog"
)

func startTLSTransport(t *testing.T, tlsCfg *tls.Config, log io.Writer) (*raftTransport, chan pb.MessageBatch) {
	t.Helper()
	batches := make(chan pb.MessageBatch, 16)
	ln := loopback.Listeners(t, 1)[0]
	tr := Factory{Log: zerolog.New(log), TLS: tlsCfg, Listener: ln}.Create(config.NodeHostConfig{RaftAddress: ln.Addr().String()},
		func(mb pb.MessageBatch) { batches <- mb },
		func(pb.Chunk) bool { return true }).(*raftTransport)
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, batches
}

// With raft TLS, nodes of one CA exchange frames; a node of another CA,
// and a peer without TLS, are refused at the handshake and deliver
// nothing.
func TestRaftTransportMutualTLS(t *testing.T) {
	ca, other := testcerts.NewCA(t, "lockd raft CA"), testcerts.NewCA(t, "another CA")
	watch := logwatch.For(refusedLog)
	server, batches := startTLSTransport(t, ca.Loaded(t, "server", LoadTLS), watch)
	client, _ := startTLSTransport(t, ca.Loaded(t, "client", LoadTLS), io.Discard)
	conn, err := client.GetConnection(context.Background(), server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := pb.MessageBatch{DeploymentId: DeploymentID, SourceAddress: client.addr, BinVer: 7,
		Requests: []pb.Message{{Type: pb.Heartbeat, To: 2, From: 1, ShardID: 5, Term: 3}}}
	if err := conn.SendMessageBatch(want); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, batches); got.SourceAddress != want.SourceAddress || len(got.Requests) != 1 {
		t.Fatalf("got %+v", got)
	}

	intruder, _ := startTLSTransport(t, other.Loaded(t, "intruder", LoadTLS), io.Discard)
	if c, err := intruder.GetConnection(context.Background(), server.addr); err == nil {
		c.Close()
		t.Fatal("a node of another CA connected")
	}
	watch.Wait(t, "the other CA's node was refused")

	// A peer without TLS: its frame is not a handshake, so the server
	// closes the connection without delivering it.
	plain, err := net.Dial("tcp", server.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	fc := &frameConn{conn: plain}
	if err := fc.SendMessageBatch(want); err != nil {
		t.Fatal(err)
	}
	_ = plain.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, plain); err != nil {
		t.Fatalf("a peer without TLS: %v, want the connection closed", err)
	}
	select {
	case mb := <-batches:
		t.Fatalf("a frame without TLS was delivered: %+v", mb)
	default:
	}
}

// LoadTLS refuses a key others can read, as every key file.
func TestLoadTLSRefusesReadableKey(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd raft CA")
	f := ca.WriteFiles(t, t.TempDir(), "node1", "127.0.0.1")
	if err := os.Chmod(f.Key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTLS(f.Cert, f.Key, f.CA); err == nil || !bytes.Contains([]byte(err.Error()), []byte("chmod 600")) {
		t.Fatalf("a key others can read: %v", err)
	}
	if _, err := LoadTLS(f.Cert, f.Cert, f.Key); err == nil {
		t.Fatal("a certificate as the key was accepted")
	}
}
