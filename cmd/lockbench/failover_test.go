package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// The failover workload's flags: a fault, victim or cluster it does not
// know is refused by name before any cluster starts, as is a stop fault
// frozen for no time or a peer jitter beyond the peer delay, and a
// missing etcd binary is reported as such.
func TestFailoverFlagsRefuseUnknownValues(t *testing.T) {
	lockd := filepath.Join(t.TempDir(), "lockd") // never started: every run is refused first
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fault", "reboot"}, `fault "reboot"`},
		{[]string{"--victim", "everyone"}, `victim "everyone"`},
		{[]string{"--cluster", "redis"}, `system "redis"`},
		{[]string{"--cluster", "etcd", "--etcd-bin", filepath.Join(t.TempDir(), "no-etcd")}, "no-etcd"},
		{[]string{"--fault", ""}, "at least one value"},
		{[]string{"--fault", "stop", "--stop-for", "0s"}, "--stop-for 0s"},
		{[]string{"--peer-delay", "100ms", "--peer-jitter", "200ms"}, "--peer-delay 100ms --peer-jitter 200ms"},
	} {
		args := append([]string{"--workload", "failover", "--lockd-bin", lockd}, c.args...)
		_, _, err := runCommand(t, args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %q", c.args, err, c.want)
		}
	}
}
