package client

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/lockd/lockd/codec"
)

const (
	readBufferSize  = 16 << 10
	writeBufferSize = 16 << 10
)

// errAbandoned is the cause recorded on a session that a caller closed
// because its deadline or context ended after its request may have been
// sent (SPEC §6).
var errAbandoned = errors.New("session closed: a call ended after its request may have been sent")

type opKind uint8

const (
	opAcquire opKind = iota + 1
	opRelease
)

type reqState uint8

const (
	stateIdle   reqState = iota
	stateQueued          // in a session's queue: certainly not sent
	stateSent            // taken by the writer: a byte may have left
	stateDone            // outcome set and signalled on done
)

type outcome uint8

const (
	outNone outcome = iota
	outAcquired
	outTimedOut
	outBusy
	outReleased
	outNotHeld
	outRejected // an E attributed to the request; reason is set
	outUnsent   // the session failed before any byte of the frame left
	outExpired  // the deadline passed before any byte of the frame left
	outLost     // the session failed or was abandoned after a byte may have left
)

// request is the state of one call. Requests are pooled together with
// their done channel and timer, so a call allocates nothing.
type request struct {
	// Set by the caller before the request is enqueued.
	kind      opKind
	owner     uint64
	key       string
	lease     uint16
	immediate bool // the original wait was 0: wire wait 0
	token     uint64
	deadline  time.Time

	// Guarded by the mu of the session the request is enqueued on, and
	// read by the caller once it has received from done.
	state    reqState
	sentAt   time.Time
	out      outcome
	reason   codec.Reason
	granted  uint64
	waitedMs uint32
	cause    error

	// The caller's own: its deadline or context has ended; an attempt
	// may have been sent.
	expired     bool
	mayHaveLeft bool

	done  chan struct{} // capacity 1: exactly one signal per stateDone
	timer timer
}

// session is one authenticated connection: a writer goroutine that sends
// every queued frame in one write, a reader goroutine that correlates
// answers by owner, and the table of the requests between the two. A
// session never reconnects; its slot in the pool dials a new one.
type session struct {
	client *Client
	conn   net.Conn
	addr   string

	wake chan struct{}
	dead chan struct{} // closed by fail

	mu     sync.Mutex
	closed bool
	table  pendingTable
	queue  []*request
	batch  []*request // the writer's spare queue, swapped with queue
	jobs   []writeJob // the frames of the last write, for a partial failure
	wbuf   []byte

	rr *codec.ResponseReader // the reader's, carried over from the handshake
}

// writeJob locates one frame in the write buffer: frames starting at or
// after the bytes a failed write got out certainly never left.
type writeJob struct {
	owner  uint64
	offset int
}

type enqueueResult uint8

const (
	enqueued enqueueResult = iota
	sessionClosed
	sessionFull
)

func (c *Client) startSession(conn net.Conn, addr string, rr *codec.ResponseReader) *session {
	capacity := c.cfg.MaxInFlight + c.releaseReserve
	s := &session{
		client: c,
		conn:   conn,
		addr:   addr,
		wake:   make(chan struct{}, 1),
		dead:   make(chan struct{}),
		table:  newPendingTable(capacity),
		queue:  make([]*request, 0, capacity),
		batch:  make([]*request, 0, capacity),
		jobs:   make([]writeJob, 0, capacity),
		wbuf:   make([]byte, 0, writeBufferSize),
		rr:     rr,
	}
	c.wg.Add(2)
	go s.readLoop()
	go s.writeLoop()
	return s
}

// enqueue hands req to the writer unless the session is closed or holds
// limit requests already.
func (s *session) enqueue(req *request, limit int) enqueueResult {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sessionClosed
	}
	if s.table.count >= limit {
		s.mu.Unlock()
		return sessionFull
	}
	req.state = stateQueued
	s.table.insert(req.owner, req)
	s.queue = append(s.queue, req)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return enqueued
}

// resolve ends req with out; s.mu is held.
func (s *session) resolve(req *request, out outcome, cause error) {
	req.out = out
	req.cause = cause
	req.state = stateDone
	req.done <- struct{}{}
}

// abandon is the caller's move when its deadline or context ends first.
// A request still queued is withdrawn, certainly unsent. One the writer
// has taken may have left, so the session is closed — which also drops
// any waiter the server queued for it — and the outcome is lost. One that
// was answered meanwhile keeps its answer.
func (s *session) abandon(req *request) outcome {
	s.mu.Lock()
	switch req.state {
	case stateQueued:
		s.table.remove(req.owner)
		s.unqueue(req)
		req.state = stateIdle
		s.mu.Unlock()
		return outExpired
	case stateSent:
		s.table.remove(req.owner)
		req.state = stateIdle
		req.cause = errAbandoned
		s.mu.Unlock()
		s.fail(errAbandoned)
		return outLost
	}
	s.mu.Unlock()
	<-req.done
	return req.out
}

