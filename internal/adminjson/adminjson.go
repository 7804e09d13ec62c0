// Package adminjson writes the admin endpoint's JSON answers, the same
// way for every package that serves one (the lock inspection, the
// cluster membership): the value, or {"error": msg} with a status code.
// It knows HTTP and JSON, nothing of locks.
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
