package server

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// A gnet loop's epoll_wait keeps its P while it blocks, so the default
// leaves one P to the rest of the process: timers, the engine's expiry,
// Raft's workers.
func TestDefaultLoopsLeaveOneProcessorFree(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct{ procs, loops int }{{1, 1}, {2, 1}, {4, 3}, {16, 15}} {
		runtime.GOMAXPROCS(tc.procs)
		if got := DefaultLoops(); got != tc.loops {
			t.Errorf("GOMAXPROCS %d: DefaultLoops() = %d, want %d", tc.procs, got, tc.loops)
		}
	}
}

func TestUnsetLoopsRunTheDefault(t *testing.T) {
	var log syncBuffer
	startServer(t, func(cfg *Config) { cfg.Loops, cfg.Logger = 0, zerolog.New(&log) })
	want := fmt.Sprintf(`"loops":%d`, DefaultLoops())
	if !strings.Contains(log.String(), want) {
		t.Fatalf("start log %q lacks %s", log.String(), want)
	}
}
