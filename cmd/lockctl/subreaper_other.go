//go:build !linux

package main

// becomeSubreaper does nothing where the system has no subreapers: the
// orphans of a command go to init, and killGroup polls until init has
// reaped them.
func becomeSubreaper() {}
