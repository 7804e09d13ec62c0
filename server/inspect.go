package server

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/adminjson"
)

// Lock inspection over the admin endpoint, read-only:
//
//	GET /v1/locks/{tenant}/{key}               one key
//	GET /v1/locks/{tenant}?prefix=P&limit=N    the held or waited-for keys starting with P, sorted
//
// The key is the rest of the path after the tenant, percent-decoded, so
// it may contain '/'. The paths are matched before the mux, which would
// redirect a path holding "//", "." or ".." (all valid in a key) to its
// cleaned form.
const locksPath = "/v1/locks/"

// Limits of a list request.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// LockStatus is the JSON answer for one key (adminjson.LockStatus, the
// shape lockctl reads too).
type LockStatus = adminjson.LockStatus

// nodeIdentity is a backend that is a node of a cluster.
type nodeIdentity interface{ ID() uint64 }

// withLocks serves the lock inspection paths and hands every other
// request to next.
func (s *Server) withLocks(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.EscapedPath(), locksPath)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			adminjson.Error(w, http.StatusMethodNotAllowed, "lock inspection is read-only: use GET")
			return
		}
		inspector, ok := s.backend.(engine.Inspector)
		if !ok {
			adminjson.Error(w, http.StatusNotImplemented, "this backend cannot show its locks")
			return
		}
		tenantPart, keyPart, single := strings.Cut(rest, "/")
		tenant, err := url.PathUnescape(tenantPart)
		if err != nil || !codec.ValidTenant([]byte(tenant)) {
			adminjson.Error(w, http.StatusBadRequest, fmt.Sprintf("tenant %q: want 1..%d bytes of [A-Za-z0-9._-]", tenantPart, codec.MaxTenantLen))
			return
		}
		if single {
			key, err := url.PathUnescape(keyPart)
			if err != nil || !codec.ValidKey([]byte(key)) {
				adminjson.Error(w, http.StatusBadRequest, fmt.Sprintf("key %q: want 1..%d bytes of UTF-8 without spaces", keyPart, codec.MaxKeyLen))
				return
			}
			adminjson.Write(w, s.lockStatus(tenant, inspector.InspectLock(tenant, []byte(key))))
			return
		}
		prefix, limit, err := listParams(r.URL.Query())
		if err != nil {
			adminjson.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		infos := inspector.ListLocks(tenant, []byte(prefix), limit)
		out := make([]LockStatus, 0, len(infos))
		for _, info := range infos {
			out = append(out, s.lockStatus(tenant, info))
		}
		adminjson.Write(w, out)
	})
}

// listParams reads prefix (default empty: every key) and limit (default
// DefaultListLimit, 1..MaxListLimit).
func listParams(q url.Values) (prefix string, limit int, err error) {
	prefix, limit = q.Get("prefix"), DefaultListLimit
	if prefix != "" && !codec.ValidKey([]byte(prefix)) {
		return "", 0, fmt.Errorf("prefix %q: want at most %d bytes of UTF-8 without spaces", prefix, codec.MaxKeyLen)
	}
	if text := q.Get("limit"); text != "" {
		n, err := strconv.Atoi(text)
		if err != nil || n < 1 || n > MaxListLimit {
			return "", 0, fmt.Errorf("limit %q: want 1..%d", text, MaxListLimit)
		}
		limit = n
	}
	return prefix, limit, nil
}

func (s *Server) lockStatus(tenant string, info engine.LockInfo) LockStatus {
	st := LockStatus{
		Tenant:           tenant,
		Key:              info.Key,
		Held:             info.Held,
		Token:            info.Token,
		LeaseRemainingMs: info.LeaseRemaining.Milliseconds(),                   // rounded down: never more than is left
		HeldForMs:        (info.HeldFor + time.Millisecond - 1).Milliseconds(), // rounded up: 0 only when unknown
		Waiters:          info.Waiters,
		Node:             s.cfg.NodeName,
		GrantNode:        info.GrantNode,
	}
	if id, ok := s.backend.(nodeIdentity); ok {
		st.NodeID = id.ID()
	}
	if info.Held {
		if remote, ok := s.origins.lookup(s.origins.originKey(s.origins.tenantOrigin(tenant), []byte(info.Key)), info.Token); ok {
			st.RemoteAddr = remote.String()
		}
	}
	return st
}
