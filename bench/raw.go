package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
)

// rawTarget drives lockd with bare protocol frames (--raw): pipelined
// connections shared by the callers, answers matched by owner. It has none
// of the client's rules — no deadline per call, no delivery gate, no
// compensation — so the difference to the client target is the client's
// own cost.
type rawTarget struct {
	conns  []*rawConn
	lease  uint16
	tls    bool
	owners atomic.Uint64
	wg     sync.WaitGroup
}

// rawReadBufferSize holds the answers to many pipelined requests, so that
// one read hands out many of them.
const rawReadBufferSize = 64 << 10

// rawConn is one pipelined connection.
type rawConn struct {
	nc net.Conn

	mu      sync.Mutex
	pending map[uint64]*rawCaller
	w       coalescingWriter
	err     error // set once the connection failed
}

func openRaw(ctx context.Context, addr string, opts TargetOptions) (*rawTarget, error) {
	t := &rawTarget{lease: uint16(min(wholeSeconds(opts.Lease), codec.MaxLeaseSeconds)), tls: opts.TLS != nil}
	if opts.Conns == 0 {
		opts.Conns = defaultConns
	}
	for range opts.Conns {
		nc, rr, err := rawDial(ctx, addr, opts)
		if err != nil {
			t.Close()
			return nil, err
		}
		rc := &rawConn{nc: nc, pending: make(map[uint64]*rawCaller), w: coalescingWriter{nc: nc}}
		t.conns = append(t.conns, rc)
		t.wg.Go(func() { rc.readLoop(rr) })
	}
	return t, nil
}

// rawDial connects, over TLS with opts.TLS, and runs the handshake of
// SPEC §7. The reader it returns may already hold answers past the
// handshake.
func rawDial(ctx context.Context, addr string, opts TargetOptions) (net.Conn, *codec.ResponseReader, error) {
	tenant, secret := opts.Tenant, opts.Secret
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	if opts.TLS != nil {
		nc = tls.Client(nc, opts.TLS) // the handshake runs under the greeting's deadline
	}
	nc.SetDeadline(time.Now().Add(answerSlack))
	rr := codec.NewResponseReader(nc, rawReadBufferSize)
	if _, err := codec.ClientHandshake(nc, rr, codec.Credentials{Tenant: tenant, Secret: secret}); err != nil {
		nc.Close()
		if errors.Is(err, codec.ErrHandshakeAuth) && len(secret) == 0 {
			return nil, nil, fmt.Errorf("%s requires authentication: give a tenant and its secret: %w", addr, err)
		}
		return nil, nil, fmt.Errorf("handshake with %s: %w", addr, err)
	}
	nc.SetDeadline(time.Time{})
	return nc, rr, nil
}

func (t *rawTarget) Kind() string { return SchemeLockd + "-raw" }

func (t *rawTarget) Transport() string {
	if t.tls {
		return fmt.Sprintf("%d bare-frame TLS connections", len(t.conns))
	}
	return fmt.Sprintf("%d bare-frame connections", len(t.conns))
}

// Conns counts the connections that have not failed; a failed one is not
// redialled.
func (t *rawTarget) Conns(context.Context) (int, error) {
	n := 0
	for _, rc := range t.conns {
		rc.mu.Lock()
		if rc.err == nil {
			n++
		}
		rc.mu.Unlock()
	}
	return n, nil
}

func (t *rawTarget) NewCaller(_ context.Context, id int) (Caller, error) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	return &rawCaller{
		t:     t,
		conn:  t.conns[id%len(t.conns)],
		done:  make(chan struct{}, 1),
		timer: timer,
	}, nil
}

func (t *rawTarget) Close() error {
	for _, rc := range t.conns {
		rc.nc.Close()
	}
	t.wg.Wait()
	return nil
}

func (rc *rawConn) readLoop(rr *codec.ResponseReader) {
	var resp codec.Response
	for {
		if err := rr.Next(&resp); err != nil {
			if _, undecodable := err.(codec.Reason); undecodable {
				err = fmt.Errorf("undecodable frame from the server: %w", err)
			}
			rc.fail(err)
			return
		}
		rc.deliver(&resp)
	}
}

