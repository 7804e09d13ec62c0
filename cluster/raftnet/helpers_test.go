package raftnet

import (
	"testing"
	"time"

	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

// TestMain checks that closed transports leave no goroutines behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}

func waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const refusedLog = "raft transport: TLS handshake refused"
