package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that closed nodes and servers leave no goroutines behind:
// dragonboat's NodeHost.Close stops all of its own. Only gnet's global
// worker pool (started when gnet is loaded, as in the server tests) is
// ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
		goleak.IgnoreAnyFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1"),
	)
}
