package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/client/lockdtest"
)

// benchTarget starts a server for a benchmark: the real single-mode
// server, or the fake one whose answers are immediate and allocation-free,
// which isolates the client's own cost.
func benchTarget(b testing.TB, real bool) string {
	b.Helper()
	if real {
		return startRealServer(b, nil).Addr()
	}
	locks := &lockdtest.Locks{}
	srv, err := lockdtest.Start(locks.Serve)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	return srv.Addr()
}

func benchClient(b testing.TB, addr string, sessions int) *client.Client {
	b.Helper()
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{addr}, Sessions: sessions})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

var benchOpts = client.AcquireOptions{Lease: 30 * time.Second, MinWorkBudget: client.Budget(time.Second)}

func acquireRelease(c *client.Client, key string) error {
	t, err := c.Acquire(context.Background(), key, benchOpts)
	if err != nil {
		return err
	}
	return c.Release(context.Background(), t)
}

// BenchmarkAcquireRelease measures one Acquire plus one Release; in steady
// state neither allocates (SPEC §6).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, target := range []struct {
		name string
		real bool
	}{{"fake", false}, {"real", true}} {
		b.Run(target.name+"/sequential", func(b *testing.B) {
			c := benchClient(b, benchTarget(b, target.real), 1)
			if err := acquireRelease(c, "bench"); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := acquireRelease(c, "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(target.name+"/parallel", func(b *testing.B) {
			c := benchClient(b, benchTarget(b, target.real), 1)
			var worker atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprintf("bench-%d", worker.Add(1))
				for pb.Next() {
					if err := acquireRelease(c, key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkThroughput256Callers4Sessions runs 256 concurrent callers over
// a pool of 4 sessions and reports acquire+release pairs per second.
func BenchmarkThroughput256Callers4Sessions(b *testing.B) {
	for _, target := range []struct {
		name string
		real bool
	}{{"fake", false}, {"real", true}} {
		b.Run(target.name, func(b *testing.B) {
			c := benchClient(b, benchTarget(b, target.real), 4)
			const callers = 256
			var issued atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			for i := range callers {
				wg.Go(func() {
					key := fmt.Sprintf("tp-%d", i)
					for issued.Add(1) <= int64(b.N) {
						if err := acquireRelease(c, key); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
		})
	}
}

// BenchmarkRenew measures one Renew of a held lock (KEEP and its answer);
// in steady state it allocates nothing, like Acquire and Release.
func BenchmarkRenew(b *testing.B) {
	for _, target := range []struct {
		name string
		real bool
	}{{"fake", false}, {"real", true}} {
		b.Run(target.name, func(b *testing.B) {
			c := benchClient(b, benchTarget(b, target.real), 1)
			tk, err := c.Acquire(context.Background(), "bench-renew", benchOpts)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := tk.Renew(context.Background(), benchOpts.Lease); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
