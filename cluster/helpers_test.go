package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/loopback"
	"github.com/lockd/lockd/internal/poll"
	"github.com/rs/zerolog"
)

// freePorts reserves n loopback ports by listening and closing, for
// lockd processes, which cannot take a listener over: a port may be taken
// in between, and the process then fails to start (the test fails, it
// never talks to a stranger). In-process nodes take loopback.Listeners.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i, l := range loopback.Listeners(t, n) {
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	return ports
}

func testLogger() zerolog.Logger {
	if os.Getenv("LOCKD_TEST_LOG") != "" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	}
	return zerolog.New(os.Stderr).Level(zerolog.Disabled)
}

// testCluster is n Nodes in this process on loopback.
type testCluster struct {
	t     testing.TB
	cfgs  []Config
	nodes []*Node // nil while stopped
}

func newTestCluster(t testing.TB, n int, tweak func(*Config)) *testCluster {
	t.Helper()
	listeners := loopback.Listeners(t, n)
	peers := make(map[uint64]string)
	for i, l := range listeners {
		peers[uint64(i+1)] = l.Addr().String()
	}
	tc := &testCluster{t: t, nodes: make([]*Node, n)}
	for i := range n {
		cfg := Config{
			NodeID:         uint64(i + 1),
			Peers:          peers,
			RaftListener:   listeners[i],
			DataDir:        t.TempDir(),
			Groups:         4,
			RTT:            10 * time.Millisecond,
			ElectionRTT:    20,
			ProposeTimeout: 3 * time.Second,
			Logger:         testLogger(),
		}
		if tweak != nil {
			tweak(&cfg)
		}
		tc.cfgs = append(tc.cfgs, cfg)
	}
	// Start them together: each NodeHost waits for its peers.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); tc.nodes[i], errs[i] = Start(tc.cfgs[i]) }()
	}
	wg.Wait()
	t.Cleanup(tc.closeAll)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	tc.waitReady()
	return tc
}

func (tc *testCluster) closeAll() {
	for i, n := range tc.nodes {
		if n != nil {
			n.Close()
			tc.nodes[i] = nil
		}
	}
}

func (tc *testCluster) waitReady() {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range tc.nodes {
		if n != nil {
			if err := n.WaitReady(ctx); err != nil {
				tc.t.Fatal(err)
			}
		}
	}
}

// stop closes node id (1-based), like a crash that loses nothing fsynced.
func (tc *testCluster) stop(id uint64) {
	tc.nodes[id-1].Close()
	tc.nodes[id-1] = nil
}

// restart starts node id again on its data dir, listening on its Raft
// address again (the first run closed its listener).
func (tc *testCluster) restart(id uint64) *Node {
	tc.t.Helper()
	tc.cfgs[id-1].RaftListener = nil
	n, err := Start(tc.cfgs[id-1])
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.nodes[id-1] = n
	return n
}

func (tc *testCluster) node(id uint64) *Node { return tc.nodes[id-1] }

// leaderOf finds the leader of key's group as seen by a live node.
func (tc *testCluster) leaderOf(key string) uint64 {
	tc.t.Helper()
	var leader uint64
	waitUntil(tc.t, 20*time.Second, fmt.Sprintf("a live leader for %q", key), func() bool {
		for _, n := range tc.nodes {
			if n == nil {
				continue
			}
			if l := n.Leader(n.GroupOf("default", []byte(key))); l != 0 && tc.nodes[l-1] != nil {
				leader = l
				return true
			}
		}
		return false
	})
	return leader
}

// fakeClock is a monotonic clock (Config.Clock) that moves only when a
// test advances it; the nodes of a test cluster may share one.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Duration { return time.Duration(c.ns.Load()) }

// advance moves the clock on by d and wakes every node's housekeeping
// and request timers, which would otherwise look at it again only at
// their next real-time wake-up.
func (tc *testCluster) advance(c *fakeClock, d time.Duration) {
	c.ns.Add(int64(d))
	for _, n := range tc.nodes {
		if n != nil {
			n.wakeHousekeeping()
			n.wakeTimers()
		}
	}
}

// outcome is one resolution seen by a recorder.
type outcome struct {
	owner uint64
	r     engine.Result
	at    time.Time
}

// recorder is an engine.Waiter that records every resolution.
type recorder struct {
	mu  sync.Mutex
	got map[uint64]outcome
	ch  chan outcome
}

func newRecorder() *recorder {
	return &recorder{got: make(map[uint64]outcome), ch: make(chan outcome, 1024)}
}

func (r *recorder) Resolve(owner uint64, res engine.Result) {
	o := outcome{owner: owner, r: res, at: time.Now()}
	r.mu.Lock()
	if _, dup := r.got[owner]; dup {
		r.mu.Unlock()
		panic(fmt.Sprintf("owner %d resolved twice", owner))
	}
	r.got[owner] = o
	r.mu.Unlock()
	r.ch <- o
}

// wait blocks for owner's resolution.
func (r *recorder) wait(t testing.TB, owner uint64, within time.Duration) engine.Result {
	t.Helper()
	var got engine.Result
	waitUntil(t, within, fmt.Sprintf("owner %d's resolution", owner), func() bool {
		var ok bool
		got, ok = r.peek(owner)
		return ok
	})
	return got
}

func (r *recorder) peek(owner uint64) (engine.Result, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.got[owner]
	return o.r, ok
}

// acquire runs an acquire on n through the Backend and returns its
// outcome.
func acquire(t testing.TB, n *Node, rec *recorder, owner uint64, key string, lease, wait time.Duration) engine.Result {
	t.Helper()
	startAcquire(t, n, rec, owner, key, lease, wait)
	return rec.wait(t, owner, wait+10*time.Second)
}

func startAcquire(t testing.TB, n *Node, rec *recorder, owner uint64, key string, lease, wait time.Duration) engine.Handle {
	t.Helper()
	r, h := n.Acquire(n.Namespace("default"), []byte(key), owner, 0, lease, wait, rec)
	if r.Outcome != engine.Queued {
		rec.Resolve(owner, r)
	}
	n.Flush()
	return h
}

func release(t testing.TB, n *Node, rec *recorder, owner uint64, key string, token uint64) engine.Result {
	t.Helper()
	r := n.Release(n.Namespace("default"), []byte(key), owner, token, rec)
	if r.Outcome != engine.Queued {
		return r
	}
	n.Flush()
	return rec.wait(t, owner, 10*time.Second)
}

// queueLen is node's view of how many waiters key's replicated queue holds.
func queueLen(n *Node, key string) int {
	f := n.groups[n.GroupOf("default", []byte(key))].fsm.Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.state.locks[lockKey([]byte("default"), []byte(key))]; l != nil {
		return len(l.queue)
	}
	return 0
}

// waitUntil polls cond until it holds, failing the test after within.
func waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll.Until(within, 5*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waitFor is waitUntil at the multi-process tests' pace: each look at a
// process costs it a request.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll.Until(within, 50*time.Millisecond, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}

// isQueued reports whether the request behind h is queued in its group.
func isQueued(n *Node, h engine.Handle) bool {
	p := h.(*pending)
	n.regMu.Lock()
	defer n.regMu.Unlock()
	return p.queued && !p.done
}
