package client

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
)

const (
	readBufferSize  = 16 << 10
	writeBufferSize = 16 << 10
)

// errAbandoned is the cause recorded on a session that was closed because
// a call's deadline or context ended after its request may have been sent
// (SPEC §6).
var errAbandoned = errors.New("session closed: a call ended after its request may have been sent")

type opKind uint8

const (
	opAcquire opKind = iota + 1
	opRelease
	opKeep
	opAbandon // SPEC §6a: gives back the ACQUIRE target on key
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
// their channels and timer, so a call allocates nothing.
type request struct {
	// Set by the caller before the request is enqueued.
	kind      opKind
	owner     uint64
	key       string
	lease     uint16 // acquire and keep, seconds
	immediate bool   // the original wait was 0: wire wait 0
	token     uint64
	target    uint64 // abandon: the owner of the ACQUIRE given back
	deadline  time.Time

	// Guarded by the mu of the session the request is enqueued on, and
	// read by the caller once it has received from done.
	state reqState
	// In the session's deadlines: in its list (listed, between prev and
	// next) or in its heap (heapIndex, notInHeap otherwise).
	listed     bool
	prev, next *request
	heapIndex  int
	sentAt     time.Time
	// abandonable: the request was sent on a session that declared the
	// client's SESSION, so an ABANDON can give back what it got.
	abandonable bool
	out         outcome
	reason      codec.Reason
	granted     uint64
	waitedMs    uint32
	cause       error
	// expired: the call's deadline or context ended it; an attempt may
	// have been sent, and no retry may follow.
	expired bool

	// The caller's own.
	mayHaveLeft bool
	// watch, when set, ends the request with the caller's context (see
	// contextWatch); the caller then waits on done alone.
	watch *contextWatch

	done chan struct{} // capacity 1: exactly one signal per stateDone
	// handoff receives a wait session from the pool while the request
	// waits for one (capacity 1).
	handoff chan *session
	// timer bounds the rare local waits — for a ready session, a wait
	// session, a backoff — by the call's deadline. Waits on the wire are
	// bounded by the session's deadline timer instead.
	timer timer
}

// session is one authenticated connection: a writer goroutine that sends
// every queued frame in one write, a reader goroutine that correlates
// answers by owner, the table of the requests between the two, and one
// timer that ends them at their deadlines. A session never reconnects:
// its slot in the pool, or the wait pool, dials a new one.
type session struct {
	client *Client
	conn   net.Conn
	addr   string
	// pool is the wait pool a wait session belongs to; nil for the shared
	// sessions.
	pool *waitPool
	// servesAbandon: the server set GREETING bit1 and this session
	// declared the client's SESSION (SPEC §6a), so it may carry ABANDON
	// and its ACQUIREs can be abandoned.
	servesAbandon bool

	wake chan struct{}
	// wakeSent is set while a wake is on its way to the writer, so that
	// of the calls queueing meanwhile only the first one sends it.
	wakeSent atomic.Bool
	dead     chan struct{} // closed by fail

	mu     sync.Mutex
	closed bool
	// refusing is set once an answer that closes the session (E
	// shutting_down) was delivered: its caller, woken by it, may call
	// again before the reader closes the session, and that call must go
	// to another session, not into one about to end it as lost.
	refusing  bool
	table     pendingTable
	queue     []*request
	batch     []*request // the writer's spare queue, swapped with queue
	jobs      []writeJob // the frames of the last write, for a partial failure
	wbuf      []byte
	deadlines deadlineQueue
	expiry    timer     // fires expire at armedFor
	armedFor  time.Time // zero while expiry is not armed
	silence   silenceWatch
	// quiet is set while a PING has gone unanswered for a tick of the
	// silence watch, and cleared by the next answer: callers pass such a
	// session by while another one is ready.
	quiet atomic.Bool

	// Guarded by the wait pool's mu.
	poolState poolState
	idleSince time.Time

	rr *codec.ResponseReader // the reader's, carried over from the handshake

	// testHookShutdown, when set by a test, runs as the session starts
	// shutting down, before it resolves its requests and closes its
	// connection; testHookClosingAnswer runs on the reader when an answer
	// ended its reading (one that closes the session, or a protocol
	// error), before it closes the session.
	testHookShutdown      atomic.Pointer[func()]
	testHookClosingAnswer atomic.Pointer[func()]
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

func (c *Client) startSession(conn net.Conn, addr string, rr *codec.ResponseReader, servesAbandon bool, capacity int, pool *waitPool) *session {
	s := &session{
		client:        c,
		conn:          conn,
		addr:          addr,
		pool:          pool,
		servesAbandon: servesAbandon,
		wake:          make(chan struct{}, 1),
		dead:          make(chan struct{}),
		table:         newPendingTable(capacity),
		queue:         make([]*request, 0, capacity),
		batch:         make([]*request, 0, capacity),
		jobs:          make([]writeJob, 0, capacity),
		wbuf:          make([]byte, 0, min(writeBufferSize, capacity*codec.MaxRequestFrame)),
		deadlines:     deadlineQueue{early: make(deadlineHeap, 0, capacity)},
		rr:            rr,
	}
	s.expiry = c.clock.AfterFunc(time.Hour, s.expire)
	s.expiry.Stop()
	s.silence.tick = c.clock.AfterFunc(time.Hour, s.checkSilence)
	s.silence.tick.Stop()
	s.watchSilence()
	c.wg.Add(2)
	go s.readLoop()
	go s.writeLoop()
	return s
}

// enqueue hands req to the writer unless the session is closed or holds
// limit requests already.
func (s *session) enqueue(req *request, limit int) enqueueResult {
	s.mu.Lock()
	if s.closed || s.refusing {
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
	s.deadlines.push(req)
	if s.armedFor.IsZero() || req.deadline.Before(s.armedFor) {
		s.arm(req.deadline)
	}
	s.mu.Unlock()
	s.wakeWriter()
	return enqueued
}

// wakeWriter tells the writer there is something to send.
func (s *session) wakeWriter() {
	if !s.wakeSent.Load() && !s.wakeSent.Swap(true) {
		s.wake <- struct{}{}
	}
}

// arm sets the deadline timer for at; s.mu is held. Only a deadline earlier
// than the armed one re-arms it, so in steady state — deadlines arriving in
// the order of the calls — enqueueing reads no clock.
func (s *session) arm(at time.Time) {
	s.armedFor = at
	s.expiry.Reset(at.Sub(s.client.clock.Now()))
}

// expire ends the calls whose deadline has come (SPEC §6). A request still
// queued certainly never left: it ends unsent and the session stays. One
// the writer took may have left, so the session is closed, which also
// drops any waiter the server queued for it; that is why a waiting acquire
// never shares its session.
func (s *session) expire() {
	now := s.client.clock.Now()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.armedFor = time.Time{}
	sentExpired := false
	for req := s.deadlines.earliest(); req != nil && !now.Before(req.deadline); req = s.deadlines.earliest() {
		req.expired = true
		s.deadlines.remove(req)
		if req.state == stateQueued {
			s.table.remove(req.owner)
			s.unqueue(req)
			s.resolve(req, outExpired, nil)
			continue
		}
		sentExpired = true
	}
	closing := false
	if sentExpired {
		closing = s.markClosed()
	} else if next := s.deadlines.earliest(); next != nil {
		s.arm(next.deadline)
	}
	s.mu.Unlock()
	if closing {
		s.shutdown(errAbandoned)
	}
}

// finish takes an answered or ended request out of the session; s.mu is
// held.
func (s *session) finish(req *request, out outcome, cause error) {
	s.table.remove(req.owner)
	s.deadlines.remove(req)
	s.resolve(req, out, cause)
}

// resolve signals req's outcome; s.mu is held and req has left the table.
func (s *session) resolve(req *request, out outcome, cause error) {
	req.out = out
	req.cause = cause
	req.state = stateDone
	req.done <- struct{}{}
}

// abandon is the caller's move when its context ends first. A request
// still queued is withdrawn, certainly unsent. One the writer has taken
// may have left, so the session is closed and the outcome is lost: closed
// in the same hold of s.mu that withdraws the request, so that an answer
// to it arriving meanwhile finds a closed session, not an unknown owner.
// One that was answered meanwhile keeps its answer.
func (s *session) abandon(req *request) outcome {
	s.mu.Lock()
	switch req.state {
	case stateQueued:
		s.table.remove(req.owner)
		s.deadlines.remove(req)
		s.unqueue(req)
		req.state = stateIdle
		req.expired = true
		s.mu.Unlock()
		return outExpired
	case stateSent:
		s.table.remove(req.owner)
		s.deadlines.remove(req)
		req.state = stateIdle
		req.expired = true
		req.cause = errAbandoned
		closing := s.markClosed()
		s.mu.Unlock()
		if closing {
			s.shutdown(errAbandoned)
		}
		return outLost
	}
	s.mu.Unlock()
	<-req.done
	return req.out
}

func (s *session) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && !s.refusing
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
	closing := s.markClosed()
	s.mu.Unlock()
	if closing {
		s.shutdown(cause)
	}
}

// markClosed closes the session to new requests and to answers, and
// reports whether this call closed it, its caller then owing the
// shutdown; s.mu is held.
func (s *session) markClosed() bool {
	if s.closed {
		return false
	}
	s.closed = true
	return true
}

// shutdown ends a session markClosed closed: it resolves every request
// left in it with cause and closes the connection.
func (s *session) shutdown(cause error) {
	if hook := s.testHookShutdown.Load(); hook != nil {
		(*hook)()
	}
	// The pool learns of the loss before any caller does, so that what
	// a caller sees next — the pool's count, its replacement — follows.
	if s.pool != nil {
		s.pool.died(s)
	}
	s.mu.Lock()
	s.expiry.Stop()
	s.silence.tick.Stop()
	if errors.Is(cause, ErrProtocol) {
		s.client.stats.protocolErrors.Add(1)
	}
	if errors.Is(cause, errAbandoned) {
		s.client.stats.abandoned.Add(1)
	}
	// Every request in the deadlines is in the table; none may be touched
	// once resolved, since its caller then reuses it.
	s.deadlines.reset()
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
			// Cleared before the queue is taken: a call queueing after
			// this sends the next wake.
			s.wakeSent.Store(false)
		case <-s.dead:
			return
		}
		// The reader has just handed answers to callers that are about
		// to send their next requests: one scheduling round lets them
		// join this write instead of costing a write each.
		runtime.Gosched()
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
	if s.closed || (len(s.queue) == 0 && !s.silence.pingDue) {
		return nil
	}
	s.queue, s.batch = s.batch[:0], s.queue
	now := s.client.clock.Now()
	buf, jobs := s.wbuf[:0], s.jobs[:0]
	if s.silence.pingDue {
		s.silence.pingDue = false
		buf = codec.AppendPing(buf, s.silence.pingOwner)
	}
	for i, req := range s.batch {
		s.batch[i] = nil
		if !now.Before(req.deadline) {
			req.expired = true
			s.finish(req, outExpired, nil)
			continue
		}
		jobs = append(jobs, writeJob{owner: req.owner, offset: len(buf)})
		switch req.kind {
		case opAcquire:
			buf = codec.AppendAcquire(buf, req.owner, req.lease, wireWait(req, now), req.key)
		case opRelease:
			buf = codec.AppendRelease(buf, req.owner, req.token, req.key)
		case opKeep:
			buf = codec.AppendKeep(buf, req.owner, req.token, req.lease, req.key)
		case opAbandon:
			buf = codec.AppendAbandon(buf, req.owner, req.target, req.key)
		}
		req.state = stateSent
		req.sentAt = now
		req.abandonable = s.servesAbandon
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
			s.finish(req, outUnsent, cause)
		}
	}
	s.mu.Unlock()
	s.fail(cause)
}

