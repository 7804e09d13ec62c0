package sysmonanchor

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that a cancelled anchor leaves no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
