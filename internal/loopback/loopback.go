// Package loopback binds listening ports on 127.0.0.1 for tests before
// the servers that take them over start, so that every address is known
// up front and no test races another for a port. It owns nothing past
// the bind.
package loopback

import (
	"net"
	"testing"
)

// Listeners binds n ports on 127.0.0.1.
func Listeners(t testing.TB, n int) []net.Listener {
	t.Helper()
	ls := make([]net.Listener, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	return ls
}
