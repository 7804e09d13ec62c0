package server

// Hostile clients against an in-process server on 127.0.0.1: slowloris,
// connection floods, clients that do not read, seeded garbage streams and
// auth brute force. Each test logs the figures docs/reliability.md quotes.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
)

// fdBudget is how many connections a test may open: each one costs two
// descriptors in this process (client and server side), and the rest of
// the process needs a margin.
func fdBudget(t *testing.T, want int) int {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	n := min(want, (int(lim.Cur)-256)/2)
	if n < 100 {
		t.Skipf("RLIMIT_NOFILE %d leaves room for only %d connections", lim.Cur, n)
	}
	return n
}

// roundTrips times n ping round trips of c; it returns the median and the
// maximum.
func roundTrips(c *testConn, n int, owner uint64) (median, worst time.Duration) {
	c.t.Helper()
	d := make([]time.Duration, n)
	for i := range d {
		start := time.Now()
		c.send(codec.AppendPing(nil, owner))
		c.expect(codec.OpPong, owner)
		d[i] = time.Since(start)
	}
	slices.Sort(d)
	return d[n/2], d[n-1]
}

// lockCycle acquires and releases key on c: the service a user checks.
func lockCycle(c *testConn, owner uint64, key string) {
	c.t.Helper()
	token := c.mustAcquire(owner, key)
	c.send(codec.AppendRelease(nil, owner+1, token, key))
	c.expect(codec.OpReleased, owner+1)
}

// TestReliabilitySlowloris opens up to 2,000 connections that each send a
// few bytes of a frame and stop. While they hang, a normal client is
// served; once the progress timeout passes on the server's clock every one
// of them is answered E bad_request and closed, and nothing else is.
func TestReliabilitySlowloris(t *testing.T) {
	n := fdBudget(t, 2000)
	s := startServer(t, nil)
	normal := dial(t, s)

	partial := codec.AppendAcquire(nil, 1, 30, 5, "slowloris")[:5]
	stalled := make([]*testConn, n)
	start := time.Now()
	for i := range stalled {
		stalled[i] = dial(t, s)
		stalled[i].send(partial)
	}
	waitFor(t, func() bool { return s.stalledCount() == n })
	opened := time.Since(start)

	// The normal client is served while every stalled frame is pending.
	lockCycle(normal, 1, "normal")
	median, worst := roundTrips(normal, 200, 7)

	s.clock.Advance(ProgressTimeout)
	start = time.Now()
	waitFor(t, func() bool { return s.stalledCount() == 0 && s.conns.Load() == 1 })
	cleared := time.Since(start)
	for _, c := range stalled {
		c.expectError(0, codec.BadRequest)
		c.expectClosed()
	}
	if got := s.metrics.progressTimeouts.Load(); got != uint64(n) {
		t.Fatalf("progress timeouts = %d, want %d", got, n)
	}
	lockCycle(normal, 3, "normal")
	t.Logf("slowloris: %d stalled connections opened in %v; normal client served meanwhile "+
		"(ping round trip median %v, max %v over 200); all %d closed with E bad_request %v after the clock passed 5 s "+
		"(scan every %v); lockd_progress_timeouts_total=%d",
		n, opened.Round(time.Millisecond), median.Round(time.Microsecond), worst.Round(time.Microsecond),
		n, cleared.Round(time.Millisecond), progressScanInterval, n)
}

// expectRefused checks that nc is closed without a greeting or any frame.
func expectRefused(nc net.Conn) error {
	_ = nc.SetReadDeadline(time.Now().Add(ioTimeout))
	var b [64]byte
	n, err := nc.Read(b[:])
	if n > 0 {
		return fmt.Errorf("a connection over MaxConns received %q", b[:n])
	}
	if !errors.Is(err, io.EOF) && !isReset(err) {
		return fmt.Errorf("a connection over MaxConns: want a close, got %v", err)
	}
	return nil
}

