package bench

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Bounds of a delayRelay: connections at once, and per direction of a
// connection the bytes in flight, in chunks of one read each (about
// 4 MiB a direction).
const (
	relayMaxConns  = 64
	relayChunk     = 64 << 10
	relayMaxChunks = 64
)

// delayRelay is a TCP relay on 127.0.0.1 that puts a slow link in front
// of one node's peer port: the failover workload's --peer-delay. Every
// byte it copies, in either direction, is written delay ± jitter after
// it was read, in order (a chunk never overtakes the one before it, as on
// one TCP stream over a slow path), so a message between two nodes, which
// each send on the connection they dialed, takes delay ± jitter one way.
// It holds at most relayMaxConns connections and, per direction of each,
// relayMaxChunks reads: past that it reads no more until the oldest is
// written, as a full TCP window would.
type delayRelay struct {
	ln            net.Listener
	target        string
	delay, jitter time.Duration

	mu     sync.Mutex
	rng    *rand.Rand
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startDelayRelay listens on listen (a 127.0.0.1 address) and relays each
// connection to target (one too) with the given delay.
func startDelayRelay(listen, target string, delay, jitter time.Duration, seed uint64) (*delayRelay, error) {
	if jitter > delay {
		return nil, fmt.Errorf("peer delay %v ± %v: the jitter exceeds the delay", delay, jitter)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("peer delay relay: %w", err)
	}
	r := &delayRelay{ln: ln, target: target, delay: delay, jitter: jitter,
		rng: rand.New(rand.NewPCG(seed, 0x5eed)), conns: make(map[net.Conn]struct{})}
	r.wg.Go(r.accept)
	return r, nil
}

func (r *delayRelay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			c.Close()
			continue
		}
		r.wg.Go(func() { r.relay(c) })
	}
}

// track adds c to the open connections, unless the relay is closed or
// holds relayMaxConns already.
func (r *delayRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || len(r.conns) >= relayMaxConns {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *delayRelay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

// relay copies in to a connection of its own to the target and back,
// until either side ends; a target that is down refuses it, as its port
// would.
func (r *delayRelay) relay(in net.Conn) {
	defer r.untrack(in)
	out, err := net.DialTimeout("tcp", r.target, time.Second)
	if err != nil {
		return
	}
	if !r.track(out) {
		out.Close()
		return
	}
	defer r.untrack(out)
	var wg sync.WaitGroup
	wg.Go(func() { r.pipe(in, out) })
	wg.Go(func() { r.pipe(out, in) })
	wg.Wait()
}

// pipe copies from one side to the other, each read written when its
// delay is up, and closes both sides when either fails: a Raft
// connection is useless half closed.
func (r *delayRelay) pipe(from, to net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	held := make(chan chunk, relayMaxChunks)
	var writer sync.WaitGroup
	writer.Go(func() {
		failed := false
		for c := range held {
			if failed {
				continue // drained, so that the reader is never blocked
			}
			time.Sleep(time.Until(c.due))
			if _, err := to.Write(c.b); err != nil {
				failed = true
				from.Close()
			}
		}
	})
	var last time.Time
	for {
		buf := make([]byte, relayChunk)
		n, err := from.Read(buf)
		if n > 0 {
			due := time.Now().Add(r.hold())
			if due.Before(last) {
				due = last
			}
			last = due
			held <- chunk{b: buf[:n], due: due}
		}
		if err != nil {
			break
		}
	}
	close(held)
	writer.Wait()
	from.Close()
	to.Close()
}

// hold is one read's delay: delay ± up to jitter.
func (r *delayRelay) hold() time.Duration {
	if r.jitter == 0 {
		return r.delay
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.delay - r.jitter + time.Duration(r.rng.Int64N(int64(2*r.jitter)+1))
}

// close stops accepting, cuts every connection and waits for the relay's
// goroutines.
func (r *delayRelay) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}
