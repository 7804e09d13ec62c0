package engine_test

import (
	"testing"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/engine/rulestest"
)

// TestRuleScenarios holds the engine to the lock rules' scripts, which the
// cluster's state machine must answer alike.
func TestRuleScenarios(t *testing.T) {
	rulestest.Run(t, func(*testing.T) rulestest.Wrapper { return rulestest.NewEngineWrapper(engine.Config{Shards: 1}) })
}