// TestReliabilityConnectionFlood fills MaxConns, then floods 1,000 more
// connections (fewer under a low RLIMIT_NOFILE) from 4 goroutines, held open until the flood ends. Every
// excess connection is closed before the greeting and counted; the admitted
// clients keep their service; the connection count never leaks, so when
// admitted clients leave, new ones get in, and the limit still holds.
func TestReliabilityConnectionFlood(t *testing.T) {
	const maxConns, workers = 64, 4
	// 250 per goroutine, fewer where RLIMIT_NOFILE is low (one more for
	// the last check).
	perWorker := min(250, (fdBudget(t, maxConns+workers*250+1)-maxConns-1)/workers)
	s := startServer(t, func(cfg *Config) { cfg.MaxConns = maxConns })
	admitted := make([]*testConn, maxConns)
	for i := range admitted {
		admitted[i] = dial(t, s)
	}

	start := time.Now()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var held []net.Conn
			defer func() {
				for _, nc := range held {
					nc.Close()
				}
			}()
			for range perWorker {
				nc, err := net.Dial("tcp", s.Addr())
				if err != nil {
					errs <- fmt.Errorf("dial: %w", err)
					return
				}
				held = append(held, nc)
				if err := expectRefused(nc); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Service continues during the flood.
	for i := range 20 {
		lockCycle(admitted[i%maxConns], uint64(10*i+1), "flood")
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	flooded := time.Since(start)
	flood := workers * perWorker
	if got := s.metrics.connsRejected.Load(); got != uint64(flood) {
		t.Fatalf("rejected %d connections, want %d", got, flood)
	}
	if got := s.conns.Load(); got != maxConns {
		t.Fatalf("connection count %d after the flood, want %d", got, maxConns)
	}

	// Half the admitted clients leave; as many newcomers get in and are
	// served, and the limit still holds one over.
	for _, c := range admitted[:maxConns/2] {
		c.nc.Close()
	}
	waitFor(t, func() bool { return s.conns.Load() == maxConns/2 })
	for i := range maxConns / 2 {
		lockCycle(dial(t, s), uint64(2*i+1), fmt.Sprint("after-flood/", i))
	}
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := expectRefused(nc); err != nil {
		t.Fatal(err)
	}
	lockCycle(admitted[maxConns-1], 1000, "flood")
	t.Logf("connection flood: MaxConns=%d held, %d excess connections from %d goroutines in %v, all closed before the greeting; "+
		"lockd_connections_rejected_total=%d; 20 lock cycles served during the flood; after %d clients left, %d newcomers served and the %d-th refused",
		maxConns, flood, workers, flooded.Round(time.Millisecond), s.metrics.connsRejected.Load(), maxConns/2, maxConns/2, maxConns+1)
}

// TestReliabilityClientThatDoesNotRead pipelines PINGs on a connection
// whose answers are read only as a trickle (2 KiB/ms, far below what it
// asks for), while it also holds a lock and waits for another. The server
// drops it once its outbound buffer passes MaxOutbound, counts it, keeps
// its lock, drops its waiter, and serves a normal client throughout. Heap
// growth stays bounded.
func TestReliabilityClientThatDoesNotRead(t *testing.T) {
	const maxOutbound = 256 << 10
	const writeLimit = 256 << 20 // the test gives up if no drop by then
	// A fixed receive buffer stops autotuning from hiding megabytes in the
	// kernel. Not much smaller: with a few KiB and loopback's 64 KiB
	// segments, the client drops every segment the server sends once its
	// buffer is full, window updates included, and stalls its own writes
	// for seconds (seen with 4 KiB: server Recv-Q 0, client rwnd-limited).
	const clientRcvBuf = 128 << 10
	s := startServer(t, func(cfg *Config) { cfg.MaxOutbound = maxOutbound })
	normal := dial(t, s)
	normalToken := normal.mustAcquire(1, "held-by-normal")

	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, clientRcvBuf)
		})
		return errors.Join(err, serr)
	}}
	nc, err := d.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	slow := newTestConn(t, nc)
	slow.greeting = slow.recv()
	slowToken := slow.mustAcquire(1, "held-by-slow")
	slow.acquire(2, 30, 60, "held-by-normal") // queued behind normal
	normal.expectOpen()
	waitFor(t, func() bool { return s.Engine().Stats().Waiters == 1 })

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseline, peak := ms.HeapInuse, ms.HeapInuse

	var chunk []byte
	for i := range 1000 {
		chunk = codec.AppendPing(chunk, uint64(1000+i))
	}
	// The client reads a trickle, 2 KiB per millisecond, far below what
	// it asks for. A client that reads nothing at all would test the same
	// server code, but on loopback its full receive buffer can drop the
	// server's window updates and stall its own writes for seconds.
	stopTrickle := make(chan struct{})
	trickled := make(chan int)
	go func() {
		buf, total := make([]byte, 2048), 0
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopTrickle:
				trickled <- total
				return
			case <-tick.C:
			}
			_ = nc.SetReadDeadline(time.Now().Add(time.Millisecond))
			n, _ := nc.Read(buf)
			total += n
		}
	}()
	sent, served := 0, 0
	var werr error
	start := time.Now()
	for sent < writeLimit {
		_ = nc.SetWriteDeadline(time.Now().Add(ioTimeout))
		var n int
		n, werr = nc.Write(chunk)
		sent += n
		if werr != nil {
			break
		}
		if sent%(1<<20) < len(chunk) {
			normal.expectOpen()
			served++
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
	}
	close(stopTrickle)
	read := <-trickled
	if werr == nil {
		t.Fatalf("wrote %d MiB without being dropped", sent>>20)
	}
	if isTimeout(werr) {
		t.Fatalf("writes stalled for %v after %d bytes and the client was not dropped (dropped %d): %v",
			ioTimeout, sent, s.metrics.slowDropped.Load(), werr)
	}
	waitFor(t, func() bool { return s.metrics.slowDropped.Load() == 1 })
	dropped := time.Since(start)
	waitFor(t, func() bool { st := s.Engine().Stats(); return st.Waiters == 0 && st.Inflight == 0 })

	// The slow client's lock outlives it; normal's lock was never touched.
	normal.acquire(10, 30, 0, "held-by-slow")
	normal.expect(codec.OpTimeout, 10)
	normal.send(codec.AppendRelease(nil, 11, slowToken, "held-by-slow"))
	normal.expect(codec.OpReleased, 11)
	normal.send(codec.AppendRelease(nil, 12, normalToken, "held-by-normal"))
	normal.expect(codec.OpReleased, 12)
	lockCycle(normal, 20, "after-slow")

	if growth := int64(peak) - int64(baseline); growth > 64<<20 {
		t.Fatalf("heap grew by %d MiB while a client did not read", growth>>20)
	}
	t.Logf("client that does not read: MaxOutbound=%d KiB, receive buffer %d KiB; dropped after %.1f MiB of PINGs written (%d KiB of answers read) in %v "+
		"(the rest sits in kernel socket buffers); lockd_slow_clients_dropped_total=%d; heap peak +%d KiB over baseline; "+
		"normal client answered %d times meanwhile; its queued waiter dropped, its lock kept and released by token afterwards",
		maxOutbound>>10, clientRcvBuf>>10, float64(sent)/(1<<20), read>>10, dropped.Round(time.Millisecond), s.metrics.slowDropped.Load(),
		(int64(peak)-int64(baseline))>>10, served)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// garbageStream makes one hostile byte stream. Kinds: 0 random bytes; 1
// valid frames with random byte mutations, cuts and insertions; 2 frames
// with sound boundaries but random (often invalid) fields and no HELLO,
// returned with the exact answers expected (wait 0 only, so every frame is
// answered at once and in order).
func garbageStream(rng *rand.Rand, kind, id int) (stream []byte, want []codec.Response) {
	// Kind 2 keys have a prefix the other kinds cannot make by chance, so
	// its locks are its own and its answers predictable.
	prefix := fmt.Sprintf("g%d/", id)
	if kind == 2 {
		prefix = fmt.Sprintf("exact-stream-%d/", id)
	}
	key := func() string {
		switch rng.IntN(10) {
		case 0:
			return ""
		case 1:
			return "sp ace"
		case 2:
			return "\xff\xfe"
		case 3:
			return string(bytes.Repeat([]byte{'k'}, 129))
		case 4:
			return prefix + "é\r"
		}
		return fmt.Sprint(prefix, rng.IntN(4))
	}
	switch kind {
	case 0:
		stream = make([]byte, 1+rng.IntN(600))
		for i := range stream {
			stream[i] = byte(rng.Uint32())
			if rng.IntN(8) == 0 {
				stream[i] = '\n'
			}
		}
		return stream, nil
	case 1:
		for range 1 + rng.IntN(12) {
			switch rng.IntN(4) {
			case 0:
				stream = codec.AppendAcquire(stream, rng.Uint64N(4), uint16(rng.IntN(4000)), uint8(rng.IntN(3)), key())
			case 1:
				stream = codec.AppendRelease(stream, rng.Uint64N(4), rng.Uint64N(8), key())
			case 2:
				stream = codec.AppendPing(stream, rng.Uint64N(4))
			case 3:
				var nonce [codec.NonceLen]byte
				var mac [codec.MACLen]byte
				stream = codec.AppendHello(stream, nonce, mac, "default")
			}
		}
		for range 1 + rng.IntN(4) {
			if len(stream) == 0 {
				break
			}
			i := rng.IntN(len(stream))
			switch rng.IntN(3) {
			case 0:
				stream[i] = byte(rng.Uint32())
			case 1:
				stream = slices.Insert(stream, i, bytes.Repeat([]byte{byte(rng.Uint32())}, 1+rng.IntN(200))...)
			case 2:
				stream = stream[:i]
			}
		}
		if len(stream) == 0 {
			stream = append(stream, 'A')
		}
		return stream, nil
	}
	held := map[string]bool{}
	n := uint64(1 + rng.IntN(40))
	for owner := uint64(1); owner <= n; owner++ {
		o := owner
		if rng.IntN(12) == 0 {
			o = 0
		}
		k := key()
		var w codec.Response
		switch rng.IntN(3) {
		case 0:
			lease := uint16(1 + rng.IntN(3600))
			if rng.IntN(8) == 0 {
				lease = []uint16{0, 3601, 65535}[rng.IntN(3)]
			}
			stream = codec.AppendAcquire(stream, o, lease, 0, k)
			switch {
			case o == 0:
				w = codec.Response{Op: codec.OpError, Reason: codec.BadOwner}
			case !codec.ValidKey([]byte(k)):
				w = codec.Response{Op: codec.OpError, Owner: o, Reason: codec.BadKey}
			case lease == 0 || lease > codec.MaxLeaseSeconds:
				w = codec.Response{Op: codec.OpError, Owner: o, Reason: codec.BadLease}
			case held[k]:
				w = codec.Response{Op: codec.OpTimeout, Owner: o}
			default:
				held[k] = true
				w = codec.Response{Op: codec.OpAcquired, Owner: o}
			}
		case 1:
			// A token no grant can have: 2^63 and up.
			stream = codec.AppendRelease(stream, o, 1<<63|rng.Uint64(), k)
			switch {
			case o == 0:
				w = codec.Response{Op: codec.OpError, Reason: codec.BadOwner}
			case !codec.ValidKey([]byte(k)):
				w = codec.Response{Op: codec.OpError, Owner: o, Reason: codec.BadKey}
			default:
				w = codec.Response{Op: codec.OpNotHeld, Owner: o}
			}
		default:
			stream = codec.AppendPing(stream, o)
			if o == 0 {
				w = codec.Response{Op: codec.OpError, Reason: codec.BadOwner}
			} else {
				w = codec.Response{Op: codec.OpPong, Owner: o}
			}
		}
		want = append(want, w)
	}
	return stream, want
}

// TestReliabilityGarbageStreams sends 600 seeded hostile streams (random
// bytes, mutated frames, random fields) each on its own connection, then
// half-closes. The server answers only well-formed frames; nothing follows
// a connection-closing E but the close (a grant that arrives meanwhile is
// released by the server, never written after the E); streams with sound frame boundaries are answered exactly,
// frame by frame; the server never leaks a connection, waiter or in-flight
// acquire, and keeps serving.
func TestReliabilityGarbageStreams(t *testing.T) {
	const streams = 600
	seed := *garbageSeed
	rng := rand.New(rand.NewPCG(seed, seed))
	s := startServer(t, nil)
	probe := dial(t, s)
	var sentBytes, frames, closingErrors, fieldErrors int
	start := time.Now()
	for i := range streams {
		kind := i % 3
		stream, want := garbageStream(rng, kind, i)
		sentBytes += len(stream)
		c := dial(t, s)
		_ = c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := c.nc.Write(stream); err == nil {
			_ = c.nc.(*net.TCPConn).CloseWrite()
		}
		var got []codec.Response
		for {
			r, err := c.read()
			if err != nil {
				if !errors.Is(err, io.EOF) && !isReset(err) {
					t.Fatalf("stream %d (seed %d, kind %d) %x: after %d frames: %v", i, seed, kind, stream, len(got), err)
				}
				break
			}
			got = append(got, r)
		}
		frames += len(got)
		closed := false
		for j, r := range got {
			switch {
			case closed:
				t.Fatalf("stream %d (kind %d) %x: frame %d %q after a closing E", i, kind, stream, j, r.Op)
			case r.Op == codec.OpError && r.Reason.ClosesConnection():
				closed = true
				closingErrors++
			case r.Op == codec.OpError:
				fieldErrors++
			}
		}
		if kind == 2 {
			if err := matchAnswers(got, want); err != nil {
				t.Fatalf("stream %d (kind 2) %x: %v", i, stream, err)
			}
		}
		c.nc.Close()
	}
	elapsed := time.Since(start)
	waitFor(t, func() bool {
		st := s.Engine().Stats()
		return s.conns.Load() == 1 && st.Waiters == 0 && st.Inflight == 0
	})
	lockCycle(probe, 1, "after-garbage")
	t.Logf("garbage streams: %d streams (seed %d; random bytes, mutated frames, random fields), %d KiB in %v; "+
		"%d well-formed answers, %d connection-closing E, %d field-error E; no leaked connection, waiter or in-flight acquire",
		streams, seed, sentBytes>>10, elapsed.Round(time.Millisecond), frames, closingErrors, fieldErrors)
}

var garbageSeed = flag.Uint64("garbage.seed", 6, "seed of TestReliabilityGarbageStreams")

// matchAnswers compares the answers to a stream of sound frames with the
// expected ones, in order (tokens are not predicted).
func matchAnswers(got, want []codec.Response) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d answers, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Op != w.Op || g.Owner != w.Owner || g.Reason != w.Reason {
			return fmt.Errorf("answer %d: %q owner %d %v, want %q owner %d %v", i, g.Op, g.Owner, g.Reason, w.Op, w.Owner, w.Reason)
		}
	}
	return nil
}

