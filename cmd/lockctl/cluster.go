package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// cluster list|add|remove reads and changes a cluster's membership through
// one node's admin endpoint (/v1/cluster/members). A change goes through
// every Raft group in turn; one that stops half-way is finished by the
// same command again.

// clusterTimeout bounds a membership change: the node itself gives up
// after a minute.
const clusterTimeout = 70 * time.Second

// clusterMembers is the admin endpoint's membership answer.
type clusterMembers struct {
	Node    uint64 `json:"node"`
	Groups  int    `json:"groups"`
	Members []struct {
		ID       uint64 `json:"id"`
		RaftAddr string `json:"raft_addr"`
		Groups   int    `json:"groups"`
		LeaderOf []int  `json:"leader_of"`
		// Reachable and LastHeardMs are the answering node's view:
		// "self", "yes" or "down" (an earlier build: "no", "unknown").
		Reachable   string `json:"reachable"`
		LastHeardMs *int64 `json:"last_heard_ms"`
	} `json:"members"`
	Removed []uint64 `json:"removed"`
	// LogFormats and Halted are the answering node's replicas: each
	// group's log format, and why any of them halted. An earlier build
	// sends neither.
	LogFormats []int    `json:"log_formats"`
	Halted     []string `json:"halted"`
}

func runCluster(ctx context.Context, o *options, args []string, p proc) int {
	req := adminRequest{method: http.MethodGet, path: "/v1/cluster/members", timeout: adminTimeout}
	want := map[string]int{"list": 1, "add": 3, "remove": 2}
	if n, ok := want[args[0]]; !ok || len(args) != n {
		fmt.Fprintf(p.err, "lockctl cluster: want list, add ID ADDR or remove ID\n")
		return exitUsage
	}
	switch args[0] {
	case "add", "remove":
		id, err := strconv.ParseUint(args[1], 10, 64)
		if err != nil || id == 0 {
			fmt.Fprintf(p.err, "lockctl cluster %s: node id %q: want a number >= 1\n", args[0], args[1])
			return exitUsage
		}
		req.timeout = clusterTimeout
		if args[0] == "remove" {
			req.method, req.path = http.MethodDelete, req.path+"/"+args[1]
			break
		}
		if _, _, err := net.SplitHostPort(args[2]); err != nil {
			fmt.Fprintf(p.err, "lockctl cluster add: raft address %q: want HOST:PORT\n", args[2])
			return exitUsage
		}
		req.method = http.MethodPost
		req.body, _ = json.Marshal(struct {
			ID       uint64 `json:"id"`
			RaftAddr string `json:"raft_addr"`
		}{id, args[2]})
	}
	var m clusterMembers
	return askAdmin(ctx, o, "cluster "+args[0], req, &m, p, func(w io.Writer) { printMembers(w, m) })
}

// printMembers writes the membership as a table; a node in fewer groups
// than all is in the middle of a change. REACHABLE and LAST HEARD are the
// view of the node asked (Node).
func printMembers(w io.Writer, m clusterMembers) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRAFT ADDRESS\tGROUPS\tLEADER OF\tREACHABLE\tLAST HEARD")
	for _, mb := range m.Members {
		leads := make([]string, len(mb.LeaderOf))
		for i, g := range mb.LeaderOf {
			leads[i] = strconv.Itoa(g)
		}
		groups := fmt.Sprintf("%d/%d", mb.Groups, m.Groups)
		if mb.Groups != m.Groups {
			groups += " (change under way or stopped: repeat it)"
		}
		heard := "never"
		switch {
		case mb.Reachable == "self":
			heard = "-"
		case mb.LastHeardMs != nil:
			heard = (time.Duration(*mb.LastHeardMs) * time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", mb.ID, mb.RaftAddr, groups, strings.Join(leads, ","), mb.Reachable, heard)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "REACHABLE and LAST HEARD as node %d sees them: whether its Raft transport connects to the node now (yes or down), and its last Raft message from it\n", m.Node)
	if len(m.Removed) > 0 {
		ids := make([]string, len(m.Removed))
		for i, id := range m.Removed {
			ids[i] = strconv.FormatUint(id, 10)
		}
		fmt.Fprintf(w, "removed (their ids cannot come back): %s\n", strings.Join(ids, ","))
	}
	if len(m.LogFormats) > 0 {
		formats := make([]string, len(m.LogFormats))
		for i, f := range m.LogFormats {
			formats[i] = fmt.Sprintf("%d:%d", i+1, f)
		}
		fmt.Fprintf(w, "log format by group, as node %d applied it: %s\n", m.Node, strings.Join(formats, " "))
	}
	for _, why := range m.Halted {
		fmt.Fprintf(w, "HALTED on node %d: %s\n", m.Node, why)
	}
}
