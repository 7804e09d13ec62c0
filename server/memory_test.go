//go:build !race

// The memory checks run without the race detector (make test runs them
// first): its shadow memory is resident and never returned.

package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// residentBytes is this process's resident set size.
func residentBytes(tb testing.TB) int64 {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		tb.Skipf("no /proc/self/statm: %v", err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

type memSample struct{ rss, heap int64 }

// sampleMemory collects the garbage first, and with release also returns
// the free pages, so that a baseline starts from what is live.
func sampleMemory(tb testing.TB, release bool) memSample {
	runtime.GC()
	if release {
		debug.FreeOSMemory()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{rss: residentBytes(tb), heap: int64(ms.HeapInuse)}
}

// flood is the connections of a flood of requests, every one drained of
// its answers.
type flood struct {
	conns []net.Conn
	wg    sync.WaitGroup
}

// startWaiterFlood queues conns × perConn waiters (wait 60 s) on keys
// held by one more connection.
func startWaiterFlood(tb testing.TB, s *testServer, keys, conns, perConn int) *flood {
	tb.Helper()
	fl := &flood{}
	holder := bufio.NewWriter(fl.dialDrained(tb, s))
	for k := range keys {
		holder.Write(codec.AppendAcquire(nil, uint64(k+1), 120, 0, fmt.Sprint("flood/", k)))
	}
	if err := holder.Flush(); err != nil {
		tb.Fatal(err)
	}
	awaitFlood(tb, "held keys", func() int64 { return int64(s.Engine().Stats().Keys) }, int64(keys))
	for c := range conns {
		w := bufio.NewWriter(fl.dialDrained(tb, s))
		for i := range perConn {
			w.Write(codec.AppendAcquire(nil, uint64(i+1), 30, 60, fmt.Sprint("flood/", (c*perConn+i)%keys)))
		}
		if err := w.Flush(); err != nil {
			tb.Fatal(err)
		}
	}
	awaitFlood(tb, "queued waiters", func() int64 { return int64(s.Engine().Stats().Waiters) }, int64(conns*perConn))
	return fl
}

// dialDrained connects to s and discards everything s answers.
func (fl *flood) dialDrained(tb testing.TB, s *testServer) net.Conn {
	tb.Helper()
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	fl.conns = append(fl.conns, nc)
	fl.wg.Add(1)
	go func() { defer fl.wg.Done(); _, _ = io.Copy(io.Discard, nc) }()
	return nc
}

func (fl *flood) close() {
	for _, nc := range fl.conns {
		nc.Close()
	}
	fl.wg.Wait()
}

// After a flood of queued waiters ends — the waits elapse, the leases
// end, the sweep runs, the connections close — the server gives the
// memory back by itself: its resident set returns within twice the
// start's. The figures per waiter are logged; BenchmarkMemoryPerWaiter
// reports them.
func TestMemoryComesBackAfterAWaiterFlood(t *testing.T) {
	s := startServer(t, nil)
	start := sampleMemory(t, true)
	fl, n := floodAndWait(t, s)
	peak := sampleMemory(t, false)
	t.Logf("per queued waiter: %d B resident, %d B heap", (peak.rss-start.rss)/n, (peak.heap-start.heap)/n)

	s.advance(60 * time.Second) // every wait elapses
	s.advance(60 * time.Second) // every lease ends
	s.Engine().Sweep()
	fl.close()
	waitFor(t, func() bool { return s.metrics.memoryReturns.Load() > 0 })
	end := memSample{rss: residentBytes(t)}
	t.Logf("resident: start %d KiB, peak %d KiB, end %d KiB", start.rss>>10, peak.rss>>10, end.rss>>10)
	if st := s.Engine().Stats(); st.Keys != 0 || st.Waiters != 0 {
		t.Fatalf("after the flood: %+v", st)
	}
	if end.rss > 2*start.rss {
		t.Fatalf("resident set %d KiB after the flood, more than twice the %d KiB before it", end.rss>>10, start.rss>>10)
	}
}

// floodAndWait floods s with waiters and waits until the server has seen
// the peak.
func floodAndWait(tb testing.TB, s *testServer) (*flood, int64) {
	const keys, conns, perConn = 1000, 25, 4000
	fl := startWaiterFlood(tb, s, keys, conns, perConn)
	n := int64(conns * perConn)
	awaitFlood(tb, "items at the peak the server saw", s.itemsPeak.Load, n)
	return fl, n
}

// BenchmarkMemoryPerWaiter reports what a queued waiter costs the server
// process in a 100 000-waiter flood: heap bytes, resident bytes with the
// free pages returned (what the waiters hold), and resident bytes as the
// runtime leaves them (the free pages the flood's growth left included).
func BenchmarkMemoryPerWaiter(b *testing.B) {
	var heap, live, held int64
	for range b.N {
		s := startServer(b, nil)
		start := sampleMemory(b, true)
		fl, n := floodAndWait(b, s)
		peak := sampleMemory(b, false)
		returned := sampleMemory(b, true)
		heap += (peak.heap - start.heap) / n
		held += (peak.rss - start.rss) / n
		live += (returned.rss - start.rss) / n
		fl.close()
		s.Close()
	}
	b.ReportMetric(float64(heap)/float64(b.N), "heap-B/waiter")
	b.ReportMetric(float64(live)/float64(b.N), "rss-B/waiter")
	b.ReportMetric(float64(held)/float64(b.N), "rss-unreturned-B/waiter")
}

// BenchmarkMemoryPerHeldKey reports what a held lock costs the server
// process with 640 000 distinct 16-byte keys held (250 s leases) over four
// sessions, as the Go client takes them: heap bytes, and resident bytes
// with the free pages returned (what the locks hold). The target is 128
// resident bytes per key. The resident set as the runtime leaves it is
// not reported: here it would count the garbage of the benchmark's own
// requests.
func BenchmarkMemoryPerHeldKey(b *testing.B) {
	const keys, conns = 640_000, 4
	var heap, live float64
	for range b.N {
		s := startServer(b, nil)
		start := sampleMemory(b, true)
		fl := &flood{}
		for c := range conns {
			w := bufio.NewWriter(fl.dialDrained(b, s))
			w.Write(codec.AppendSession(nil, 1, [codec.ClientIDLen]byte{byte(c + 1)}))
			for k := c; k < keys; k += conns {
				w.Write(codec.AppendAcquire(nil, uint64(k+1), 250, 0, fmt.Sprintf("held/%011d", k)))
			}
			if err := w.Flush(); err != nil {
				b.Fatal(err)
			}
		}
		awaitFlood(b, "held keys", func() int64 { return int64(s.Engine().Stats().Keys) }, keys)
		held := sampleMemory(b, true)
		heap += float64(held.heap-start.heap) / keys
		live += float64(held.rss-start.rss) / keys
		fl.close()
		s.Close()
	}
	b.ReportMetric(heap/float64(b.N), "heap-B/key")
	b.ReportMetric(live/float64(b.N), "rss-B/key")
}

// awaitFlood waits until count reaches want: a flood takes a while to
// arrive on a loaded machine, so it has 30 s, not the usual I/O timeout.
func awaitFlood(tb testing.TB, what string, count func() int64, want int64) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for count() < want {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %d, want %d", what, count(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
