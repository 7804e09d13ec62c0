//go:build unix

package server

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// raiseDescriptorLimit raises the soft RLIMIT_NOFILE to the hard one and
// returns the limit now in force and the soft limit before.
func raiseDescriptorLimit() (limit, before uint64, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, fmt.Errorf("server: read the descriptor limit: %w", err)
	}
	before = rl.Cur
	if rl.Cur < rl.Max {
		raised := rl
		raised.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err == nil {
			rl = raised
		}
	}
	return rl.Cur, before, nil
}

// openDescriptors counts the descriptors the process has open.
func openDescriptors() (int, error) {
	for _, dir := range []string{"/proc/self/fd", "/dev/fd"} {
		if entries, err := os.ReadDir(dir); err == nil {
			return len(entries) - 1, nil // less the one ReadDir opened
		}
	}
	return 0, fmt.Errorf("server: cannot count open descriptors: no /proc/self/fd or /dev/fd")
}

// setAcceptBacklog sets the kernel's accept queue of a listening socket:
// listen(2) on a socket that already listens only changes its backlog.
func setAcceptBacklog(fd, backlog int) error {
	return unix.Listen(fd, backlog)
}
