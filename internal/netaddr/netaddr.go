// Package netaddr answers questions about listen addresses that lockd's
// exposure checks ask: the client port, the admin endpoint and the Raft
// port each refuse to be reachable from other machines unprotected.
package netaddr

import "net"

// IsLoopback reports whether addr (host:port) can only be reached from
// this machine.
func IsLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}
