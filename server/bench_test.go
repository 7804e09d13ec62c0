package server

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/rs/zerolog"
)

// BenchmarkServerLockCycles measures whole-server throughput over
// loopback: conns connections each pipeline `depth` acquires of distinct
// keys in one write, read the grants, then release them all in one write.
// One op is one lock cycle (acquire + release).
func BenchmarkServerLockCycles(b *testing.B) {
	for _, conns := range []int{4, 16, 64} {
		for _, depth := range []int{1, 32} {
			b.Run(fmt.Sprintf("conns=%d/depth=%d", conns, depth), func(b *testing.B) {
				benchCycles(b, conns, depth)
			})
		}
	}
}

func benchCycles(b *testing.B, conns, depth int) {
	s, err := Start(Config{Listen: "127.0.0.1:0", Logger: zerolog.Nop(), Engine: engine.Config{}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	clients := make([]*benchConn, conns)
	for i := range clients {
		clients[i] = newBenchConn(b, s.Addr(), i, depth)
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

func newBenchConn(b *testing.B, addr string, id, depth int) *benchConn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
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