// readLoop reads answers and hands each to its caller; every answer one
// read brought in is correlated under one hold of the session's lock.
func (s *session) readLoop() {
	defer s.client.wg.Done()
	var resp codec.Response
	for {
		if err := nextFrame(s.rr, &resp); err != nil {
			s.fail(fmt.Errorf("session to %s: %w", s.addr, err))
			return
		}
		if err := s.deliverBuffered(&resp); err != nil {
			if hook := s.testHookClosingAnswer.Load(); hook != nil {
				(*hook)()
			}
			s.fail(err)
			return
		}
	}
}

// deliverBuffered delivers resp, then every further answer already read.
// A closed session drops them: its requests end with its cause, and a
// request a caller gave up on is no longer in it.
func (s *session) deliverBuffered(resp *codec.Response) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.silence.heardAt = s.client.clock.Now()
	if s.quiet.Load() {
		s.quiet.Store(false)
	}
	for {
		if s.closed {
			// Dropped: read on until the shutdown closes the connection.
		} else if err := s.deliver(resp); err != nil {
			return err
		}
		more, err := s.rr.NextBuffered(resp)
		if err != nil {
			return undecodable(err)
		}
		if !more {
			return nil
		}
	}
}

// nextFrame reads one frame; a frame no conforming server sends is a
// protocol error, anything else is the connection's own error.
func nextFrame(rr *codec.ResponseReader, resp *codec.Response) error {
	return undecodable(rr.Next(resp))
}

