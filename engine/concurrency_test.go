package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// chanWaiter hands a resolution to the goroutine that queued; with one
// acquire outstanding per goroutine and a buffer of one it never blocks.
type chanWaiter chan Result

func (c chanWaiter) Resolve(_ uint64, r Result) { c <- r }

// TestConcurrentMutualExclusion hammers a few keys from many goroutines,
// with Tick, Sweep and Stats running alongside, and checks by token that no
// two goroutines ever hold a key at once. The clock does not move, so leases
// never end and any overlap is a bug.
func TestConcurrentMutualExclusion(t *testing.T) {
	const workers, rounds, keys = 8, 1000, 3
	e := New(Config{Shards: 4, Clock: NewFakeClock()})
	ns := e.Namespace("t")
	var holder, lastToken [keys]atomic.Uint64

	stop := make(chan struct{})
	var background sync.WaitGroup
	background.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				e.Tick()
				e.Sweep()
				e.Stats()
			}
		}
	})

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			resolved := make(chanWaiter, 1)
			for i := range rounds {
				k := (w + i) % keys
				key := fmt.Appendf(nil, "key%d", k)
				owner := uint64(w*rounds + i + 1)
				r, wait := e.Acquire(ns, key, owner, 0, time.Hour, time.Minute, resolved)
				if r.Outcome == Queued {
					if i%5 == 0 && e.Cancel(wait) {
						continue
					}
					r = <-resolved
				}
				if r.Outcome != Granted {
					t.Errorf("acquire %s: %v", key, r.Outcome)
					return
				}
				if !holder[k].CompareAndSwap(0, r.Token) {
					t.Errorf("key %d granted token %d while token %d holds it", k, r.Token, holder[k].Load())
					return
				}
				if prev := lastToken[k].Swap(r.Token); r.Token <= prev {
					t.Errorf("key %d: token %d after %d", k, r.Token, prev)
				}
				holder[k].Store(0)
				if rr := e.Release(ns, key, r.Token); rr.Outcome != Released {
					t.Errorf("release %s token %d: %v", key, r.Token, rr.Outcome)
					return
				}
			}
			select {
			case r := <-resolved:
				t.Errorf("resolved after the last acquire: %v", r)
			default:
			}
		})
	}
	wg.Wait()
	close(stop)
	background.Wait()

	if st := e.Stats(); st.Keys != 0 || st.Waiters != 0 || st.Inflight != 0 {
		t.Fatalf("after the run: %+v", st)
	}
}

// TestRun checks the real-time driver in a synctest bubble, where the
// RealClock and Run's timers follow the bubble's fake time.
func TestRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(Config{Shards: 4})
		ns := e.Namespace("t")
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			e.Run(ctx)
			close(done)
		}()

		// Run sleeps with nothing scheduled; a new wait deadline must wake it.
		e.Acquire(ns, []byte("a"), 1, 0, time.Hour, 0, nil)
		timedOut := make(chanWaiter, 1)
		if r, _ := e.Acquire(ns, []byte("a"), 2, 0, time.Hour, 3*time.Second, timedOut); r.Outcome != Queued {
			t.Fatalf("acquire: %v", r.Outcome)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		expectResolution(t, timedOut, Result{Outcome: TimedOut})

		// A lease end with a waiter hands the lock over on time.
		first, _ := e.Acquire(ns, []byte("b"), 3, 0, 10*time.Second, 0, nil)
		if first.Outcome != Granted {
			t.Fatalf("acquire: %v", first.Outcome)
		}
		handedOver := make(chanWaiter, 1)
		e.Acquire(ns, []byte("b"), 4, 0, time.Hour, time.Minute, handedOver)
		time.Sleep(10*time.Second - time.Nanosecond)
		synctest.Wait()
		expectResolution(t, handedOver, Result{})
		time.Sleep(time.Nanosecond) // the wait's last instant: the lease ends
		synctest.Wait()
		expectResolution(t, handedOver, Result{Outcome: Granted, Token: first.Token + 1, Waited: 10 * time.Second})

		// Keys without waiters are swept within a SweepInterval of expiring.
		e.Acquire(ns, []byte("c"), 5, 0, time.Second, 0, nil)
		if st := e.Stats(); st.Keys != 3 {
			t.Fatalf("%d keys, want a, b and c", st.Keys)
		}
		time.Sleep(SweepInterval)
		synctest.Wait()
		if st := e.Stats(); st.Keys != 2 {
			t.Fatalf("%d keys after a sweep, want a and b", st.Keys)
		}

		stop()
		<-done
	})
}

// expectResolution checks what c received; a zero want means nothing yet.
func expectResolution(t *testing.T, c chanWaiter, want Result) {
	t.Helper()
	var got Result
	select {
	case got = <-c:
	default:
	}
	if got != want {
		t.Fatalf("resolution %+v, want %+v", got, want)
	}
}

// TestRunStopsWithItsContext runs Run on the real clock: goleak in TestMain
// catches it if it outlives its context.
func TestRunStopsWithItsContext(t *testing.T) {
	e := New(Config{Shards: 2})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		e.Run(ctx)
		close(done)
	}()
	e.Acquire(e.Namespace("t"), []byte("a"), 1, 0, time.Hour, 0, nil)
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
