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

func sampleMemory(tb testing.TB) memSample {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{rss: residentBytes(tb), heap: int64(ms.HeapInuse)}
}

// waiterFlood queues conns × perConn waiters (wait 60 s) on keys held by
// one more connection, and drains every connection's answers.
type waiterFlood struct {
	conns []net.Conn
	wg    sync.WaitGroup
}

func startWaiterFlood(tb testing.TB, s *testServer, keys, conns, perConn int) *waiterFlood {
	tb.Helper()
	fl := &waiterFlood{}
	dialDrained := func() net.Conn {
		nc, err := net.Dial("tcp", s.Addr())
		if err != nil {
			tb.Fatal(err)
		}
		fl.conns = append(fl.conns, nc)
		fl.wg.Add(1)
		go func() { defer fl.wg.Done(); _, _ = io.Copy(io.Discard, nc) }()
		return nc
	}
	holder := bufio.NewWriter(dialDrained())
	for k := range keys {
		holder.Write(codec.AppendAcquire(nil, uint64(k+1), 120, 0, fmt.Sprint("flood/", k)))
	}
	if err := holder.Flush(); err != nil {
		tb.Fatal(err)
	}
	for c := range conns {
		w := bufio.NewWriter(dialDrained())
		for i := range perConn {
			w.Write(codec.AppendAcquire(nil, uint64(i+1), 30, 60, fmt.Sprint("flood/", (c*perConn+i)%keys)))
		}
		if err := w.Flush(); err != nil {
			tb.Fatal(err)
		}
	}
	want := conns * perConn
	deadline := time.Now().Add(30 * time.Second)
	for s.Engine().Stats().Waiters < want {
		if time.Now().After(deadline) {
			tb.Fatalf("only %d of %d waiters queued", s.Engine().Stats().Waiters, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fl
}

func (fl *waiterFlood) close() {
	for _, nc := range fl.conns {
		nc.Close()
	}
	fl.wg.Wait()
}

// After a flood of queued waiters ends — the waits elapse, the leases
// end, the sweep runs — the server's memory comes back: resident set
// within twice the start's.
func TestMemoryComesBackAfterAWaiterFlood(t *testing.T) {
	s := startServer(t, nil)
	start := sampleMemory(t)
	const keys, conns, perConn = 1000, 25, 4000
	fl := startWaiterFlood(t, s, keys, conns, perConn)
	peak := sampleMemory(t)
	n := int64(conns * perConn)
	t.Logf("per queued waiter: %d B resident, %d B heap", (peak.rss-start.rss)/n, (peak.heap-start.heap)/n)

	s.advance(60 * time.Second) // every wait elapses
	s.advance(60 * time.Second) // every lease ends
	s.Engine().Sweep()
	fl.close()
	deadline := time.Now().Add(30 * time.Second)
	for s.conns.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	end := sampleMemory(t)
	t.Logf("resident: start %d KiB, peak %d KiB, end %d KiB; heap: start %d KiB, peak %d KiB, end %d KiB",
		start.rss>>10, peak.rss>>10, end.rss>>10, start.heap>>10, peak.heap>>10, end.heap>>10)
	if st := s.Engine().Stats(); st.Keys != 0 || st.Waiters != 0 {
		t.Fatalf("after the flood: %+v", st)
	}
	if end.rss > 2*start.rss {
		t.Fatalf("resident set %d KiB after the flood, more than twice the %d KiB before it", end.rss>>10, start.rss>>10)
	}
}