// TestReliabilityAuthBruteForce makes 900 failing handshakes, each on a
// fresh connection, in interleaved blocks of a wrong MAC for a real tenant,
// an unknown tenant and a replayed HELLO, while an authenticated client
// keeps working. Every one is answered E auth_failed, closed and counted.
// A wrong tenant and a wrong MAC must cost the server the same work: the
// allocations of the whole process per attempt are compared (one
// HMAC-SHA256 allocates about 11 objects, so a path that skipped it would
// show ~11 fewer per attempt; the bound is half an HMAC), and the answer
// times are compared with a generous bound, never a tight threshold.
func TestReliabilityAuthBruteForce(t *testing.T) {
	secret := []byte("correct horse battery staple")
	wrong := []byte("correct horse battery stable")
	s := startServer(t, func(cfg *Config) {
		cfg.Auth = map[string][]byte{"alpha": secret, "beta": []byte("another secret")}
	})
	legit := dial(t, s)
	if r := legit.hello("alpha", secret); r.Op != codec.OpWelcome {
		t.Fatalf("legitimate HELLO: %q %v", r.Op, r.Reason)
	}
	var replay []byte
	{
		first := dial(t, s)
		var nonce [codec.NonceLen]byte
		replay = codec.AppendHello(nil, nonce, codec.ClientMAC(secret, first.greeting.ServerNonce, nonce, []byte("alpha")), "alpha")
		first.send(replay)
		first.expect(codec.OpWelcome, 0)
		first.nc.Close()
	}
	waitFor(t, func() bool { return s.conns.Load() == 1 })
	hmacAllocs := testing.AllocsPerRun(100, func() {
		codec.ClientMAC(secret, [codec.NonceLen]byte{}, [codec.NonceLen]byte{}, []byte("alpha"))
	})

	// attempt makes one failing handshake and returns its answer time.
	attempt := func(kind int) time.Duration {
		c := dial(t, s)
		var nonce [codec.NonceLen]byte
		frame := replay
		switch kind {
		case 0: // a guessed secret for a real tenant
			frame = codec.AppendHello(nil, nonce, codec.ClientMAC(wrong, c.greeting.ServerNonce, nonce, []byte("alpha")), "alpha")
		case 1: // the right secret for a tenant that does not exist
			frame = codec.AppendHello(nil, nonce, codec.ClientMAC(secret, c.greeting.ServerNonce, nonce, []byte("gamma")), "gamma")
		case 2: // a HELLO captured from another connection
			codec.ClientMAC(secret, c.greeting.ServerNonce, nonce, []byte("alpha")) // same client-side work
		}
		t0 := time.Now()
		c.send(frame)
		c.expectError(0, codec.AuthFailed)
		d := time.Since(t0)
		c.expectClosed()
		c.nc.Close()
		return d
	}
	const rounds, block = 10, 30
	var times [3][]time.Duration
	var mallocs [3]uint64
	var ms runtime.MemStats
	start := time.Now()
	for round := range rounds {
		for j := range 3 {
			kind := (round + j) % 3 // rotate which kind goes first
			runtime.ReadMemStats(&ms)
			before := ms.Mallocs
			for range block {
				times[kind] = append(times[kind], attempt(kind))
			}
			runtime.ReadMemStats(&ms)
			mallocs[kind] += ms.Mallocs - before
		}
		lockCycle(legit, uint64(10*round+1), "brute")
		waitFor(t, func() bool { return s.conns.Load() == 1 })
	}
	elapsed := time.Since(start)
	const perKind = rounds * block
	if got := s.metrics.authFailures.Load(); got != 3*perKind {
		t.Fatalf("lockd_auth_failures_total = %d, want %d", got, 3*perKind)
	}
	lockCycle(legit, 1<<40, "brute")

	var med [3]time.Duration
	var perAttempt [3]float64
	for k := range 3 {
		slices.Sort(times[k])
		med[k] = times[k][perKind/2]
		perAttempt[k] = float64(mallocs[k]) / perKind
	}
	ratio := float64(med[1]) / float64(med[0])
	t.Logf("auth brute force: %d failed handshakes (wrong MAC, unknown tenant, replayed HELLO; %d each, interleaved blocks of %d) in %v, "+
		"all E auth_failed + close; lockd_auth_failures_total=%d; legitimate client served throughout; "+
		"allocations per attempt (whole process): wrong MAC %.1f, unknown tenant %.1f, replay %.1f (one HMAC = %v); "+
		"answer time median: wrong MAC %v, unknown tenant %v, replay %v (tenant/MAC ratio %.2f)",
		3*perKind, perKind, block, elapsed.Round(time.Millisecond), s.metrics.authFailures.Load(),
		perAttempt[0], perAttempt[1], perAttempt[2], hmacAllocs,
		med[0].Round(time.Microsecond), med[1].Round(time.Microsecond), med[2].Round(time.Microsecond), ratio)
	if d := perAttempt[1] - perAttempt[0]; d < -hmacAllocs/2 || d > hmacAllocs/2 {
		t.Fatalf("an unknown tenant costs %.1f allocations per attempt, a wrong MAC %.1f: the paths do different work",
			perAttempt[1], perAttempt[0])
	}
	if ratio < 1/3.0 || ratio > 3 {
		t.Fatalf("median answer time: unknown tenant %v, wrong MAC %v: one path is much cheaper", med[1], med[0])
	}
}

