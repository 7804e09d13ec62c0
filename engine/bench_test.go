package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/engine/tokenfile"
)

// benchKey writes a 16-byte key for i into buf.
func benchKey(buf *[16]byte, i uint64) []byte {
	copy(buf[:8], "lockkey-")
	binary.BigEndian.PutUint64(buf[8:], i)
	return buf[:]
}

// benchRequester tags the hot path's acquires as a session's (SPEC §6a),
// as the official clients' are.
var benchRequester = NewSessionKey([16]byte{'b', 'e', 'n', 'c', 'h'}).Requester(1)

func acquireRelease(tb testing.TB, e *Engine, ns Namespace, key []byte) {
	r, _ := e.Acquire(ns, key, 1, benchRequester, time.Minute, 0, nil)
	if r.Outcome != Granted {
		tb.Fatalf("acquire: %v", r.Outcome)
	}
	if rr := e.Release(ns, key, r.Token); rr.Outcome != Released {
		tb.Fatalf("release: %v", rr.Outcome)
	}
}

// BenchmarkAcquireReleaseExistingKey is the hot path of SPEC §6: a key that
// was used before is acquired and released without allocating. The
// data-dir variants run single mode's default: tokens reserved through a
// token mark file, recorded by Run in the background.
func BenchmarkAcquireReleaseExistingKey(b *testing.B) {
	for _, dataDir := range []bool{false, true} {
		suffix := ""
		if dataDir {
			suffix = "-data-dir"
		}
		b.Run("sequential"+suffix, func(b *testing.B) {
			e := benchEngine(b, dataDir)
			ns := e.Namespace("bench")
			var buf [16]byte
			key := benchKey(&buf, 0)
			acquireRelease(b, e, ns, key)
			b.ReportAllocs()
			for b.Loop() {
				acquireRelease(b, e, ns, key)
			}
		})
		b.Run("parallel"+suffix, func(b *testing.B) {
			e := benchEngine(b, dataDir)
			ns := e.Namespace("bench")
			var goroutines atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var buf [16]byte
				key := benchKey(&buf, goroutines.Add(1))
				for pb.Next() {
					acquireRelease(b, e, ns, key)
				}
			})
		})
	}
}

// benchEngine is a default engine, on a token mark in a temporary data
// dir when dataDir is set, with Run recording the mark until b ends.
func benchEngine(b *testing.B, dataDir bool) *Engine {
	if !dataDir {
		return New(Config{})
	}
	mark, err := tokenfile.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	e := New(Config{HighWater: mark})
	if err := e.ReserveTokens(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
		mark.Close()
	})
	return e
}

// BenchmarkAcquireReleaseManyKeys is lockbench's uncontended workload on
// the engine alone: each cycle takes and gives back a key drawn from a
// million, so most keys are new to the table or long retired.
func BenchmarkAcquireReleaseManyKeys(b *testing.B) {
	const keySpace = 1_000_000
	e := New(Config{})
	ns := e.Namespace("bench")
	var buf [16]byte
	var i uint64
	b.ReportAllocs()
	for b.Loop() {
		// A multiplicative step visits the key space in a scattered order.
		i = (i + 0x9E3779B97F4A7C15) % keySpace
		acquireRelease(b, e, ns, benchKey(&buf, i))
	}
}

// BenchmarkMemory reports the heap cost of a held lock (16-byte keys, no
// waiters) and of a queued waiter (100 per key), from runtime.MemStats over
// 100k of each.
func BenchmarkMemory(b *testing.B) {
	const locks, waiters, waitersPerKey = 100_000, 100_000, 100
	var perLock, perWaiter float64
	for b.Loop() {
		e := New(Config{})
		ns := e.Namespace("bench")
		var buf [16]byte

		before := heapAlloc()
		for i := range uint64(locks) {
			if r, _ := e.Acquire(ns, benchKey(&buf, i), i+1, 0, time.Hour, 0, nil); r.Outcome != Granted {
				b.Fatalf("acquire: %v", r.Outcome)
			}
		}
		held := heapAlloc()
		for i := range uint64(waiters) {
			key := benchKey(&buf, i/waitersPerKey)
			if r, _ := e.Acquire(ns, key, locks+i+1, 0, time.Hour, time.Minute, nopWaiter{}); r.Outcome != Queued {
				b.Fatalf("acquire: %v", r.Outcome)
			}
		}
		queued := heapAlloc()
		runtime.KeepAlive(e)

		perLock = float64(held-before) / locks
		perWaiter = float64(queued-held) / waiters
	}
	b.ReportMetric(perLock, "B/lock")
	b.ReportMetric(perWaiter, "B/waiter")
}

type nopWaiter struct{}

func (nopWaiter) Resolve(uint64, Result) {}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkTombstoneMemory reports the heap cost of a §6a tombstone, with
// a 16-byte and a 128-byte key, over a tenant's full bound.
func BenchmarkTombstoneMemory(b *testing.B) {
	for _, keyLen := range []int{16, 128} {
		b.Run(fmt.Sprint("key=", keyLen), func(b *testing.B) {
			var perTombstone float64
			key := make([]byte, keyLen)
			for b.Loop() {
				ts := NewTombstones[Namespace](0)
				before := heapAlloc()
				for i := range uint64(DefaultTombstonesPerTenant) {
					binary.BigEndian.PutUint64(key, i)
					ts.Lay(1, Requester(i+1), key, 0)
				}
				perTombstone = float64(heapAlloc()-before) / DefaultTombstonesPerTenant
				runtime.KeepAlive(ts)
			}
			b.ReportMetric(perTombstone, "B/tombstone")
		})
	}
}
