package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/logwatch"
	"github.com/lockd/lockd/internal/loopback"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/rs/zerolog"
)

const refusedLog = "raft transport: TLS handshake refused"

// A 3-node cluster with raft TLS elects every group's leader and serves
// locks across nodes.
func TestRaftTLSClusterElectsAndServes(t *testing.T) {
	ca := testcerts.NewCA(t, "lockd raft CA")
	tc := newTestCluster(t, 3, func(cfg *Config) {
		cfg.RaftTLS = ca.Loaded(t, fmt.Sprintf("node%d", cfg.NodeID), raftnet.LoadTLS)
	})
	rec := newRecorder()
	r := acquire(t, tc.node(1), rec, 1, "tls/k", 30*time.Second, 0)
	if r.Outcome != engine.Granted {
		t.Fatalf("acquire: %+v", r)
	}
	if got := release(t, tc.node(3), rec, 2, "tls/k", r.Token); got.Outcome != engine.Released {
		t.Fatalf("release on another node: %+v", got)
	}
	// The Raft port speaks TLS, with a certificate the CA signed.
	conn, err := tls.Dial("tcp", tc.cfgs[1].Peers[2], &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(t, "probe")}})
	if err != nil {
		t.Fatalf("TLS to node 2's Raft port: %v", err)
	}
	conn.Close()
}

// A node whose certificate another CA signed cannot join: the two nodes
// of the right CA refuse its connections (and it theirs), elect leaders
// between themselves and serve.
func TestRaftTLSRefusesANodeOfAnotherCA(t *testing.T) {
	ca, other := testcerts.NewCA(t, "lockd raft CA"), testcerts.NewCA(t, "another CA")
	listeners := loopback.Listeners(t, 3)
	peers := make(map[uint64]string)
	for i, l := range listeners {
		peers[uint64(i+1)] = l.Addr().String()
	}
	watches := []*logwatch.Watch{logwatch.For(refusedLog), logwatch.For(refusedLog)}
	refused := make(chan struct{})
	go func() {
		select {
		case <-watches[0].Seen():
		case <-watches[1].Seen():
		}
		close(refused)
	}()
	nodes := make([]*Node, 3)
	t.Cleanup(func() {
		for _, n := range nodes {
			if n != nil {
				n.Close()
			}
		}
	})
	for i := range 3 {
		cfg := Config{NodeID: uint64(i + 1), Peers: peers, RaftListener: listeners[i], DataDir: t.TempDir(), Groups: 2,
			RTT: 10 * time.Millisecond, ElectionRTT: 20, ProposeTimeout: 3 * time.Second}
		if i < 2 {
			cfg.RaftTLS = ca.Loaded(t, fmt.Sprintf("node%d", i+1), raftnet.LoadTLS)
			cfg.Logger = zerolog.New(watches[i])
		} else {
			cfg.RaftTLS = other.Loaded(t, "intruder", raftnet.LoadTLS)
			cfg.Logger = zerolog.New(io.Discard)
		}
		n, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range nodes[:2] {
		if err := n.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-refused:
	case <-time.After(20 * time.Second):
		t.Fatal("neither node of the CA logged a refused handshake in 20 s")
	}
	rec := newRecorder()
	if r := acquire(t, nodes[0], rec, 1, "tls/k", 30*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("acquire on the two nodes of the CA: %+v", r)
	}
	for i := range nodes[0].groups {
		if leader := nodes[0].Leader(i); leader == 3 {
			t.Fatalf("group %d: the node of another CA leads", i)
		}
	}
}