// TestReliabilityIdleConnectionsBeforeHello: with auth required, a peer
// without credentials could open MaxConns connections and never send a
// byte. No frame has started, so without more the progress timeout would
// never apply; the server therefore runs the handshake clock
// (HandshakeTimeout) from the greeting until WELCOME, and such
// connections hold the handshake budget only (docs/operations.md).
func TestReliabilityIdleConnectionsBeforeHello(t *testing.T) {
	const maxConns, handshakes = 20, 5
	secret := []byte("s3cret")
	s := startServer(t, func(cfg *Config) {
		cfg.MaxConns, cfg.MaxHandshakes = maxConns, handshakes
		cfg.Auth = map[string][]byte{"alpha": secret}
	})
	idle := make([]*testConn, handshakes)
	for i := range idle {
		idle[i] = dial(t, s) // greeted, then silent
	}
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := expectRefused(nc); err != nil {
		t.Fatal(err)
	}
	s.clock.Advance(HandshakeTimeout)
	for _, c := range idle {
		c.expectError(0, codec.AuthRequired)
		c.expectClosed()
	}
	waitFor(t, func() bool { return s.conns.Load() == 0 })
	legit := dial(t, s)
	if r := legit.hello("alpha", secret); r.Op != codec.OpWelcome {
		t.Fatalf("legitimate HELLO: %q %v", r.Op, r.Reason)
	}
	// Once authenticated, an idle connection is left alone.
	s.clock.Advance(2 * ProgressTimeout)
	legit.expectOpen()
}

// TestReliabilityWeakSecretsRefused: failed handshakes are cheap to
// repeat, so a short secret falls to online guessing (a 1-byte secret in
// at most 256 handshakes). The auth file refuses secrets under 16 bytes.
func TestReliabilityWeakSecretsRefused(t *testing.T) {
	if _, err := ParseAuth(strings.NewReader("alpha:a7\n")); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("a 1-byte secret must be refused: %v", err)
	}
	if _, err := ParseAuth(strings.NewReader("alpha:" + strings.Repeat("ab", 15) + "\n")); err == nil {
		t.Fatal("a 15-byte secret must be refused")
	}
	auth, err := ParseAuth(strings.NewReader("# team\n\nalpha:" + strings.Repeat("ab", 16) + "\n"))
	if err != nil || len(auth.Secrets["alpha"]) != 16 {
		t.Fatalf("a 16-byte secret must be accepted: %v", err)
	}
}
