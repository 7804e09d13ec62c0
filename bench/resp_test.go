package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAppendCommand(t *testing.T) {
	got := appendCommand(nil, []byte("SET"), []byte("k"), []byte("v1"), cmdNX, cmdPX, []byte("30000"))
	want := "*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n"
	if string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := appendCommand(nil, []byte{}); string(got) != "*1\r\n$0\r\n\r\n" {
		t.Fatalf("empty argument: %q", got)
	}
}

func TestReadReply(t *testing.T) {
	for _, tc := range []struct {
		in      string
		kind    byte
		integer int64
		text    string
		err     bool
	}{
		{in: "+OK\r\n", kind: replySimple, text: "OK"},
		{in: "-NOSCRIPT No matching script\r\n", kind: replyError, text: "NOSCRIPT No matching script"},
		{in: ":1\r\n", kind: replyInteger, integer: 1},
		{in: ":-3\r\n", kind: replyInteger, integer: -3},
		{in: "$-1\r\n", kind: replyNull},
		{in: "$0\r\n\r\n", kind: replyBulk, text: ""},
		{in: "$6\r\nab\r\ncd\r\n", kind: replyBulk, text: "ab\r\ncd"}, // binary-safe
		{in: "*1\r\n:1\r\n", err: true},                               // arrays are not needed
		{in: "+OK\n", err: true},                                      // no CR
		{in: ":x\r\n", err: true},
		{in: "$5\r\nab\r\n", err: true}, // cut short
		{in: "$-2\r\n", err: true},
	} {
		var r respReply
		err := readReply(bufio.NewReader(strings.NewReader(tc.in)), &r)
		if tc.err {
			if err == nil {
				t.Errorf("%q: want an error, got %+v", tc.in, r)
			}
			continue
		}
		if err != nil || r.kind != tc.kind || r.integer != tc.integer || string(r.text) != tc.text {
			t.Errorf("%q: got %q %d %q %v, want %q %d %q", tc.in, r.kind, r.integer, r.text, err, tc.kind, tc.integer, tc.text)
		}
	}
}

func TestCallQueueKeepsOrderAcrossGrowth(t *testing.T) {
	var q callQueue
	calls := make([]*respCall, 200)
	next := 0
	for i := range calls {
		calls[i] = &respCall{}
		q.push(calls[i])
		if i%3 == 2 { // interleave pops so the ring wraps before it grows
			if got := q.pop(); got != calls[next] {
				t.Fatalf("pop %d returned the wrong call", next)
			}
			next++
		}
	}
	for ; next < len(calls); next++ {
		if got := q.pop(); got != calls[next] {
			t.Fatalf("pop %d returned the wrong call", next)
		}
	}
	if q.pop() != nil || q.peek() != nil {
		t.Fatal("an empty queue returned a call")
	}
}

// fakeRedis is a scripted Redis: it parses commands as RESP arrays of bulk
// strings and keeps SET NX / EVALSHA semantics in a map, so the Redis
// target's encoding, decoding and pipelining can be checked without a
// server. noScript makes the next EVALSHA answer NOSCRIPT.
type fakeRedis struct {
	ln       net.Listener
	wg       sync.WaitGroup
	mu       sync.Mutex
	values   map[string]string
	commands []string
	noScript bool
	conns    []net.Conn
}

const fakeSHA = "0123456789abcdef0123456789abcdef01234567"

func startFakeRedis(t *testing.T) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{ln: ln, values: make(map[string]string)}
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			f.wg.Go(func() { f.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakeRedis) addr() string { return f.ln.Addr().String() }

func (f *fakeRedis) serve(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		if _, err := io.WriteString(c, f.answer(args)); err != nil {
			return
		}
	}
}

func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSuffix(line[1:], "\r\n"))
	if err != nil || line[0] != '*' {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	args := make([]string, n)
	for i := range args {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSuffix(line[1:], "\r\n"))
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

func (f *fakeRedis) answer(args []string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commands = append(f.commands, strings.Join(args, " "))
	switch {
	case len(args) == 3 && args[0] == "SCRIPT" && args[1] == "LOAD" && args[2] == releaseScript:
		return "$40\r\n" + fakeSHA + "\r\n"
	case len(args) == 6 && args[0] == "SET" && args[3] == "NX" && args[4] == "PX":
		if _, held := f.values[args[1]]; held {
			return "$-1\r\n"
		}
		f.values[args[1]] = args[2]
		return "+OK\r\n"
	case len(args) == 5 && args[0] == "EVALSHA" && args[2] == "1":
		if f.noScript || args[1] != fakeSHA {
			f.noScript = false
			return "-NOSCRIPT No matching script. Please use EVAL.\r\n"
		}
		if f.values[args[3]] != args[4] {
			return ":0\r\n"
		}
		delete(f.values, args[3])
		return ":1\r\n"
	}
	return "-ERR unknown command\r\n"
}

func (f *fakeRedis) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.commands...)
}

