// Package sysmonanchor keeps the Go runtime's monitor thread out of its
// deep sleep while a cluster node applies commands
// (cluster.Config.MonitorAnchor). It owns the anchor goroutine and the
// count of applied entries that wakes it.
package sysmonanchor

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Anchor keeps one Go processor (P) in a system call while the
// node applies commands, so that the runtime's monitor thread (sysmon)
// never finds every P idle.
//
// Why: between two Raft messages every P of a follower goes idle, the
// monitor then sleeps deeply, and the next system call wakes it with its
// tick reset to 20 µs, which it keeps for at least 50 ticks before it
// backs off (runtime.sysmon: a wake from a system call "resets idle and
// delay"). At one caller that keeps each follower's monitor waking every
// few tens of microseconds for as long as the node works, a large share of
// the nodes' CPU and context switches. With one P in a system call the
// monitor never sleeps deeply and backs off to its 10 ms tick, as it does
// on a leader whose event loop waits in epoll_wait (docs/cluster.md,
// Performance). The anchor needs a P of its
// own (lockd serve adds one): a goroutine that shared the anchor's P
// would wait for the monitor to take it back.
//
// Between bursts it waits on a channel, off any P, and costs nothing: the
// first entry applied after a quiet period wakes it.
type Anchor struct {
	applied atomic.Uint64 // entries this node applied
	parked  atomic.Bool   // run waits for wake
	wake    chan struct{}
	// hold sleeps d in a system call, keeping the calling goroutine's P.
	hold func(d time.Duration)
}

const (
	// anchorQuiet is how long the anchor keeps holding after the last
	// entry it saw applied.
	anchorQuiet = 100 * time.Millisecond
	// anchorHold stays below the 10 ms after which the monitor takes a P
	// from a system call even when other Ps are idle; once taken, every
	// P could go idle again.
	anchorHold = 5 * time.Millisecond
)

// New is an anchor, parked until Run starts it.
func New() *Anchor {
	return &Anchor{wake: make(chan struct{}, 1), hold: holdInSyscall}
}

// NoteApplied counts an applied entry and wakes a parked anchor: an atomic
// add and load per entry, a channel send only for the first entry after a
// quiet period. A nil anchor does nothing.
func (a *Anchor) NoteApplied() {
	if a == nil {
		return
	}
	a.applied.Add(1)
	if a.parked.Load() && a.parked.CompareAndSwap(true, false) {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}

// Run holds a P in anchorHold system calls from the first entry applied
// until anchorQuiet passes without one, then parks until the next, until
// ctx is done. An entry applied just as it parks is missed; the next one
// wakes it.
func (a *Anchor) Run(ctx context.Context) {
	for {
		a.parked.Store(true)
		select {
		case <-a.wake:
		case <-ctx.Done():
			return
		}
		for {
			last := a.applied.Load()
			for range anchorQuiet / anchorHold {
				a.hold(anchorHold)
				if ctx.Err() != nil {
					return
				}
				// Whatever became runnable on this P meanwhile runs now,
				// not after the next hold.
				runtime.Gosched()
			}
			if a.applied.Load() == last {
				break
			}
		}
	}
}

// Applied is the number of entries noted.
func (a *Anchor) Applied() uint64 { return a.applied.Load() }

func holdInSyscall(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_ = unix.Nanosleep(&ts, nil) // EINTR only shortens one hold
}
