package cluster

import (
	"testing"

	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

// TestMain checks that closed nodes and servers leave no goroutines behind:
// dragonboat's NodeHost.Close stops all of its own. Only gnet's global
// worker pool (started when gnet is loaded, as in the server tests) is
// ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}
