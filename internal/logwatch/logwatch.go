// Package logwatch is a log destination for tests that tells them when a
// line they wait for was written: a test proves that a node refused or
// logged something by waiting for the line, never by sleeping and then
// reading the log. It knows nothing of what writes the lines.
package logwatch

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// Watch closes Seen once a written line contains its text.
type Watch struct {
	want []byte
	seen chan struct{}
	once sync.Once
}

// For watches for lines containing want.
func For(want string) *Watch {
	return &Watch{want: []byte(want), seen: make(chan struct{})}
}

// Write takes one log line (zerolog writes a line per call).
func (w *Watch) Write(p []byte) (int, error) {
	if bytes.Contains(p, w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// Seen is closed once a line held the text.
func (w *Watch) Seen() <-chan struct{} { return w.seen }

// Wait fails t unless a line holds the text within 20 s; what says in
// the failure what the line would have shown.
func (w *Watch) Wait(t testing.TB, what string) {
	t.Helper()
	select {
	case <-w.seen:
	case <-time.After(20 * time.Second):
		t.Fatalf("no log line says %s (%q) in 20 s", what, w.want)
	}
}
