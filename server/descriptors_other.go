//go:build !unix

package server

import "math"

// raiseDescriptorLimit: without RLIMIT_NOFILE there is no limit to derive
// the connection cap from.
func raiseDescriptorLimit() (limit, before uint64, err error) {
	return math.MaxInt32, math.MaxInt32, nil
}

func openDescriptors() (int, error) { return 0, nil }

func setAcceptBacklog(int, int) error { return nil }
