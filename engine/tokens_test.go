package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

// memMark is a HighWaterMark in memory. It outlives the engines a test
// starts on it, as a data dir outlives its processes.
type memMark struct {
	mu   sync.Mutex
	mark uint64
	// fail, while set, is what Reserve returns.
	fail error
	// hold, while set, makes Reserve wait for a value from it and return
	// that instead of recording at once.
	hold chan error
	// attempts, when set, gets every mark Reserve is asked for.
	attempts chan uint64
	calls    int
}

func (m *memMark) Reserved() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mark
}

func (m *memMark) Reserve(mark uint64) error {
	m.mu.Lock()
	m.calls++
	fail, hold, attempts := m.fail, m.hold, m.attempts
	m.mu.Unlock()
	if attempts != nil {
		attempts <- mark
	}
	if hold != nil {
		fail = <-hold
	}
	if fail != nil {
		return fail
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if mark <= m.mark {
		return errors.New("memMark: mark not above the recorded one")
	}
	m.mark = mark
	return nil
}

func (m *memMark) set(f func(m *memMark)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

func (m *memMark) reserveCalls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// runEngine runs e.Run until the test ends.
func runEngine(t *testing.T, e *Engine) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// cycle acquires key with no wait and, when granted, releases it.
func cycle(t *testing.T, e *Engine, ns Namespace, key string) Result {
	t.Helper()
	r, _ := e.Acquire(ns, []byte(key), 1, 0, time.Minute, 0, nil)
	if r.Outcome == Granted {
		if rr := e.Release(ns, []byte(key), r.Token); rr.Outcome != Released {
			t.Fatalf("release of token %d: %v", r.Token, rr.Outcome)
		}
	}
	return r
}

// Single mode's contract (SPEC §4): a token is issued only below a mark
// that is already recorded, and nothing is issued before the first one.
func TestTokensStayBelowTheRecordedMark(t *testing.T) {
	m := &memMark{}
	e := New(Config{Clock: NewFakeClock(), HighWater: m, TokenBlock: 8})
	ns := e.Namespace("t")
	if r := cycle(t, e, ns, "k"); r.Outcome != Busy {
		t.Fatalf("before any reservation: %+v, want Busy", r)
	}
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	want := uint64(1)
	for range 3 {
		for range 8 {
			r := cycle(t, e, ns, "k")
			if r.Outcome != Granted || r.Token != want || r.Token >= m.Reserved() {
				t.Fatalf("got %+v under the recorded mark %d, want token %d", r, m.Reserved(), want)
			}
			want++
		}
		if r := cycle(t, e, ns, "k"); r.Outcome != Busy {
			t.Fatalf("past the recorded mark %d: %+v, want Busy", m.Reserved(), r)
		}
		if err := e.ReserveTokens(); err != nil {
			t.Fatal(err)
		}
	}
	if st := e.Stats(); st.TokenMark != m.Reserved() || st.TokenMark != 33 || st.TokensUnreserved != 4 || st.LastToken != 24 {
		t.Fatalf("stats %+v, recorded mark %d", st, m.Reserved())
	}
	// With more than half a block left there is nothing to reserve.
	calls := m.reserveCalls()
	if err := e.ReserveTokens(); err != nil || m.reserveCalls() != calls {
		t.Fatalf("ReserveTokens with a full block left: %v, %d Reserve calls, want %d", err, m.reserveCalls(), calls)
	}
}

// A crash loses everything but the recorded mark; the next engine starts
// at it, above every token the crashed one issued, on every key.
func TestRestartStartsAboveEveryIssuedToken(t *testing.T) {
	m := &memMark{}
	keys := make([]string, 200) // spread over many shards
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	var highest uint64
	for restart := range 3 {
		e := New(Config{Clock: NewFakeClock(), HighWater: m, TokenBlock: 64})
		if err := e.ReserveTokens(); err != nil {
			t.Fatal(err)
		}
		ns := e.Namespace("t")
		for i, key := range keys {
			for range i % 7 {
				r := cycle(t, e, ns, key)
				if r.Outcome != Granted || r.Token <= highest {
					t.Fatalf("restart %d, %s: %+v, want a token above %d", restart, key, r, highest)
				}
				if err := e.ReserveTokens(); err != nil {
					t.Fatal(err)
				}
			}
		}
		// The old engine is dropped with locks held, as by kill -9.
		for _, key := range keys {
			r, _ := e.Acquire(ns, []byte(key), 1, 0, time.Hour, 0, nil)
			if r.Outcome != Granted || r.Token <= highest {
				t.Fatalf("restart %d, %s: %+v, want a token above %d", restart, key, r, highest)
			}
		}
		highest = e.Stats().LastToken
		if highest >= m.Reserved() {
			t.Fatalf("token %d issued at or above the recorded mark %d", highest, m.Reserved())
		}
	}
}

func TestFirstTokenBelowTheRecordedMarkStartsAtTheMark(t *testing.T) {
	for _, tc := range []struct{ first, mark, want uint64 }{
		{first: 5, mark: 100, want: 100},
		{first: 0, mark: 100, want: 100},
		{first: 500, mark: 100, want: 500},
		{first: 7, mark: 0, want: 7},
	} {
		m := &memMark{mark: tc.mark}
		e := New(Config{Clock: NewFakeClock(), HighWater: m, TokenBlock: 16, FirstToken: tc.first})
		if err := e.ReserveTokens(); err != nil {
			t.Fatal(err)
		}
		if r := cycle(t, e, e.Namespace("t"), "k"); r.Outcome != Granted || r.Token != tc.want || m.Reserved() != tc.want+16 {
			t.Errorf("first %d, mark %d: %+v, recorded %d; want token %d, mark %d", tc.first, tc.mark, r, m.Reserved(), tc.want, tc.want+16)
		}
	}
}

// The mark never wraps: at the end of the range the answer is
// TokenExhausted, not Busy, and the mark's own value is never issued.
func TestRecordedMarkEndsTheTokenRange(t *testing.T) {
	m := &memMark{mark: math.MaxUint64 - 3}
	e := New(Config{Clock: NewFakeClock(), HighWater: m, TokenBlock: 8, Shards: 1})
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	if m.Reserved() != math.MaxUint64 {
		t.Fatalf("recorded %d, want the end of the range", m.Reserved())
	}
	ns := e.Namespace("t")
	for want := uint64(math.MaxUint64 - 3); want < math.MaxUint64; want++ {
		if r := cycle(t, e, ns, "k"); r.Outcome != Granted || r.Token != want {
			t.Fatalf("got %+v, want token %d", r, want)
		}
	}
	if r := cycle(t, e, ns, "k"); r.Outcome != TokenExhausted {
		t.Fatalf("at the end of the range: %+v", r)
	}
	if err := e.ReserveTokens(); err != nil || m.reserveCalls() != 1 {
		t.Fatalf("nothing is left to reserve: %v, %d Reserve calls", err, m.reserveCalls())
	}
}

func TestFailedReservationIssuesNothingNew(t *testing.T) {
	errDisk := errors.New("disk on fire")
	m := &memMark{fail: errDisk}
	e := New(Config{Clock: NewFakeClock(), HighWater: m, TokenBlock: 8})
	if err := e.ReserveTokens(); !errors.Is(err, errDisk) {
		t.Fatalf("ReserveTokens: %v, want the mark's error", err)
	}
	ns := e.Namespace("t")
	if r := cycle(t, e, ns, "k"); r.Outcome != Busy {
		t.Fatalf("with nothing recorded: %+v, want Busy", r)
	}
	if st := e.Stats(); st.TokenReserveFailures != 1 || st.TokenMark != 0 || st.TokensUnreserved != 1 {
		t.Fatalf("stats %+v", st)
	}
	m.set(func(m *memMark) { m.fail = nil })
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	if r := cycle(t, e, ns, "k"); r.Outcome != Granted || r.Token != 1 {
		t.Fatalf("after the disk recovered: %+v", r)
	}
}

// Run records the next block in the background once a grant is half a
// block from the limit, so a steady stream of grants never runs out.
func TestRunReservesAheadOfTheGrants(t *testing.T) {
	m := &memMark{}
	e := New(Config{HighWater: m, TokenBlock: 8, Shards: 1})
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	attempts := make(chan uint64, 16)
	m.set(func(m *memMark) { m.attempts = attempts })
	runEngine(t, e)
	ns := e.Namespace("t")
	for want := uint64(1); want <= 16; want++ {
		if r := cycle(t, e, ns, "k"); r.Outcome != Granted || r.Token != want {
			t.Fatalf("got %+v, want token %d", r, want)
		}
		if want == 4 { // half of the first block is left: 5..8
			if got := <-attempts; got != 17 {
				t.Fatalf("Run reserved up to %d, want 17", got)
			}
			// Once the mark is recorded, ReserveTokens has published it.
			if err := e.ReserveTokens(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := e.Stats(); st.TokensUnreserved != 0 || st.TokenMark < 17 {
		t.Fatalf("stats %+v", st)
	}
}

// When grants outrun the disk, the acquires past the reserved tokens are
// answered Busy — a fresh acquire and a waiter the lock is handed to
// alike — until the mark is recorded; no token past it is ever issued.
func TestGrantsOutrunningTheDiskAreAnsweredBusy(t *testing.T) {
	m := &memMark{}
	clock := NewFakeClock()
	e := New(Config{Clock: clock, HighWater: m, TokenBlock: 4, Shards: 1})
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	hold, attempts := make(chan error), make(chan uint64, 1)
	m.set(func(m *memMark) { m.hold, m.attempts = hold, attempts })
	runEngine(t, e)
	ns := e.Namespace("t")
	for want := uint64(1); want <= 3; want++ {
		if r := cycle(t, e, ns, "k"); r.Outcome != Granted || r.Token != want {
			t.Fatalf("got %+v, want token %d", r, want)
		}
	}
	if got := <-attempts; got != 9 {
		t.Fatalf("Run is reserving up to %d, want 9", got)
	}
	held, _ := e.Acquire(ns, []byte("k"), 1, 0, time.Minute, 0, nil)
	if held.Outcome != Granted || held.Token != 4 {
		t.Fatalf("the last reserved token: %+v", held)
	}
	var rc recorder
	if r, w := e.Acquire(ns, []byte("k"), 2, 0, time.Minute, time.Minute, &rc); r.Outcome != Queued || w == nil {
		t.Fatalf("waiter: %+v", r)
	}
	if r := cycle(t, e, ns, "other"); r.Outcome != Busy {
		t.Fatalf("a new key past the reserved tokens: %+v, want Busy", r)
	}
	if r := e.Release(ns, []byte("k"), held.Token); r.Outcome != Released {
		t.Fatalf("release: %+v", r)
	}
	if got := rc.take(); len(got) != 1 || got[0].owner != 2 || got[0].r.Outcome != Busy {
		t.Fatalf("the waiter was resolved with %+v, want Busy", got)
	}
	if st := e.Stats(); st.TokensUnreserved != 2 || st.LastToken != 4 || st.Keys != 0 || st.Inflight != 0 {
		t.Fatalf("stats %+v", st)
	}

	m.set(func(m *memMark) { m.hold, m.attempts = nil, nil })
	hold <- nil
	if err := e.ReserveTokens(); err != nil { // waits for Run's reservation
		t.Fatal(err)
	}
	if r := cycle(t, e, ns, "k"); r.Outcome != Granted || r.Token != 5 {
		t.Fatalf("after the mark was recorded: %+v, want token 5", r)
	}
}

// A mark that cannot be recorded is retried after reserveRetry, not at
// every acquire that finds the tokens gone: a failing disk is not hammered.
func TestRunRetriesAFailedReservationAfterAPause(t *testing.T) {
	m := &memMark{}
	e := New(Config{HighWater: m, TokenBlock: 4, Shards: 1})
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	attempts := make(chan uint64, 1)
	m.set(func(m *memMark) { m.fail, m.attempts = errors.New("no space left"), attempts })
	runEngine(t, e)
	ns := e.Namespace("t")
	for range 4 {
		if r := cycle(t, e, ns, "k"); r.Outcome != Granted {
			t.Fatalf("got %+v", r)
		}
	}
	<-attempts // fails
	m.set(func(m *memMark) { m.fail = nil })
	for range 100 {
		if r := cycle(t, e, ns, "k"); r.Outcome != Busy {
			t.Fatalf("past the reserved tokens: %+v, want Busy", r)
		}
	}
	<-attempts // the retry, which succeeds
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	if calls := m.reserveCalls(); calls != 3 {
		t.Fatalf("%d Reserve calls, want 3: the first block, the failure and one retry", calls)
	}
	if r := cycle(t, e, ns, "k"); r.Outcome != Granted || r.Token != 5 {
		t.Fatalf("after the retry: %+v", r)
	}
	if st := e.Stats(); st.TokenReserveFailures != 1 || st.TokensUnreserved != 100 {
		t.Fatalf("stats %+v", st)
	}
}