func (s *session) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed
}

func (s *session) unqueue(req *request) {
	for i, q := range s.queue {
		if q == req {
			copy(s.queue[i:], s.queue[i+1:])
			s.queue[len(s.queue)-1] = nil
			s.queue = s.queue[:len(s.queue)-1]
			return
		}
	}
}

// fail closes the session once. Queued requests end unsent, so their
// callers may move them to another session; requests the writer took end
// lost.
func (s *session) fail(cause error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	if errors.Is(cause, ErrProtocol) {
		s.client.stats.protocolErrors.Add(1)
	}
	for i := range s.table.slots {
		req := s.table.slots[i].req
		if req == nil {
			continue
		}
		out := outLost
		if req.state == stateQueued {
			out = outUnsent
		}
		s.resolve(req, out, cause)
	}
	s.table.reset()
	clear(s.queue)
	s.queue = s.queue[:0]
	s.mu.Unlock()
	s.conn.Close()
	close(s.dead)
}

func (s *session) writeLoop() {
	defer s.client.wg.Done()
	for {
		select {
		case <-s.wake:
		case <-s.dead:
			return
		}
		frames := s.takeBatch()
		if len(frames) == 0 {
			continue
		}
		if n, err := s.conn.Write(frames); err != nil {
			s.writeFailed(n, err)
			return
		}
	}
}

// takeBatch encodes every queued request into one buffer. Each frame's
// wait is computed here, just before the send, from the call's single
// deadline; a request whose deadline has passed is not sent at all.
func (s *session) takeBatch() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.queue, s.batch = s.batch[:0], s.queue
	now := s.client.clock.Now()
	buf, jobs := s.wbuf[:0], s.jobs[:0]
	for i, req := range s.batch {
		s.batch[i] = nil
		if !now.Before(req.deadline) {
			s.table.remove(req.owner)
			s.resolve(req, outExpired, nil)
			continue
		}
		jobs = append(jobs, writeJob{owner: req.owner, offset: len(buf)})
		if req.kind == opAcquire {
			buf = codec.AppendAcquire(buf, req.owner, req.lease, wireWait(req, now), req.key)
		} else {
			buf = codec.AppendRelease(buf, req.owner, req.token, req.key)
		}
		req.state = stateSent
		req.sentAt = now
	}
	s.wbuf, s.jobs = buf, jobs
	return buf
}

// wireWait is 0 only for an original wait of 0; otherwise the remaining
// time rounded up, so a late send or a retry never restarts the server's
// wait, nor turns into an immediate attempt.
func wireWait(req *request, now time.Time) uint8 {
	if req.immediate {
		return 0
	}
	return uint8(ceilSeconds(req.deadline.Sub(now)))
}

// writeFailed ends the frames that certainly never left as unsent, then
// closes the session; the others end lost.
func (s *session) writeFailed(written int, err error) {
	cause := fmt.Errorf("write to %s: %w", s.addr, err)
	s.mu.Lock()
	for _, job := range s.jobs {
		if job.offset < written {
			continue
		}
		if req := s.table.get(job.owner); req != nil && req.state == stateSent {
			s.table.remove(job.owner)
			s.resolve(req, outUnsent, cause)
		}
	}
	s.mu.Unlock()
	s.fail(cause)
}

func (s *session) readLoop() {
	defer s.client.wg.Done()
	var resp codec.Response
	for {
		if err := nextFrame(s.rr, &resp); err != nil {
			s.fail(fmt.Errorf("session to %s: %w", s.addr, err))
			return
		}
		if err := s.deliver(&resp); err != nil {
			s.fail(err)
			return
		}
	}
}

// nextFrame reads one frame; a frame no conforming server sends is a
// protocol error, anything else is the connection's own error.
func nextFrame(rr *codec.ResponseReader, resp *codec.Response) error {
	err := rr.Next(resp)
	if _, undecodable := err.(codec.Reason); undecodable {
		return fmt.Errorf("%w: undecodable frame: %w", ErrProtocol, err)
	}
	return err
}