func undecodable(err error) error {
	if _, ok := err.(codec.Reason); ok {
		return fmt.Errorf("%w: undecodable frame: %w", ErrProtocol, err)
	}
	return err
}

// deliver correlates one answer with its request by owner; s.mu is held.
// An answer the session cannot match breaks the correlation every answer
// relies on, so it is a protocol error that closes the session.
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
	case codec.OpPong:
		if !s.silence.pingAnswered(resp) {
			return fmt.Errorf("%w: PONG for owner %d, which is no PING in flight on %s", ErrProtocol, resp.Owner, s.addr)
		}
		return nil
	case codec.OpError:
		if resp.Owner == 0 {
			return fmt.Errorf("server %s: %w", s.addr, resp.Reason)
		}
		out = outRejected
	default:
		return fmt.Errorf("%w: unexpected %q frame from %s", ErrProtocol, resp.Op, s.addr)
	}
	req := s.table.get(resp.Owner)
	if req == nil || req.state != stateSent || !answers(req.kind, out) {
		return fmt.Errorf("%w: %q for owner %d, which has no matching request in flight on %s", ErrProtocol, resp.Op, resp.Owner, s.addr)
	}
	if req.kind == opKeep && out == outAcquired && resp.Token != req.token {
		// KEEP never changes the token (SPEC §5): a renewal of another
		// one would fence the holder's writes with the wrong number.
		return fmt.Errorf("%w: KEEP of token %d answered with token %d by %s", ErrProtocol, req.token, resp.Token, s.addr)
	}
	req.granted, req.waitedMs, req.reason = resp.Token, resp.WaitedMs, resp.Reason
	closes := out == outRejected && resp.Reason.ClosesConnection()
	s.refusing = s.refusing || closes
	s.finish(req, out, nil)
	if closes {
		return fmt.Errorf("server %s closes the session: %w", s.addr, resp.Reason)
	}
	return nil
}

func answers(kind opKind, out outcome) bool {
	switch out {
	case outAcquired:
		return kind == opAcquire || kind == opKeep
	case outTimedOut, outBusy:
		return kind == opAcquire
	case outReleased:
		return kind == opRelease || kind == opAbandon
	case outNotHeld:
		return kind == opRelease || kind == opKeep || kind == opAbandon
	}
	return true
}