func openFakeRedisTarget(t *testing.T, f *fakeRedis, conns int) *redisTarget {
	t.Helper()
	target, err := openRedis(context.Background(), f.addr(), TargetOptions{Conns: conns, Lease: 30 * time.Second, RedisRetry: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	return target
}

func TestRedisLockCycle(t *testing.T) {
	f := startFakeRedis(t)
	target := openFakeRedisTarget(t, f, 1)
	ctx := context.Background()
	a, _ := target.NewCaller(ctx, 0)
	b, _ := target.NewCaller(ctx, 1)

	expect := func(what string, got Outcome, err error, want Outcome) {
		t.Helper()
		if got != want || err != nil {
			t.Fatalf("%s: %v %v, want %v", what, got, err, want)
		}
	}
	out, err := a.Acquire(ctx, "k", 0)
	expect("first acquire", out, err, Acquired)
	out, err = b.Acquire(ctx, "k", 0)
	expect("acquire of a held key without waiting", out, err, TimedOut)
	start := time.Now()
	out, err = b.Acquire(ctx, "k", 30*time.Millisecond)
	expect("acquire of a held key with a wait", out, err, TimedOut)
	if waited := time.Since(start); waited < 30*time.Millisecond {
		t.Fatalf("a waiting acquire gave up after %v", waited)
	}
	out, err = a.Release(ctx)
	expect("release", out, err, Released)
	out, err = a.Release(ctx)
	expect("second release", out, err, NotHeld)

	// The server lost its scripts: the release loads it again and retries.
	out, err = b.Acquire(ctx, "k", 0)
	expect("acquire after the release", out, err, Acquired)
	f.mu.Lock()
	f.noScript = true
	f.mu.Unlock()
	out, err = b.Release(ctx)
	expect("release after NOSCRIPT", out, err, Released)

	log := f.log()
	if !slices.Contains(log, "SET k 0-1 NX PX 30000") || !slices.Contains(log, "EVALSHA "+fakeSHA+" 1 k 0-1") {
		t.Fatalf("unexpected commands: %q", log)
	}
	if n := countPrefix(log, "SCRIPT LOAD"); n != 2 {
		t.Fatalf("SCRIPT LOAD sent %d times, want 2 (start, NOSCRIPT)", n)
	}
}

func countPrefix(log []string, prefix string) int {
	n := 0
	for _, l := range log {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// Many callers pipelining on one connection each get their own reply:
// every lock is taken by exactly one of the callers that raced for it.
func TestRedisPipelinedCallersGetTheirOwnReplies(t *testing.T) {
	f := startFakeRedis(t)
	target := openFakeRedisTarget(t, f, 2)
	ctx := context.Background()
	const callers, keys, rounds = 16, 4, 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	acquired := 0
	for i := range callers {
		c, _ := target.NewCaller(ctx, i)
		wg.Go(func() {
			for r := range rounds {
				key := "k" + strconv.Itoa((i+r)%keys)
				out, err := c.Acquire(ctx, key, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if out != Acquired {
					continue
				}
				mu.Lock()
				acquired++
				mu.Unlock()
				if out, err := c.Release(ctx); out != Released || err != nil {
					t.Errorf("release of a held %s: %v %v", key, out, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if acquired == 0 {
		t.Fatal("no caller ever acquired")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.values) != 0 {
		t.Fatalf("locks left behind: %v", f.values)
	}
}

func TestRedisConnectionLossFailsCalls(t *testing.T) {
	f := startFakeRedis(t)
	target := openFakeRedisTarget(t, f, 1)
	ctx := context.Background()
	c, _ := target.NewCaller(ctx, 0)
	f.mu.Lock()
	for _, conn := range f.conns {
		conn.Close()
	}
	f.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		out, err := c.Acquire(ctx, "k", 0)
		if out == Failed && err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("calls on a lost connection did not fail")
}
