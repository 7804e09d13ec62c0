package main

import "time"

// wallClockHook, set only by a build with the clockhook tag (tests),
// makes the cluster node's wall clock for a data dir.
var wallClockHook func(dataDir string) func() time.Time
