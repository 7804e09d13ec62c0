package server

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
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

// A RELEASE that grants a waiter served by the same event loop hands the
// grant over within the loop's pass: the waiter gets its ACQUIRED without
// a wake-up of the loop (an eventfd write and one more turn of the loop).
// A grant from outside any pass — the lease's timer — still wakes it.
func TestSameLoopGrantNeedsNoWakeup(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Loops = 1 })
	holder := dial(t, s)
	token := holder.mustAcquire(1, "k")
	first := dial(t, s)
	first.acquire(2, 30, 60, "k")
	first.expectOpen()

	before := s.metrics.wakeups.Load()
	holder.send(codec.AppendRelease(nil, 3, token, "k"))
	holder.expect(codec.OpReleased, 3)
	first.expect(codec.OpAcquired, 2)
	if woken := s.metrics.wakeups.Load() - before; woken != 0 {
		t.Fatalf("a grant released on the waiter's own loop woke the loop %d times, want 0", woken)
	}

	second := dial(t, s)
	second.acquire(4, 30, 60, "k")
	second.expectOpen()
	// The pong leaves before the pass that wrote it ends; a grant made
	// during that pass would be handed over, not woken.
	waitFor(t, s.loopsIdle)
	before = s.metrics.wakeups.Load()
	s.advance(30 * time.Second) // first's lease ends: the engine's timer grants second
	second.expect(codec.OpAcquired, 4)
	if woken := s.metrics.wakeups.Load() - before; woken != 1 {
		t.Fatalf("a grant from the lease timer woke the loop %d times, want 1", woken)
	}
}

// loopsIdle reports whether no event loop is in a pass.
func (s *Server) loopsIdle() bool {
	s.batchesMu.Lock()
	defer s.batchesMu.Unlock()
	for _, b := range s.batches {
		b.mu.Lock()
		inPass := b.inPass
		b.mu.Unlock()
		if inPass {
			return false
		}
	}
	return true
}
