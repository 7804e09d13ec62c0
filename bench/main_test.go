package bench

import (
	"testing"

	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}
