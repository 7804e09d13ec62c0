package bench

import (
	"os"
	"testing"

	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(usageHelperEnv) != "" {
		usageHelper()
		return
	}
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}