// deliver correlates one answer with its request by owner. An answer the
// session cannot match breaks the correlation every answer relies on, so
// it is a protocol error that closes the session.
func (s *session) deliver(resp *codec.Response) error {
	var out outcome
	switch resp.Op {
	case codec.OpAcquired:
		if resp.Token == 0 {
			// Tokens are never 0; a Ticket with it could not be released.
			return fmt.Errorf("%w: ACQUIRED with token 0 from %s", ErrProtocol, s.addr)
		}
		out = outAcquired
	case codec.OpTimeout:
		out = outTimedOut
	case codec.OpBusy:
		out = outBusy
	case codec.OpReleased:
		out = outReleased
	case codec.OpNotHeld:
		out = outNotHeld
	case codec.OpError:
		if resp.Owner == 0 {
			return fmt.Errorf("server %s: %w", s.addr, resp.Reason)
		}
		out = outRejected
	default:
		return fmt.Errorf("%w: unexpected %q frame from %s", ErrProtocol, resp.Op, s.addr)
	}
	s.mu.Lock()
	req := s.table.get(resp.Owner)
	if req == nil || req.state != stateSent || !answers(req.kind, out) {
		s.mu.Unlock()
		return fmt.Errorf("%w: %q for owner %d, which has no matching request in flight on %s", ErrProtocol, resp.Op, resp.Owner, s.addr)
	}
	s.table.remove(resp.Owner)
	req.granted, req.waitedMs, req.reason = resp.Token, resp.WaitedMs, resp.Reason
	s.resolve(req, out, nil)
	s.mu.Unlock()
	if out == outRejected && resp.Reason.ClosesConnection() {
		return fmt.Errorf("server %s closes the session: %w", s.addr, resp.Reason)
	}
	return nil
}

func answers(kind opKind, out outcome) bool {
	switch out {
	case outAcquired, outTimedOut, outBusy:
		return kind == opAcquire
	case outReleased, outNotHeld:
		return kind == opRelease
	}
	return true
}

// connect dials addr and authenticates within DialTimeout.
func (c *Client) connect(ctx context.Context, addr string) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	conn, err := c.cfg.Dialer(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	// A cancelled Dial or Close must not wait for a silent server.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	rr, err := c.handshake(conn, addr)
	if !stop() && err == nil {
		err = fmt.Errorf("handshake with %s: %w", addr, context.Cause(ctx))
	}
	if err == nil {
		err = conn.SetDeadline(time.Time{})
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c.startSession(conn, addr, rr), nil
}

// handshake runs SPEC §7 and returns the reader, which may already hold
// bytes past the handshake's last frame.
// With a secret configured the server must prove it knows the secret too:
// a server that does not ask for authentication is refused rather than
// trusted.
func (c *Client) handshake(conn net.Conn, addr string) (*codec.ResponseReader, error) {
	var resp codec.Response
	rr := codec.NewResponseReader(conn, readBufferSize)
	if err := nextFrame(rr, &resp); err != nil {
		return nil, fmt.Errorf("greeting from %s: %w", addr, err)
	}
	if resp.Op != codec.OpGreeting || resp.Version != codec.Version {
		return nil, fmt.Errorf("%w: %s sent op %q version %d instead of a version %d GREETING", ErrProtocol, addr, resp.Op, resp.Version, codec.Version)
	}
	authRequired := resp.Flags&codec.GreetingAuthRequired != 0
	secret, tenant := c.cfg.Secret, c.cfg.Tenant
	switch {
	case authRequired && len(secret) == 0:
		return nil, fmt.Errorf("%w: %s requires authentication and Config.Secret is empty", ErrAuth, addr)
	case !authRequired && len(secret) != 0:
		return nil, fmt.Errorf("%w: %s does not authenticate, so it cannot prove it knows the secret", ErrAuth, addr)
	case !authRequired && tenant == "":
		return rr, nil
	}
	serverNonce := resp.ServerNonce
	var clientNonce [codec.NonceLen]byte
	rand.Read(clientNonce[:])
	mac := codec.ClientMAC(secret, serverNonce, clientNonce, []byte(tenant))
	if _, err := conn.Write(codec.AppendHello(nil, clientNonce, mac, tenant)); err != nil {
		return nil, fmt.Errorf("hello to %s: %w", addr, err)
	}
	if err := nextFrame(rr, &resp); err != nil {
		return nil, fmt.Errorf("welcome from %s: %w", addr, err)
	}
	switch resp.Op {
	case codec.OpWelcome:
	case codec.OpError:
		return nil, fmt.Errorf("handshake with %s: %w", addr, reasonError(resp.Reason))
	default:
		return nil, fmt.Errorf("%w: %s answered HELLO with op %q", ErrProtocol, addr, resp.Op)
	}
	if authRequired && !codec.EqualMAC(resp.ServerMAC, codec.ServerMAC(secret, clientNonce, serverNonce, []byte(tenant))) {
		return nil, fmt.Errorf("%w: the server MAC of %s does not verify", ErrAuth, addr)
	}
	return rr, nil
}
