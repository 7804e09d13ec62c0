package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/cluster"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/adminjson"
	"github.com/lockd/lockd/server"
)

// acquireOverRawConn takes key for a minute through a connection of its
// own, as any client would, and returns the token and the connection's
// local address: the address the server sees it from.
func acquireOverRawConn(t *testing.T, addr, key string) (token uint64, local string) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(15 * time.Second))
	rr := codec.NewResponseReader(nc, 4096)
	var r codec.Response
	if err := rr.Next(&r); err != nil || r.Op != codec.OpGreeting {
		t.Fatalf("greeting: %q %v", r.Op, err)
	}
	if _, err := nc.Write(codec.AppendAcquire(nil, 1, 60, 0, key)); err != nil {
		t.Fatal(err)
	}
	if err := rr.Next(&r); err != nil || r.Op != codec.OpAcquired {
		t.Fatalf("acquire %s: %q %v", key, r.Op, err)
	}
	return r.Token, nc.LocalAddr().String()
}

// statusRow runs lockctl status through the binary and returns its row's
// fields before REMOTE, and REMOTE, which may hold spaces.
func statusRow(t *testing.T, bin binary, admin, key string) (fields []string, remote string) {
	t.Helper()
	code, out, errs := bin.run(t, "status", "--admin", admin, key)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 2 {
		t.Fatalf("status %s: %d %q %q", key, code, out, errs)
	}
	at := strings.Index(lines[0], "REMOTE")
	return strings.Fields(lines[1][:at]), strings.TrimSpace(lines[1][at:])
}

// lockctl status names where a grant went: in single mode the address of
// the client's connection; in a three-node cluster, on the node that
// delivered the grant, that address and the node's id, and on another
// node the id of the node that knows the address.
func TestStatusShowsWhereTheGrantWent(t *testing.T) {
	bin := buildBinary(t)

	t.Run("single mode", func(t *testing.T) {
		addr, admin := startInspectable(t, nil)
		token, local := acquireOverRawConn(t, addr, "jobs/nightly")
		f, remote := statusRow(t, bin, admin, "jobs/nightly")
		if f[2] != strconv.FormatUint(token, 10) || f[7] != "inspected" || f[8] != "-" || remote != local {
			t.Errorf("status row %q %q, want token %d, node inspected, no grant node, remote %s", f, remote, token, local)
		}
		code, out, _ := bin.run(t, "status", "--admin", admin, "--json", "jobs/nightly")
		var one adminjson.LockStatus
		if err := json.Unmarshal([]byte(out), &one); code != exitOK || err != nil || one.RemoteAddr != local || one.GrantNode != 0 || one.NodeID != 0 || one.HeldForMs <= 0 {
			t.Errorf("status --json: %d %q %v, want remote_addr %s, held_for_ms > 0", code, out, err, local)
		}
		if f, remote := statusRow(t, bin, admin, "free"); f[1] != "no" || f[8] != "-" || remote != "-" {
			t.Errorf("a free key: %q %q", f, remote)
		}
	})

	t.Run("cluster mode", func(t *testing.T) {
		addrs, admins := startThreeNodeCluster(t)
		token, local := acquireOverRawConn(t, addrs[0], "jobs/nightly")
		f, remote := statusRow(t, bin, admins[0], "jobs/nightly")
		if f[2] != strconv.FormatUint(token, 10) || f[3] == "-" || f[4] == "-" || f[7] != "node-1" || f[8] != "1" || remote != local {
			t.Errorf("node 1: status row %q %q, want token %d held since a time, for a while, grant node 1, remote %s", f, remote, token, local)
		}
		for i, admin := range admins[1:] {
			// Each node answers from its replica: asked until it applied the grant.
			deadline := time.Now().Add(10 * time.Second)
			for f, remote = statusRow(t, bin, admin, "jobs/nightly"); f[1] != "yes" && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
				f, remote = statusRow(t, bin, admin, "jobs/nightly")
			}
			if node := fmt.Sprintf("node-%d", i+2); f[2] != strconv.FormatUint(token, 10) || f[7] != node || f[8] != "1" || remote != "known at node 1" {
				t.Errorf("%s: status row %q %q, want token %d, grant node 1, remote known at node 1", node, f, remote, token)
			}
		}
	})
}

// startThreeNodeCluster starts a three-node cluster with a lockd server
// in front of each node, and returns their lock and admin addresses, in
// node order; nodes are named node-1..node-3.
func startThreeNodeCluster(t *testing.T) (addrs, admins []string) {
	t.Helper()
	peers := map[uint64]string{}
	for id := uint64(1); id <= 3; id++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peers[id] = ln.Addr().String()
		ln.Close()
	}
	nodes := make([]*cluster.Node, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() { // each node waits for its peers
			defer wg.Done()
			nodes[i], errs[i] = cluster.Start(cluster.Config{NodeID: uint64(i + 1), Peers: peers, DataDir: t.TempDir(), Groups: 2})
		}()
	}
	wg.Wait()
	for i, n := range nodes {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Cleanup(n.Close)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, n := range nodes {
		if err := n.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Backend: n, NodeName: fmt.Sprintf("node-%d", i+1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		addrs, admins = append(addrs, srv.Addr()), append(admins, srv.AdminAddr())
	}
	return addrs, admins
}
