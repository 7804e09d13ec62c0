package engine

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type resolution struct {
	owner uint64
	r     Result
}

// recorder is a Waiter that keeps resolutions in the order they came.
type recorder struct{ got []resolution }

func (rc *recorder) Resolve(owner uint64, r Result) {
	rc.got = append(rc.got, resolution{owner, r})
}

func (rc *recorder) take() []resolution {
	got := rc.got
	rc.got = nil
	return got
}
