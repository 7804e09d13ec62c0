package client

import "testing"

// Test helpers for the client_test package, whose tests may import the
// server.
var (
	Eventually   = eventually
	GoAcquire    = goAcquire
	GoAcquireCtx = goAcquireCtx
	WaitFor      = waitFor
)

func Await[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	return await(t, ch)
}
