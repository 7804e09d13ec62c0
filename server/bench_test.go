package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/testcerts"
	"github.com/rs/zerolog"
)

// benchShapes are the loads of the server benchmarks: conns connections
// each pipeline depth acquires of distinct keys in one write, read the
// grants, then release them all in one write.
var benchShapes = []struct{ conns, depth int }{
	{4, 1}, {4, 32}, {16, 1}, {16, 32}, {64, 1}, {64, 32},
}

// BenchmarkServerLockCycles measures whole-server throughput over
// loopback, with the single-mode engine. One op is one lock cycle
// (acquire + release).
func BenchmarkServerLockCycles(b *testing.B) {
	for _, shape := range benchShapes {
		b.Run(fmt.Sprintf("conns=%d/depth=%d", shape.conns, shape.depth), func(b *testing.B) {
			benchCycles(b, shape.conns, shape.depth, Config{Engine: engine.Config{}}, nil)
		})
	}
}

// BenchmarkServerLockCyclesNoEngine runs BenchmarkServerLockCycles's load
// against a server whose backend grants every acquire and releases every
// release without an engine: what is left is the I/O path's own cost
// (gnet, framing, sessions). Its cycles/s beside the other benchmark's,
// shape by shape in one `go test -bench ServerLockCycles` run, is the
// engine's share: engine ÷ no engine.
func BenchmarkServerLockCyclesNoEngine(b *testing.B) {
	for _, shape := range benchShapes {
		b.Run(fmt.Sprintf("conns=%d/depth=%d", shape.conns, shape.depth), func(b *testing.B) {
			benchCycles(b, shape.conns, shape.depth, Config{Backend: new(grantingBackend)}, nil)
		})
	}
}

// BenchmarkServerLockCyclesTLS runs BenchmarkServerLockCycles's load over
// the TLS port (TLS 1.3, P-256 certificate, no client certificate). Its
// cycles/s beside the other benchmark's, shape by shape in one run, is
// what TLS and the TLS port's goroutines cost: TLS ÷ plain.
func BenchmarkServerLockCyclesTLS(b *testing.B) {
	ca := testcerts.NewCA(b, "lockd bench CA")
	serverTLS := &tls.Config{Certificates: []tls.Certificate{ca.Issue(b, "server", "127.0.0.1")}}
	clientTLS := &tls.Config{RootCAs: ca.Pool()}
	for _, shape := range benchShapes {
		b.Run(fmt.Sprintf("conns=%d/depth=%d", shape.conns, shape.depth), func(b *testing.B) {
			benchCycles(b, shape.conns, shape.depth, Config{Engine: engine.Config{}, TLS: serverTLS}, clientTLS)
		})
	}
}

// grantingBackend is a Backend with no lock table: every acquire is
// granted at once with the next token, every release is released. It
// keeps nothing per key, so it allocates nothing.
type grantingBackend struct{ tokens atomic.Uint64 }

func (*grantingBackend) Namespace(string) engine.Namespace { return 0 }

func (g *grantingBackend) Acquire(engine.Namespace, []byte, uint64, engine.Requester, time.Duration, time.Duration, engine.Waiter) (engine.Result, engine.Handle) {
	return engine.Result{Outcome: engine.Granted, Token: g.tokens.Add(1)}, nil
}

func (*grantingBackend) Release(engine.Namespace, []byte, uint64, uint64, engine.Waiter) engine.Result {
	return engine.Result{Outcome: engine.Released}
}

func (*grantingBackend) Keep(_ engine.Namespace, _ []byte, _, token uint64, _ time.Duration, _ engine.Waiter) engine.Result {
	return engine.Result{Outcome: engine.Renewed, Token: token}
}

func (*grantingBackend) Abandon(engine.Namespace, []byte, uint64, engine.Requester, engine.Waiter) engine.Result {
	return engine.Result{Outcome: engine.NotHeld}
}

func (*grantingBackend) ServesAbandon() bool                      { return false }
func (*grantingBackend) AsyncAnswers() bool                       { return false }
func (*grantingBackend) ReleaseUndelivered(engine.Handle, uint64) {}
func (*grantingBackend) Cancel(engine.Handle)                     {}
func (*grantingBackend) Flush()                                   {}
func (*grantingBackend) Stats() engine.Stats                      { return engine.Stats{} }
func (*grantingBackend) Shutdown()                                {}
func (*grantingBackend) Run(ctx context.Context)                  { <-ctx.Done() }

// benchCycles drives cfg's server with conns connections, each with depth
// lock cycles pipelined; with clientTLS, over the TLS port (cfg.TLS).
func benchCycles(b *testing.B, conns, depth int, cfg Config, clientTLS *tls.Config) {
	cfg.Listen, cfg.Logger = "127.0.0.1:0", zerolog.Nop()
	if clientTLS != nil {
		cfg.TLSListen = "127.0.0.1:0"
	}
	s, err := Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	clients := make([]*benchConn, conns)
	for i := range clients {
		var nc net.Conn
		if clientTLS != nil {
			nc, err = tls.Dial("tcp", s.TLSAddr(), clientTLS)
		} else {
			nc, err = net.Dial("tcp", s.Addr())
		}
		if err != nil {
			b.Fatal(err)
		}
		clients[i] = newBenchConn(b, nc, i, depth)
	}
	perConn := b.N/(conns*depth) + 1
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perConn {
				if err := c.cycle(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	total := perConn * conns * depth
	b.ReportMetric(float64(total)/elapsed.Seconds(), "cycles/s")
	for _, c := range clients {
		c.nc.Close()
	}
}

type benchConn struct {
	nc     net.Conn
	keys   []string
	tokens []uint64
	out    []byte
	rr     *codec.ResponseReader
	owner  uint64
}

func newBenchConn(b *testing.B, nc net.Conn, id, depth int) *benchConn {
	c := &benchConn{nc: nc, tokens: make([]uint64, depth), rr: codec.NewResponseReader(nc, 64<<10)}
	for i := range depth {
		c.keys = append(c.keys, fmt.Sprintf("bench/%d/%d", id, i))
	}
	if _, err := c.next(); err != nil { // greeting
		b.Fatal(err)
	}
	return c
}

func (c *benchConn) next() (codec.Response, error) {
	var r codec.Response
	err := c.rr.Next(&r)
	return r, err
}

func (c *benchConn) cycle() error {
	c.out = c.out[:0]
	base := c.owner
	for _, k := range c.keys {
		c.owner++
		c.out = codec.AppendAcquire(c.out, c.owner, 30, 0, k)
	}
	if _, err := c.nc.Write(c.out); err != nil {
		return err
	}
	for range c.keys {
		r, err := c.next()
		if err != nil {
			return err
		}
		if r.Op != codec.OpAcquired {
			return fmt.Errorf("acquire answered %q", r.Op)
		}
		c.tokens[r.Owner-base-1] = r.Token
	}
	c.out = c.out[:0]
	for i, k := range c.keys {
		c.owner++
		c.out = codec.AppendRelease(c.out, c.owner, c.tokens[i], k)
	}
	if _, err := c.nc.Write(c.out); err != nil {
		return err
	}
	for range c.keys {
		r, err := c.next()
		if err != nil {
			return err
		}
		if r.Op != codec.OpReleased {
			return fmt.Errorf("release answered %q", r.Op)
		}
	}
	return nil
}
