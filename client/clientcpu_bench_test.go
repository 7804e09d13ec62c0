//go:build linux

package client_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/codec"
)

// rusageThread is Linux's RUSAGE_THREAD: the calling thread's usage.
const rusageThread = 1

func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// replayServer is the server side of a socket pair that costs as little as
// a server can: it answers every ACQUIRE with ACQUIRED and every RELEASE
// with RELEASED from precomputed frames, copying in only the request's
// owner, one write per read. It runs on its own OS thread with blocking
// system calls, so that its CPU time is that thread's and the rest of the
// process's is the client's.
type replayServer struct {
	fd   int
	cpu  time.Duration // the server thread's CPU time, once done is closed
	done chan struct{}
}

// startReplayServer returns the client's end of a connected socket pair
// and the server serving the other end until the client closes it.
func startReplayServer(tb testing.TB) (net.Conn, *replayServer) {
	tb.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "lockd-client")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	srv := &replayServer{fd: fds[1], done: make(chan struct{})}
	go srv.serve()
	return conn, srv
}

func (srv *replayServer) serve() {
	runtime.LockOSThread()
	defer close(srv.done)
	defer syscall.Close(srv.fd)
	start := cpuTime(rusageThread)
	defer func() { srv.cpu = cpuTime(rusageThread) - start }()

	acquired := codec.AppendAcquired(nil, 0, 1, 0)
	released := codec.AppendOwnerOnly(nil, codec.OpReleased, 0)
	out := codec.AppendGreeting(make([]byte, 0, 64<<10), 0, [codec.NonceLen]byte{}, "replay")
	in := make([]byte, 64<<10)
	held := 0
	for {
		if len(out) > 0 {
			if _, err := syscall.Write(srv.fd, out); err != nil {
				return
			}
			out = out[:0]
		}
		n, err := syscall.Read(srv.fd, in[held:])
		if n <= 0 || err != nil {
			return
		}
		held += n
		next := 0
		for {
			frame := in[next:held]
			lf := bytes.IndexByte(frame[min(len(frame), 9):], '\n')
			if len(frame) < 9 || lf < 0 {
				break
			}
			answer := released
			if frame[0] == codec.OpAcquire {
				answer = acquired
			}
			out = append(out, answer...)
			copy(out[len(out)-len(answer)+1:], frame[1:9])
			next += 9 + lf + 1
		}
		held = copy(in, in[next:held])
	}
}

// dialReplay dials a client of sessions sessions, each over its own
// socket pair to a replay server.
func dialReplay(b *testing.B, sessions int) (*client.Client, []*replayServer) {
	b.Helper()
	var servers []*replayServer
	c, err := client.Dial(context.Background(), client.Config{
		Addrs:      []string{"replay:1"},
		Sessions:   sessions,
		WaitSpares: -1,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			conn, srv := startReplayServer(b)
			servers = append(servers, srv)
			return conn, nil
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	return c, servers
}

// BenchmarkClientCPU measures what the client alone spends per lock cycle
// (Acquire with Wait 0 plus Release), against servers that answer over a
// real socket pair at almost no cost: the process's CPU time minus the
// server threads', per cycle (client-ns/cycle), beside the servers' own
// (server-ns/cycle). Client setup and close are counted too, which only
// overstates the client's share.
//
// ctx=shared runs every call under one cancellable context, as a load
// generator's run or a service's base context does; ctx=background under
// one that never ends.
func BenchmarkClientCPU(b *testing.B) {
	shared, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, run := range []struct {
		callers int
		ctxName string
		ctx     context.Context
	}{
		{1, "background", context.Background()},
		{64, "shared", shared},
		{256, "background", context.Background()},
		{256, "shared", shared},
	} {
		callers, ctx := run.callers, run.ctx
		b.Run(fmt.Sprintf("callers=%d/ctx=%s", callers, run.ctxName), func(b *testing.B) {
			before := cpuTime(syscall.RUSAGE_SELF)
			c, servers := dialReplay(b, 1)
			var worker atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			if callers == 1 {
				for b.Loop() {
					if err := acquireReleaseCtx(ctx, c, "cpu"); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) {
					k := fmt.Sprintf("cpu-%d", worker.Add(1))
					for pb.Next() {
						if err := acquireReleaseCtx(ctx, c, k); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.StopTimer()
			c.Close()
			var serverCPU time.Duration
			for _, srv := range servers {
				<-srv.done
				serverCPU += srv.cpu
			}
			total := cpuTime(syscall.RUSAGE_SELF) - before
			b.ReportMetric(float64((total-serverCPU).Nanoseconds())/float64(b.N), "client-ns/cycle")
			b.ReportMetric(float64(serverCPU.Nanoseconds())/float64(b.N), "server-ns/cycle")
		})
	}
}

func acquireReleaseCtx(ctx context.Context, c *client.Client, key string) error {
	t, err := c.Acquire(ctx, key, benchOpts)
	if err != nil {
		return err
	}
	return c.Release(ctx, t)
}
