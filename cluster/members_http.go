package cluster

// This file owns the membership endpoint the admin HTTP server mounts in
// cluster mode:
//
//	GET    /v1/cluster/members        every group's members, merged by node
//	POST   /v1/cluster/members        {"id": N, "raft_addr": "host:port"}: add N to every group
//	DELETE /v1/cluster/members/{id}   remove id from every group
//
// A change answers the membership after it. Each member's "reachable" is
// what this node's Raft transport finds when it asks (probePeers): "yes"
// when a connection to the member's Raft address opens (with mutual TLS
// when the transport has it), "down" when it does not within
// probeTimeout, "self" for this node. Every peer is probed, whether or
// not a group either of the two leads keeps them talking, so a node that
// is down reads "down" at once from any member. With lockd's
// --admin-token-file every route here needs the bearer token (the admin
// server checks it before this handler); without one the admin endpoint
// stays on loopback unless the operator opens it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lockd/lockd/cluster/raftnet"
	"github.com/lockd/lockd/internal/adminjson"
)

// AdminPrefix is the admin path MembersHandler is mounted at; MembersPath
// is where it serves.
const (
	AdminPrefix = "/v1/cluster/"
	MembersPath = AdminPrefix + "members"
)

// memberRequestTimeout bounds one membership request: a change goes
// through every group in turn, each under memberTimeout, and is repeated
// from where it stopped when it runs out.
const memberRequestTimeout = time.Minute

// MembersHandler serves the membership endpoint of this node.
func (n *Node) MembersHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+MembersPath, func(w http.ResponseWriter, r *http.Request) {
		n.answerMembers(w, r, nil)
	})
	mux.HandleFunc("POST "+MembersPath, func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID       uint64 `json:"id"`
			RaftAddr string `json:"raft_addr"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.ID == 0 || req.RaftAddr == "" {
			adminjson.Error(w, http.StatusBadRequest, `want {"id": N >= 1, "raft_addr": "host:port"}`)
			return
		}
		n.answerMembers(w, r, func(ctx context.Context) error { return n.AddMember(ctx, req.ID, req.RaftAddr) })
	})
	mux.HandleFunc("DELETE "+MembersPath+"/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
		if err != nil || id == 0 {
			adminjson.Error(w, http.StatusBadRequest, fmt.Sprintf("node id %q: want a number >= 1", r.PathValue("id")))
			return
		}
		n.answerMembers(w, r, func(ctx context.Context) error { return n.RemoveMember(ctx, id) })
	})
	return mux
}

// answerMembers runs change, if any, then answers the membership.
func (n *Node) answerMembers(w http.ResponseWriter, r *http.Request, change func(context.Context) error) {
	ctx, cancel := context.WithTimeout(r.Context(), memberRequestTimeout)
	defer cancel()
	// The admin server's write timeout is sized for scrapes.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(memberRequestTimeout + 5*time.Second))
	if change != nil {
		if err := change(ctx); err != nil {
			code := http.StatusServiceUnavailable
			if errors.Is(err, ErrMemberExists) || errors.Is(err, ErrMemberRemoved) || errors.Is(err, ErrRemoveSelf) || errors.Is(err, ErrMemberFormat) {
				code = http.StatusConflict
			}
			adminjson.Error(w, code, err.Error())
			return
		}
	}
	m, err := n.Members(ctx)
	if err != nil {
		adminjson.Error(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	n.probePeers(ctx, m.Members)
	adminjson.Write(w, m)
}

// ReachableDown is a member's Reachable when this node's transport
// cannot open a connection to it (probePeers).
const ReachableDown = "down"

// probeTimeout bounds one probe: a peer whose Raft port neither accepts
// nor refuses in this time reads down.
const probeTimeout = time.Second

// probePeers sets the Reachable of every member but this node from a
// connection this node's transport opens to its Raft address now, all at
// once: yes when it opens (TCP, and the TLS handshake when Raft runs
// over TLS), ReachableDown when it does not within probeTimeout. The
// connection is closed at once; the peer sees a connection that ends
// before its first frame, which it drops without a word.
func (n *Node) probePeers(ctx context.Context, members []Member) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i := range members {
		mb := &members[i]
		if mb.ID == n.cfg.NodeID {
			mb.Reachable = ReachableSelf
			continue
		}
		wg.Go(func() {
			conn, err := raftnet.Dial(ctx, n.cfg.RaftTLS, n.log, mb.Addr)
			if err != nil {
				mb.Reachable = ReachableDown
				return
			}
			conn.Close()
			mb.Reachable = ReachableYes
		})
	}
	wg.Wait()
}

// SingleModeHandler answers the membership endpoint's paths on a server
// in single mode, which has no membership: a clear 404, rather than the
// admin server's bare one.
func SingleModeHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		adminjson.Error(w, http.StatusNotFound, "this lockd runs in single mode: it has no cluster membership (lockctl cluster asks a node started with lockd serve --cluster)")
	})
}
