package main

import "golang.org/x/sys/unix"

// becomeSubreaper makes lockctl the parent of every orphan among its
// descendants, so that killGroup can reap the processes a command left
// behind instead of losing them to init (or to a container's PID 1,
// which may never reap them).
func becomeSubreaper() {
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}
