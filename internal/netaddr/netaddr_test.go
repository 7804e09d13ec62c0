package netaddr

import "testing"

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7420": true, "localhost:1": true, "[::1]:7": true, "127.3.0.1:9": true,
		"0.0.0.0:7420": false, ":7420": false, "10.0.0.1:1": false, "lockd-0.lockd:7430": false,
	} {
		if got, err := IsLoopback(addr); err != nil || got != want {
			t.Errorf("IsLoopback(%q) = %v, %v; want %v", addr, got, err, want)
		}
	}
	if _, err := IsLoopback("no-port"); err == nil {
		t.Error("IsLoopback(\"no-port\"): no error")
	}
}
