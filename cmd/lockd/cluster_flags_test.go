package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/cluster"
	"github.com/rs/zerolog"
)

func TestClusterFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	o, err := parseServeOptions([]string{"--cluster", "--node-id", "2", "--raft-addr", "127.0.0.1:7452",
		"--peers", "1=127.0.0.1:7451,2=127.0.0.1:7452,3=127.0.0.1:7453", "--data-dir", "/tmp/x", "--groups", "8",
		"--rtt-ms", "5", "--propose-timeout", "3s"}, none)
	if err != nil {
		t.Fatal(err)
	}
	c := o.clusterCfg
	if !o.cluster || c.NodeID != 2 || c.RaftAddr != "127.0.0.1:7452" || len(c.Peers) != 3 || c.Peers[3] != "127.0.0.1:7453" ||
		c.DataDir != "/tmp/x" || c.Groups != 8 || c.RTT != 5*time.Millisecond || c.ProposeTimeout != 3*time.Second {
		t.Fatalf("cluster flags: %+v", o)
	}
	if o.clusterCfg.Join {
		t.Fatal("--join set without the flag")
	}
	o, err = parseServeOptions([]string{"--cluster", "--node-id", "4", "--peers", "4=127.0.0.1:7454", "--data-dir", "d", "--join"}, none)
	if err != nil || !o.clusterCfg.Join || o.clusterCfg.Peers[4] != "127.0.0.1:7454" {
		t.Fatalf("--join with only its own peer entry: %+v %v", o.clusterCfg, err)
	}
	if _, err := parseServeOptions([]string{"--join"}, none); err == nil || !strings.Contains(err.Error(), "--cluster") {
		t.Fatalf("--join in single mode: %v", err)
	}
	if _, err := parseServeOptions([]string{"--cluster", "--node-id", "1"}, none); err == nil ||
		!strings.Contains(err.Error(), "--peers") {
		t.Fatalf("missing cluster flags: %v", err)
	}
	if _, err := parseServeOptions([]string{"--cluster", "--node-id", "1", "--peers", "1=a:1,x", "--data-dir", "d"}, none); err == nil {
		t.Fatal("a malformed --peers was accepted")
	}
	env := map[string]string{"LOCKD_CLUSTER": "true", "LOCKD_NODE_ID": "3", "LOCKD_PEERS": "3=127.0.0.1:1", "LOCKD_DATA_DIR": "d"}
	o, err = parseServeOptions(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil || !o.cluster || o.clusterCfg.NodeID != 3 {
		t.Fatalf("cluster flags from the environment: %+v %v", o, err)
	}
}

// --raft-frame-budget-mib reaches the node's config in bytes; the node
// refuses one too small for a frame of the largest size and the members'
// part.
func TestRaftFrameBudgetFlag(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	args := []string{"--cluster", "--node-id", "1", "--peers", "1=127.0.0.1:7451", "--data-dir", t.TempDir()}
	o, err := parseServeOptions(args, none)
	if err != nil || o.clusterCfg.RaftFrameBudget != 128<<20 {
		t.Fatalf("default frame budget: %d bytes, %v; want 128 MiB", o.clusterCfg.RaftFrameBudget, err)
	}
	o, err = parseServeOptions(append(args, "--raft-frame-budget-mib", "64"), none)
	if err != nil || o.clusterCfg.RaftFrameBudget != 64<<20 {
		t.Fatalf("--raft-frame-budget-mib 64: %d bytes, %v", o.clusterCfg.RaftFrameBudget, err)
	}
	o.clusterCfg.Logger = zerolog.Nop()
	if n, err := cluster.Start(o.clusterCfg); err == nil || !strings.Contains(err.Error(), "--raft-frame-budget-mib 64: want >= 80") {
		if n != nil {
			n.Close()
		}
		t.Fatalf("a node with a 64 MiB frame budget: %v, want it refused", err)
	}
}

func TestRaftTLSFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	cluster := []string{"--cluster", "--node-id", "1", "--peers", "1=127.0.0.1:7451,2=127.0.0.1:7452,3=127.0.0.1:7453", "--data-dir", "d"}
	o, err := parseServeOptions(append(cluster, "--raft-tls-cert", "n.crt", "--raft-tls-key", "n.key", "--raft-tls-ca", "ca.crt"), none)
	if err != nil || o.raftTLS != [3]string{"n.crt", "n.key", "ca.crt"} {
		t.Fatalf("raft TLS flags: %v %v", o.raftTLS, err)
	}
	for _, args := range [][]string{
		append(cluster, "--raft-tls-cert", "n.crt", "--raft-tls-key", "n.key"),
		append(cluster, "--raft-tls-ca", "ca.crt"),
	} {
		if _, err := parseServeOptions(args, none); err == nil || !strings.Contains(err.Error(), "all three or none") {
			t.Errorf("%q: %v", args, err)
		}
	}
	if _, err := parseServeOptions([]string{"--raft-tls-cert", "n.crt", "--raft-tls-key", "n.key", "--raft-tls-ca", "ca.crt"}, none); err == nil ||
		!strings.Contains(err.Error(), "--cluster") {
		t.Errorf("raft TLS in single mode: %v", err)
	}
}

// --raft-listen binds the Raft port apart from the address its peers
// reach (a relay's): plain TCP only on loopback, as for --raft-addr, and
// only in cluster mode.
func TestRaftListenFlag(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	node := []string{"--cluster", "--node-id", "1", "--peers", "1=127.0.0.1:7451,2=127.0.0.1:7452,3=127.0.0.1:7453", "--data-dir", "d"}
	o, err := parseServeOptions(append(node, "--raft-listen", "127.0.0.1:8451"), none)
	if err != nil || o.raftListen != "127.0.0.1:8451" || o.clusterCfg.Peers[1] != "127.0.0.1:7451" {
		t.Fatalf("--raft-listen on loopback: %q, peers %v, %v", o.raftListen, o.clusterCfg.Peers, err)
	}
	if _, err := parseServeOptions(append(node, "--raft-listen", "0.0.0.0:8451"), none); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("plain TCP --raft-listen on every interface: %v", err)
	}
	if _, err := parseServeOptions(append(node, "--raft-listen", "0.0.0.0:8451", "--insecure-raft"), none); err != nil {
		t.Fatalf("--raft-listen on every interface with --insecure-raft: %v", err)
	}
	if _, err := parseServeOptions([]string{"--raft-listen", "127.0.0.1:8451"}, none); err == nil || !strings.Contains(err.Error(), "--cluster") {
		t.Fatalf("--raft-listen in single mode: %v", err)
	}
}
