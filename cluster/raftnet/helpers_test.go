package raftnet

import (
	"testing"
	"time"

	"github.com/lockd/lockd/internal/poll"
	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

// TestMain checks that closed transports leave no goroutines behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}

func waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll.Until(within, 5*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

const refusedLog = "raft transport: TLS handshake refused"
