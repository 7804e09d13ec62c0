package client

import (
	"context"
	"net"
	"testing"
)

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

// NewStallingDialer returns a Dialer of real connections, numbered in
// dial order, and a function that makes connection index deaf: its reads
// return nothing of what arrives from then on, as if every answer of the
// server were lost.
func NewStallingDialer() (dial func(ctx context.Context, network, addr string) (net.Conn, error), stall func(index int)) {
	d := &stallingDialer{}
	return d.dial, d.stallConn
}
