package cluster

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// BenchmarkClusterLockCycles measures acquire+release cycles over the wire
// against a 3-node cluster in this process (on-disk LogDB, fsync on), with
// 64 connections spread over the 3 nodes, each cycling its own key. It
// reports cycles/s, the p99 of one cycle, and how many commands one Raft
// proposal carried (group commit).
func BenchmarkClusterLockCycles(b *testing.B) {
	for _, conns := range []int{1, 64, 256} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) { benchCycles(b, conns) })
	}
}

func benchCycles(b *testing.B, conns int) {
	tc := newTestCluster(b, 3, func(c *Config) {
		c.Groups = DefaultGroups
		if v, err := strconv.Atoi(os.Getenv("LOCKD_BENCH_GROUPS")); err == nil {
			c.Groups = v
		}
		if v, err := strconv.Atoi(os.Getenv("LOCKD_BENCH_EXEC_SHARDS")); err == nil {
			c.ExecShards = uint64(v)
		}
		if v, err := strconv.Atoi(os.Getenv("LOCKD_BENCH_RTT_MS")); err == nil {
			c.RTT = time.Duration(v) * time.Millisecond
			c.ElectionRTT = uint64(200 / v)
		}
		if v, err := strconv.Atoi(os.Getenv("LOCKD_BENCH_LOGDB_SHARDS")); err == nil {
			c.LogDBShards = uint64(v)
		}
	})
	var srvs []string
	for _, n := range tc.nodes {
		s, err := startServer(n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		srvs = append(srvs, s.Addr())
	}
	ws := make([]*wire, conns)
	for i := range ws {
		w, err := dialWire(srvs[i%3])
		if err != nil {
			b.Fatal(err)
		}
		defer w.close()
		ws[i] = w
	}
	var before [3]ClusterStats
	for i, n := range tc.nodes {
		before[i] = n.ClusterStats()
	}
	var next atomic.Int64
	lat := make([][]time.Duration, conns)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("bench/%d", i)
			owner := uint64(0)
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				owner++
				if err := w.send(codec.AppendAcquire(nil, owner, 30, 0, key)); err != nil {
					failed.Store(err)
					return
				}
				r, err := w.read(10 * time.Second)
				if err != nil || r.Op != codec.OpAcquired {
					failed.Store(fmt.Errorf("acquire: %q %v %v", r.Op, r.Reason, err))
					return
				}
				owner++
				if err := w.send(codec.AppendRelease(nil, owner, r.Token, key)); err != nil {
					failed.Store(err)
					return
				}
				if r, err := w.read(10 * time.Second); err != nil || r.Op != codec.OpReleased {
					failed.Store(fmt.Errorf("release: %q %v %v", r.Op, r.Reason, err))
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	var props, cmds, retries uint64
	for i, n := range tc.nodes {
		s := n.ClusterStats()
		props += s.Proposals - before[i].Proposals
		cmds += s.Commands - before[i].Commands
		retries += s.ProposeRetries - before[i].ProposeRetries
	}
	b.ReportMetric(float64(retries), "retries")
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "cycles/s")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99_ms")
	}
	if props > 0 {
		b.ReportMetric(float64(cmds)/float64(props), "cmds/proposal")
	}
}