func (rc *rawConn) deliver(resp *codec.Response) {
	rc.mu.Lock()
	c := rc.pending[resp.Owner]
	delete(rc.pending, resp.Owner)
	rc.mu.Unlock()
	if c == nil {
		return // an answer to a request its caller gave up on
	}
	c.answer, c.token, c.reason = resp.Op, resp.Token, resp.Reason
	c.done <- struct{}{}
}

// fail ends every pending request with err and refuses new ones.
func (rc *rawConn) fail(err error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.err = err
	for owner, c := range rc.pending {
		delete(rc.pending, owner)
		c.answer = 0
		c.done <- struct{}{}
	}
}

// send queues a frame for c and writes whatever is queued unless another
// caller is already writing. After it returns nil, c.done is signalled
// exactly once: by the answer, or by the failure of the connection.
func (rc *rawConn) send(c *rawCaller, owner uint64, frame []byte) error {
	rc.mu.Lock()
	if rc.err != nil {
		err := rc.err
		rc.mu.Unlock()
		return err
	}
	rc.pending[owner] = c
	rc.w.queue(&rc.mu, frame)
	rc.mu.Unlock()
	return nil
}

// forget withdraws a request whose caller stops waiting; it reports false
// when the answer came meanwhile and is already signalled.
func (rc *rawConn) forget(owner uint64) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if _, ok := rc.pending[owner]; ok {
		delete(rc.pending, owner)
		return true
	}
	return false
}

type rawCaller struct {
	t     *rawTarget
	conn  *rawConn
	frame []byte
	done  chan struct{}
	timer *time.Timer

	// Set by the reader before it signals done.
	answer byte
	token  uint64
	reason codec.Reason

	key  string
	held uint64 // the token of the lock held, 0 when none
}

func (c *rawCaller) Acquire(ctx context.Context, key string, wait time.Duration) (Outcome, error) {
	waitSeconds := min(wholeSeconds(wait), codec.MaxWaitSeconds)
	owner := c.t.owners.Add(1)
	c.frame = codec.AppendAcquire(c.frame[:0], owner, c.t.lease, uint8(waitSeconds), key)
	if err := c.exchange(ctx, owner, time.Duration(waitSeconds)*time.Second); err != nil {
		return Failed, err
	}
	switch c.answer {
	case codec.OpAcquired:
		c.key, c.held = key, c.token
		return Acquired, nil
	case codec.OpTimeout:
		return TimedOut, nil
	case codec.OpBusy:
		return Busy, nil
	}
	return Failed, c.answerError()
}

func (c *rawCaller) Release(ctx context.Context) (Outcome, error) {
	owner := c.t.owners.Add(1)
	c.frame = codec.AppendRelease(c.frame[:0], owner, c.held, c.key)
	c.held = 0
	if err := c.exchange(ctx, owner, 0); err != nil {
		return Failed, err
	}
	switch c.answer {
	case codec.OpReleased:
		return Released, nil
	case codec.OpNotHeld:
		return NotHeld, nil
	}
	return Failed, c.answerError()
}

func (c *rawCaller) answerError() error {
	if c.answer == codec.OpError {
		return fmt.Errorf("server answered E %v", c.reason)
	}
	if c.answer == 0 {
		return errors.New("connection lost before the answer")
	}
	return fmt.Errorf("unexpected answer %q", c.answer)
}

// exchange sends c.frame and waits for its answer, for at most the wait
// the server was given plus answerSlack.
func (c *rawCaller) exchange(ctx context.Context, owner uint64, wait time.Duration) error {
	if err := c.conn.send(c, owner, c.frame); err != nil {
		return err
	}
	c.timer.Reset(wait + answerSlack)
	defer c.timer.Stop()
	var cause error
	select {
	case <-c.done:
		return nil
	case <-c.timer.C:
		cause = errors.New("no answer in time")
	case <-ctx.Done():
		cause = context.Cause(ctx)
	}
	if !c.conn.forget(owner) {
		<-c.done // answered meanwhile: keep the channel empty for the next call
		return nil
	}
	return cause
}

func (c *rawCaller) Close() error { return nil }
