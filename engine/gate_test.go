package engine

import (
	"fmt"
	"testing"
	"time"
)

// TestAdmissionGateThresholds checks, for every limit up to 300, that the
// gate closes at the first count with count*10 >= limit*9 and reopens at the
// first count with count*4 < limit*3, straight from SPEC §8.
func TestAdmissionGateThresholds(t *testing.T) {
	for limit := 1; limit <= 300; limit++ {
		g := NewAdmissionGate(limit)
		for g.Admit() {
		}
		count := g.Stats().Count
		if count*10 < limit*9 || (count-1)*10 >= limit*9 {
			t.Fatalf("limit %d: closed at count %d", limit, count)
		}
		if st := g.Stats(); st.Open || st.Refused != 1 || st.Limit != limit {
			t.Fatalf("limit %d: stats %+v after closing", limit, st)
		}
		for {
			g.Leave()
			count--
			if g.Stats().Open {
				break
			}
			if g.Admit() {
				t.Fatalf("limit %d: admitted at count %d while closed", limit, count)
			}
		}
		if count*4 >= limit*3 || (count+1)*4 < limit*3 {
			t.Fatalf("limit %d: reopened at count %d", limit, count)
		}
		if !g.Admit() {
			t.Fatalf("limit %d: refused at count %d after reopening", limit, count)
		}
	}
}

func TestAdmissionGateRejectsAZeroLimit(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewAdmissionGate(0) did not panic")
		}
	}()
	NewAdmissionGate(0)
}

// TestKeysGate is the example of the brief: MaxKeys 100 grants 90 keys, is
// Busy for new keys until the live keys drop below 75, and never gates
// releases or acquires of existing keys.
func TestKeysGate(t *testing.T) {
	sc := newScript(t, Config{MaxKeys: 100})
	for i := range 90 {
		lease := 100 * sec
		if i >= 85 {
			lease = 10 * sec // to be swept
		}
		sc.run(acquire(fmt.Sprint("k", i), uint64(i+1), lease, 0, granted(uint64(i+1), 0)))
	}
	sc.run(
		acquire("new", 100, 10*sec, 0, outcome(Busy)),
		// Existing keys pass: no new key is created.
		acquire("k0", 101, 10*sec, 0, outcome(TimedOut)),
		acquire("k0", 102, 100*sec, 30*sec, outcome(Queued)),
		// Keep creates no key, so it passes too.
		keep("k1", 2, 100*sec, renewed(2)),
		release("k0", 1, Released).resolves(res(102, granted(91, 0))),
	)
	assertGate(t, sc.e.Stats().KeysGate, GateStats{Open: false, Limit: 100, Count: 90, Refused: 1})

	// Down to 75 live keys: k1..k10 are released, k85..k89 are swept.
	for i := 1; i <= 10; i++ {
		sc.run(release(fmt.Sprint("k", i), uint64(i+1), Released))
	}
	sc.run(advance(10*sec), sweep(), stats(75, 0))
	sc.run(acquire("new", 103, 10*sec, 0, outcome(Busy)))
	assertGate(t, sc.e.Stats().KeysGate, GateStats{Open: false, Limit: 100, Count: 75, Refused: 2})

	sc.run(release("k11", 12, Released), stats(74, 0))
	assertGate(t, sc.e.Stats().KeysGate, GateStats{Open: true, Limit: 100, Count: 74, Refused: 2})
	sc.run(acquire("new", 104, 10*sec, 0, granted(92, 0)), stats(75, 0))
}

// TestWaitersGate: MaxWaiters 10 closes at 9 queued waiters and reopens
// below 8 (7.5).
func TestWaitersGate(t *testing.T) {
	sc := newScript(t, Config{MaxWaiters: 10})
	sc.run(acquire("a", 1, 10*sec, 0, granted(1, 0)))
	for owner := uint64(2); owner <= 10; owner++ {
		sc.run(acquire("a", owner, 10*sec, 30*sec, outcome(Queued)))
	}
	sc.run(
		acquire("a", 11, 10*sec, 30*sec, outcome(Busy)),
		// Neither a wait-0 attempt nor a free key needs the waiters gate.
		acquire("a", 12, 10*sec, 0, outcome(TimedOut)),
		acquire("b", 13, 10*sec, 30*sec, granted(2, 0)),
		// Keep creates no waiter, so it is answered.
		keep("a", 1, 10*sec, renewed(1)),
		cancel(2, true),
		acquire("a", 14, 10*sec, 30*sec, outcome(Busy)),
		cancel(3, true),
	)
	assertGate(t, sc.e.Stats().WaitersGate, GateStats{Open: true, Limit: 10, Count: 7, Refused: 2})
	sc.run(acquire("a", 15, 10*sec, 30*sec, outcome(Queued)))
}

// TestInflightGate: queued waiters are in flight, so MaxInflight 10 refuses
// every acquire, even of a free key, once 9 wait, until fewer than 8 do.
func TestInflightGate(t *testing.T) {
	sc := newScript(t, Config{MaxInflight: 10})
	sc.run(acquire("a", 1, 10*sec, 0, granted(1, 0)))
	for owner := uint64(2); owner <= 10; owner++ {
		sc.run(acquire("a", owner, 10*sec, 30*sec, outcome(Queued)))
	}
	sc.run(
		acquire("b", 11, 10*sec, 0, outcome(Busy)),
		acquire("a", 12, 10*sec, 0, outcome(Busy)),
		// Keep passes no gate.
		keep("a", 1, 10*sec, renewed(1)),
		// Release passes no gate, and its handoff resolves a waiter.
		release("a", 1, Released).resolves(res(2, granted(2, 0))),
		acquire("b", 13, 10*sec, 0, outcome(Busy)),
		advance(30*sec),
		tick().resolves(
			res(3, outcome(TimedOut)), res(4, outcome(TimedOut)), res(5, outcome(TimedOut)),
			res(6, outcome(TimedOut)), res(7, outcome(TimedOut)), res(8, outcome(TimedOut)),
			res(9, outcome(TimedOut)), res(10, outcome(TimedOut))),
	)
	assertGate(t, sc.e.Stats().InflightGate, GateStats{Open: true, Limit: 10, Count: 0, Refused: 3})
	sc.run(acquire("b", 14, 10*sec, 0, granted(3, 0)))
}

func TestBusyIsCountedPerGate(t *testing.T) {
	sc := newScript(t, Config{MaxKeys: 1, MaxWaiters: 1})
	sc.run(
		acquire("a", 1, 10*sec, 0, granted(1, 0)),
		acquire("b", 2, 10*sec, 0, outcome(Busy)),
		acquire("a", 3, 10*sec, time.Second, outcome(Queued)),
		acquire("a", 4, 10*sec, time.Second, outcome(Busy)),
		acquire("c", 5, 10*sec, 0, outcome(Busy)),
	)
	st := sc.e.Stats()
	if st.KeysGate.Refused != 2 || st.WaitersGate.Refused != 1 || st.InflightGate.Refused != 0 {
		t.Fatalf("refusals keys=%d waiters=%d inflight=%d, want 2, 1, 0",
			st.KeysGate.Refused, st.WaitersGate.Refused, st.InflightGate.Refused)
	}
}

func assertGate(t *testing.T, got, want GateStats) {
	t.Helper()
	if got != want {
		t.Fatalf("gate %+v, want %+v", got, want)
	}
}
