package server

import (
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

// overloadClient keeps `window` acquires outstanding on one connection,
// releases most grants with their token, and checks that every request is
// answered exactly once, with an answer its op allows.
type overloadClient struct {
	id      int
	nc      net.Conn
	rng     *rand.Rand
	window  int
	rr      *codec.ResponseReader
	out     []byte
	next    uint64
	pending map[uint64]overloadReq
	acqOut  int // acquires outstanding

	acquires, granted, timedOut, busy, releases, released, notHeld int
}

type overloadReq struct {
	release bool
	key     string
}

// maxOverloadAcquires bounds the load by count as well as by time.
const maxOverloadAcquires = 100_000

func (c *overloadClient) key() string {
	if c.rng.IntN(2) == 0 {
		return fmt.Sprint("hot/", c.rng.IntN(16)) // contended: waiters queue
	}
	return fmt.Sprintf("new/%d/%d", c.id, c.next) // a new key each time
}

func (c *overloadClient) send(now bool) error {
	for ; now && c.acqOut < c.window && c.acquires < maxOverloadAcquires; c.acqOut++ {
		c.next++
		k := c.key()
		c.pending[c.next] = overloadReq{key: k}
		c.out = codec.AppendAcquire(c.out, c.next, uint16(1+c.rng.IntN(5)), uint8(1+c.rng.IntN(3)), k)
		c.acquires++
	}
	if len(c.out) == 0 {
		return nil
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
	_, err := c.nc.Write(c.out)
	c.out = c.out[:0]
	return err
}

func (c *overloadClient) recv() (codec.Response, error) {
	var r codec.Response
	_ = c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
	if err := c.rr.Next(&r); err != nil {
		return r, fmt.Errorf("client %d with %d requests unanswered: %w", c.id, len(c.pending), err)
	}
	return r, nil
}

// run offers load until stop closes, then drains every answer.
func (c *overloadClient) run(stop <-chan struct{}) error {
	for {
		offering := true
		select {
		case <-stop:
			offering = false
		default:
		}
		if err := c.send(offering); err != nil {
			return err
		}
		if len(c.pending) == 0 && !offering {
			return nil
		}
		r, err := c.recv()
		if err != nil {
			return err
		}
		req, ok := c.pending[r.Owner]
		if !ok {
			return fmt.Errorf("client %d: answer %q for owner %d, which has no request in flight", c.id, r.Op, r.Owner)
		}
		delete(c.pending, r.Owner)
		if req.release {
			switch r.Op {
			case codec.OpReleased:
				c.released++
			case codec.OpNotHeld:
				c.notHeld++
			default:
				return fmt.Errorf("client %d: release answered %q %v", c.id, r.Op, r.Reason)
			}
			continue
		}
		c.acqOut--
		switch r.Op {
		case codec.OpAcquired:
			c.granted++
			if c.rng.IntN(10) > 0 { // one grant in ten is left to its lease
				c.next++
				c.pending[c.next] = overloadReq{release: true, key: req.key}
				c.out = codec.AppendRelease(c.out, c.next, r.Token, req.key)
				c.releases++
			}
		case codec.OpTimeout:
			c.timedOut++
		case codec.OpBusy:
			c.busy++
		default:
			return fmt.Errorf("client %d: acquire answered %q %v", c.id, r.Op, r.Reason)
		}
	}
}

// TestReliabilityOverload offers 10× the admission limits: 20 connections
// each keep 50 acquires outstanding (1,000 against MaxInflight=100), half on
// 16 contended keys, half on new keys, with 1–3 s waits and 1–5 s leases on
// a fake clock running at 10×. With MaxWaiters=50 the waiters gate binds
// before the in-flight one (in single mode an acquire answered at once
// leaves the in-flight count within the call, so only queued ones stay);
// with MaxWaiters=1000 the in-flight gate binds. MaxKeys=200 in both. The
// server must not crash, never exceed a hard limit, answer every request
// exactly once (B when a gate is closed, and every B explained by a gate),
// never refuse a release, keep memory bounded, and give plain A answers
// again once the load is gone and its counts fall below 75 %.
func TestReliabilityOverload(t *testing.T) {
	for _, lim := range []struct {
		name                             string
		maxInflight, maxWaiters, maxKeys int
	}{
		{"waiters gate binds", 100, 50, 200},
		{"in-flight gate binds", 100, 1000, 200},
	} {
		t.Run(lim.name, func(t *testing.T) {
			runOverload(t, lim.maxInflight, lim.maxWaiters, lim.maxKeys)
		})
	}
}

func runOverload(t *testing.T, maxInflight, maxWaiters, maxKeys int) {
	const conns, window = 20, 50
	duration := 1500 * time.Millisecond
	if testing.Short() {
		duration = 500 * time.Millisecond
	}
	s := startServer(t, func(cfg *Config) {
		cfg.Engine.MaxInflight, cfg.Engine.MaxWaiters, cfg.Engine.MaxKeys = maxInflight, maxWaiters, maxKeys
	})
	e := s.Engine()

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseline := ms.HeapInuse
	peakHeap := baseline

	clients := make([]*overloadClient, conns)
	for i := range clients {
		c := dial(t, s)
		clients[i] = &overloadClient{id: i, nc: c.nc, rng: rand.New(rand.NewPCG(uint64(i), 7)), window: window,
			rr: c.rr, pending: make(map[uint64]overloadReq)}
	}

	// The clock driver: 10 ms of server time per real millisecond, with
	// Tick for waits and lease handoffs and the 5 s sweep on server time.
	// The monitor checks the hard limits while the load runs.
	stopLoad, stopDriver := make(chan struct{}), make(chan struct{})
	var peak struct{ inflight, waiters, keys atomic.Int64 }
	var limitErr atomic.Pointer[error]
	var bg sync.WaitGroup
	bg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		lastSweep := s.clock.Now()
		for n := 0; ; n++ {
			select {
			case <-stopDriver:
				return
			case <-tick.C:
			}
			s.advance(10 * time.Millisecond)
			if s.clock.Now()-lastSweep >= engine.SweepInterval {
				e.Sweep()
				lastSweep = s.clock.Now()
			}
			st := e.Stats()
			for _, m := range []struct {
				name  string
				v     int
				limit int
				peak  *atomic.Int64
			}{{"in-flight", st.Inflight, maxInflight, &peak.inflight}, {"waiters", st.Waiters, maxWaiters, &peak.waiters}, {"keys", st.Keys, maxKeys, &peak.keys}} {
				if m.v > m.limit {
					err := fmt.Errorf("%s %d over the hard limit %d", m.name, m.v, m.limit)
					limitErr.CompareAndSwap(nil, &err)
				}
				if int64(m.v) > m.peak.Load() {
					m.peak.Store(int64(m.v))
				}
			}
			if n%100 == 0 {
				runtime.ReadMemStats(&ms)
				peakHeap = max(peakHeap, ms.HeapInuse)
			}
		}
	})

	start := time.Now()
	errs := make(chan error, conns)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			if err := c.run(stopLoad); err != nil {
				errs <- err
			}
		})
	}
	time.Sleep(duration) // the length of the load, not a deadline to hit
	close(stopLoad)
	wg.Wait()
	drained := time.Since(start)
	close(stopDriver)
	bg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if p := limitErr.Load(); p != nil {
		t.Fatal(*p)
	}

	var total overloadClient
	for _, c := range clients {
		total.acquires += c.acquires
		total.granted += c.granted
		total.timedOut += c.timedOut
		total.busy += c.busy
		total.releases += c.releases
		total.released += c.released
		total.notHeld += c.notHeld
	}
	st := e.Stats()
	refused := st.InflightGate.Refused + st.WaitersGate.Refused + st.KeysGate.Refused
	if total.busy == 0 || uint64(total.busy) != refused || s.metrics.connInflightBusy.Load() != 0 {
		t.Fatalf("%d B answers; the gates refused %d (in-flight %d, waiters %d, keys %d), the per-connection limit %d",
			total.busy, refused, st.InflightGate.Refused, st.WaitersGate.Refused, st.KeysGate.Refused, s.metrics.connInflightBusy.Load())
	}
	if st.Waiters != 0 || st.Inflight != 0 {
		t.Fatalf("after the load: %d waiters, %d in flight", st.Waiters, st.Inflight)
	}

	// The load is gone: let the leases run out and the sweep reclaim the
	// keys, then a normal client is granted at once, every time.
	s.advance(10 * time.Second)
	e.Sweep()
	if st := e.Stats(); !st.InflightGate.Open || !st.WaitersGate.Open || !st.KeysGate.Open || st.Keys != 0 {
		t.Fatalf("gates after the load: %+v", st)
	}
	normal := dial(t, s)
	for i := range 2 * maxKeys { // more keys than the limit, one at a time
		lockCycle(normal, uint64(2*i+1), fmt.Sprint("recovered/", i))
	}
	holder := dial(t, s)
	holder.mustAcquire(1, "recovered/queue")
	admitted := min(maxWaiters, maxInflight) / 2
	for i := range admitted { // waiters below 75 % are all admitted
		normal.acquire(uint64(10_000+i), 30, 60, "recovered/queue")
	}
	normal.expectOpen()
	if st := e.Stats(); st.Waiters != admitted {
		t.Fatalf("%d of %d waiters admitted after the load", st.Waiters, admitted)
	}

	runtime.GC()
	runtime.ReadMemStats(&ms)
	after := ms.HeapInuse
	if growth := int64(after) - int64(baseline); growth > 32<<20 {
		t.Fatalf("heap in use grew by %d MiB over the overload", growth>>20)
	}
	if growth := int64(peakHeap) - int64(baseline); growth > 128<<20 {
		t.Fatalf("heap in use peaked %d MiB above the baseline", growth>>20)
	}
	t.Logf("overload: %d connections × %d outstanding acquires (10× MaxInflight=%d; MaxWaiters=%d, MaxKeys=%d) for %v "+
		"(drained after %v, server clock %v): %d acquires → %d A, %d T, %d B (gates: in-flight %d, waiters %d, keys %d); "+
		"%d releases → %d R, %d N, 0 refused; %d acquires/s answered; peaks in-flight %d, waiters %d, keys %d; "+
		"heap in use +%d KiB at peak, +%d KiB after; then %d lock cycles and %d queued waiters admitted without a B",
		conns, window, maxInflight, maxWaiters, maxKeys, duration, drained.Round(time.Millisecond), s.clock.Now().Round(time.Second),
		total.acquires, total.granted, total.timedOut, total.busy, st.InflightGate.Refused, st.WaitersGate.Refused, st.KeysGate.Refused,
		total.releases, total.released, total.notHeld, int(float64(total.acquires)/drained.Seconds()),
		peak.inflight.Load(), peak.waiters.Load(), peak.keys.Load(),
		(int64(peakHeap)-int64(baseline))>>10, (int64(after)-int64(baseline))>>10, 2*maxKeys, admitted)
}
