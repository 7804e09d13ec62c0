// Package adminjson writes the admin endpoint's JSON answers, the same
// way for every package that serves one (the lock inspection, the
// cluster membership): the value, or {"error": msg} with a status code;
// and it declares the inspection's answer, which the server writes and
// lockctl reads. It knows HTTP and JSON, and no lock rule.
package adminjson

import (
	"encoding/json"
	"net/http"
)

// Write answers v as JSON, never cached.
func Write(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// Error answers {"error": msg} with code.
func Error(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}

// LockStatus is the lock inspection's JSON answer for one key. A field
// an earlier server does not send reads as its zero value.
type LockStatus struct {
	Tenant           string `json:"tenant"`
	Key              string `json:"key"`
	Held             bool   `json:"held"`
	Token            uint64 `json:"token"`              // 0 unless held
	LeaseRemainingMs int64  `json:"lease_remaining_ms"` // 0 unless held
	// HeldForMs is how long the current token has been held, rounded
	// up; 0 when not held.
	HeldForMs int64 `json:"held_for_ms"`
	Waiters   int   `json:"waiters"`
	// Node is the name (--node-name) of the server that answered: in
	// cluster mode, from its replica of the group's state.
	Node string `json:"node"`
	// NodeID is the cluster node id of the server that answered; 0 in
	// single mode.
	NodeID uint64 `json:"node_id"`
	// GrantNode is the cluster node id whose client's ACQUIRE got the
	// token: that node delivered the grant and may know RemoteAddr. 0
	// unless held, and in single mode.
	GrantNode uint64 `json:"grant_node"`
	// RemoteAddr is the remote address (IP:port) of the connection the
	// grant was delivered on, when the server that answered delivered it
	// and still remembers it; empty otherwise.
	RemoteAddr string `json:"remote_addr"`
}
