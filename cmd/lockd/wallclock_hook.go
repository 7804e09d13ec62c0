//go:build clockhook

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// wallOffsetFile, in a node's data dir, steps its wall clock in a build
// with the clockhook tag: it holds an offset (a Go duration, "1h",
// "-1h", "0s") that the node adds to its wall clock from then on. The
// process fault test's clock-step rounds write it.
const wallOffsetFile = "wall-offset"

// wallOffsetPoll is how often the hook reads the file.
const wallOffsetPoll = 50 * time.Millisecond

func init() {
	wallClockHook = func(dataDir string) func() time.Time {
		var offset atomic.Int64
		path := filepath.Join(dataDir, wallOffsetFile)
		go func() {
			for ; ; time.Sleep(wallOffsetPoll) {
				b, err := os.ReadFile(path)
				if err != nil {
					continue
				}
				d, err := time.ParseDuration(strings.TrimSpace(string(b)))
				if err != nil || offset.Swap(int64(d)) == int64(d) {
					continue
				}
				fmt.Fprintf(os.Stderr, "test hook: wall clock offset %v\n", d)
			}
		}()
		return func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	}
}
