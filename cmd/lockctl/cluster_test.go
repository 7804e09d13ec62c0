package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/cluster"
	"github.com/lockd/lockd/server"
)

// startClusterNode starts a one-node cluster behind a lockd server with
// the membership endpoint mounted, as lockd serve --cluster does, and
// returns its admin address and raft address. Three groups, so that the
// table lists a node leading several.
func startClusterNode(t *testing.T) (admin, raft string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	raft = ln.Addr().String()
	ln.Close()
	node, err := cluster.Start(cluster.Config{NodeID: 1, Peers: map[uint64]string{1: raft}, DataDir: t.TempDir(), Groups: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Backend: node,
		AdminRoutes: map[string]http.Handler{cluster.AdminPrefix: node.MembersHandler()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.AdminAddr(), raft
}

// lockctl cluster list as a table and as the server's JSON, and the
// changes a node refuses, with their messages.
func TestClusterCommand(t *testing.T) {
	admin, raft := startClusterNode(t)
	code, out, errs := ctl{}.run("cluster", "--admin", admin, "list")
	if code != exitOK || !strings.Contains(out, "NODE  RAFT ADDRESS") || !strings.Contains(out, fmt.Sprintf("1     %s  3/3     1,2,3", raft)) ||
		!strings.Contains(out, "log format by group, as node 1 applied it: 1:") || strings.Contains(out, "HALTED") {
		t.Fatalf("cluster list: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = ctl{env: map[string]string{"LOCKD_ADMIN": admin}}.run("cluster", "--json", "list")
	var m cluster.Membership
	if code != exitOK || json.Unmarshal([]byte(out), &m) != nil || m.Node != 1 || m.Groups != 3 || len(m.Members) != 1 || m.Members[0].Addr != raft {
		t.Fatalf("cluster --json list: exit %d %q", code, out)
	}
	for _, tt := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"cluster", "--admin", admin, "remove", "1"}, exitFailure, "cannot remove itself"},
		{[]string{"cluster", "--admin", admin, "add", "1", "127.0.0.1:1"}, exitFailure, "already a member at another address"},
		{[]string{"cluster", "--admin", admin}, exitUsage, "needs 1 argument\n"},
		{[]string{"cluster", "--admin", admin, "grow"}, exitUsage, "want list, add ID ADDR or remove ID"},
		{[]string{"cluster", "--admin", admin, "list", "x"}, exitUsage, "want list"},
		{[]string{"cluster", "--admin", admin, "add", "4"}, exitUsage, "want list"},
		{[]string{"cluster", "--admin", admin, "add", "x", "127.0.0.1:1"}, exitUsage, "node id"},
		{[]string{"cluster", "--admin", admin, "add", "4", "noport"}, exitUsage, "HOST:PORT"},
		{[]string{"cluster", "--admin", admin, "remove", "0"}, exitUsage, "node id"},
		{[]string{"cluster", "--admin", admin, "--tenant", "t", "list"}, exitUsage, "-tenant"},
		{[]string{"cluster", "--admin", deadAddr(t), "list"}, exitFailure, "--admin"},
	} {
		code, _, errs := ctl{}.run(tt.args...)
		if code != tt.code || !strings.Contains(errs, tt.says) {
			t.Errorf("%q: exit %d %q, want %d saying %q", tt.args, code, errs, tt.code, tt.says)
		}
	}
}

// A single-mode server, which mounts cluster.SingleModeHandler as lockd
// serve does, says it is single mode; any other 404 reads as an answer
// from something else than lockd.
func TestClusterCommandOnSingleMode(t *testing.T) {
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		AdminRoutes: map[string]http.Handler{cluster.AdminPrefix: cluster.SingleModeHandler()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	code, _, errs := ctl{}.run("cluster", "--admin", srv.AdminAddr(), "list")
	if want := "lockctl cluster list: this lockd runs in single mode: it has no cluster membership (lockctl cluster asks a node started with lockd serve --cluster)\n"; code != exitFailure || errs != want {
		t.Fatalf("cluster list on single mode: exit %d %q, want %d %q", code, errs, exitFailure, want)
	}
	_, admin := startInspectable(t, nil)
	code, _, errs = ctl{}.run("cluster", "--admin", admin, "list")
	if code != exitFailure || !strings.Contains(errs, "404") || !strings.Contains(errs, "is it lockd's admin endpoint?") {
		t.Fatalf("cluster list on a server without the route: exit %d %q", code, errs)
	}
}

// cluster list shows, in the asked node's view, whether each member is
// reachable and how long since it was last heard.
func TestClusterListShowsReachability(t *testing.T) {
	var m clusterMembers
	answer := `{"node": 1, "groups": 2, "members": [
		{"id": 1, "raft_addr": "10.0.0.1:7450", "groups": 2, "leader_of": [1, 2], "reachable": "self", "last_heard_ms": null},
		{"id": 2, "raft_addr": "10.0.0.2:7450", "groups": 2, "leader_of": [], "reachable": "yes", "last_heard_ms": 12},
		{"id": 3, "raft_addr": "10.0.0.3:7450", "groups": 2, "leader_of": [], "reachable": "down", "last_heard_ms": 61500},
		{"id": 4, "raft_addr": "10.0.0.4:7450", "groups": 2, "leader_of": [], "reachable": "down", "last_heard_ms": null}],
		"removed": []}`
	if err := json.Unmarshal([]byte(answer), &m); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	printMembers(&out, m)
	for _, row := range []string{
		"NODE  RAFT ADDRESS   GROUPS  LEADER OF  REACHABLE  LAST HEARD\n",
		"1     10.0.0.1:7450  2/2     1,2        self       -\n",
		"2     10.0.0.2:7450  2/2                yes        12ms ago\n",
		"3     10.0.0.3:7450  2/2                down       1m1.5s ago\n",
		"4     10.0.0.4:7450  2/2                down       never\n",
		"as node 1 sees them",
	} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("cluster list does not show %q:\n%s", row, out.String())
		}
	}
}

// cluster list shows the asked node's log format of each group and why
// any of its replicas halted; an earlier build's answer has neither.
func TestClusterListShowsFormatsAndHalts(t *testing.T) {
	answer := `{"node": 2, "groups": 2, "members": [
		{"id": 2, "raft_addr": "10.0.0.2:7450", "groups": 2, "leader_of": [], "reachable": "self", "last_heard_ms": null}],
		"removed": [], "log_formats": [2, 1],
		"halted": ["group 2 halted at log entry 7: cluster: unknown command kind 'W'; this build (lockd v0.1.0) cannot apply it"]}`
	var m clusterMembers
	if err := json.Unmarshal([]byte(answer), &m); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	printMembers(&out, m)
	for _, line := range []string{
		"log format by group, as node 2 applied it: 1:2 2:1\n",
		"HALTED on node 2: group 2 halted at log entry 7: cluster: unknown command kind 'W'; this build (lockd v0.1.0) cannot apply it\n",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("cluster list does not show %q:\n%s", line, out.String())
		}
	}
	var earlier clusterMembers
	if err := json.Unmarshal([]byte(`{"node": 1, "groups": 1, "members": [], "removed": []}`), &earlier); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	printMembers(&out, earlier)
	if strings.Contains(out.String(), "log format") || strings.Contains(out.String(), "HALTED") {
		t.Errorf("an earlier build's answer shows formats or halts:\n%s", out.String())
	}
}

// With lockd's --admin-token-file, lockctl cluster and status send the
// token of their own --admin-token-file; without it they are refused.
func TestAdminTokenFile(t *testing.T) {
	token := "0123456789abcdef0123456789abcdef"
	path := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(server.Config{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: []byte(token)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if code, out, errs := (ctl{}).run("status", "--admin", srv.AdminAddr(), "some/key"); code != exitFailure || !strings.Contains(errs, "bearer token") {
		t.Fatalf("status without the token: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := (ctl{}).run("status", "--admin", srv.AdminAddr(), "--admin-token-file", path, "some/key"); code != exitOK || !strings.Contains(out, "some/key") {
		t.Fatalf("status with the token: exit %d\n%s%s", code, out, errs)
	}
}
