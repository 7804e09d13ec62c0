package server

import (
	"crypto/rand"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/panjf2000/gnet/v2"
)

// defaultTenant is the namespace of a connection that never sends HELLO
// while auth is off.
const defaultTenant = "default"

// session is the state of one client connection. Fields above mu are
// touched only by the connection's event loop; fields below it are shared
// with engine callbacks (grants, wait expiry) that run on other goroutines.
type session struct {
	srv *Server
	gc  gnet.Conn

	serverNonce  [codec.NonceLen]byte
	welcomed     bool // a HELLO was accepted
	sawRequest   bool // any frame was handled, so HELLO may no longer come
	ns           engine.Namespace
	tenant       string
	req          codec.Request
	batch        *batch // shared with the loop's other sessions
	partialFrame bool
	// frameStartedAt is read by the progress scan on another goroutine.
	frameStartedAt atomic.Int64

	mu sync.Mutex
	// pending holds the owners of acquires in flight on this connection:
	// reserved before the engine sees them, so a grant racing the return
	// of Acquire still finds its entry.
	pending     map[uint64]pendingAcquire
	outbox      []byte
	closeOnWake bool
	closed      bool
}

type pendingAcquire struct {
	wait *engine.Wait
	key  string // kept only for a queued acquire, to release an orphaned grant
}

func newSession(s *Server, c gnet.Conn) (*session, []byte, error) {
	ss := &session{
		srv:     s,
		gc:      c,
		pending: make(map[uint64]pendingAcquire),
		batch:   s.batchFor(c.EventLoop()),
	}
	if _, err := rand.Read(ss.serverNonce[:]); err != nil {
		return nil, nil, fmt.Errorf("server nonce: %w", err)
	}
	if s.cfg.Auth == nil {
		ss.tenant = defaultTenant
		ss.ns = s.engine.Namespace(defaultTenant)
	}
	var flags uint8
	if s.cfg.Auth != nil {
		flags |= codec.GreetingAuthRequired
	}
	return ss, codec.AppendGreeting(nil, flags, ss.serverNonce, s.cfg.NodeName), nil
}

// onTraffic decodes every complete frame the connection holds, answers
// them in batches of ResponseBatch per write, then writes what engine
// callbacks left in the outbox. It also runs, with no new bytes, when a
// callback or the progress scan wakes the connection.
func (ss *session) onTraffic() gnet.Action {
	buf, _ := ss.gc.Peek(-1)
	consumed, closing := ss.handleFrames(buf)
	if consumed > 0 { // gnet's Discard(0) would discard everything
		_, _ = ss.gc.Discard(consumed)
	}

	if !closing && consumed < len(buf) {
		closing = ss.trackPartialFrame(consumed > 0)
	} else if ss.partialFrame {
		ss.partialFrame = false
		ss.srv.markStalled(ss, false)
	}

	ss.mu.Lock()
	if len(ss.outbox) > 0 {
		ss.batch.buf = append(ss.batch.buf, ss.outbox...)
		ss.outbox = ss.outbox[:0]
	}
	closing = closing || ss.closeOnWake
	ss.mu.Unlock()

	ss.flush()
	if closing {
		return gnet.Close
	}
	if ss.gc.OutboundBuffered() > ss.srv.cfg.MaxOutbound {
		ss.srv.metrics.slowDropped.Add(1)
		ss.srv.log.Warn().Str("remote", ss.gc.RemoteAddr().String()).Msg("dropping a client that does not read its responses")
		return gnet.Close
	}
	return gnet.None
}

// trackPartialFrame starts the progress clock when a frame is left
// incomplete, restarting it when the previous frame completed, and reports
// whether the frame has been stalled past ProgressTimeout.
func (ss *session) trackPartialFrame(progressed bool) bool {
	now := int64(ss.srv.clock.Now())
	if !ss.partialFrame || progressed {
		ss.frameStartedAt.Store(now)
	}
	if !ss.partialFrame {
		ss.partialFrame = true
		ss.srv.markStalled(ss, true)
	}
	if now-ss.frameStartedAt.Load() >= int64(ProgressTimeout) {
		ss.srv.metrics.progressTimeouts.Add(1)
		ss.appendError(0, codec.BadRequest)
		return true
	}
	return false
}

// handleFrames answers the complete frames at the start of buf. It returns
// how many bytes it consumed and whether the connection must close.
func (ss *session) handleFrames(buf []byte) (int, bool) {
	consumed := 0
	for consumed < len(buf) {
		n, err := codec.DecodeRequest(buf[consumed:], &ss.req)
		if err == codec.ErrIncomplete {
			return consumed, false
		}
		if n == 0 {
			ss.srv.metrics.countRequest(opUnknown)
			ss.appendError(0, err.(codec.Reason))
			return consumed, true
		}
		consumed += n
		if ss.handleFrame(&ss.req, err) {
			return consumed, true
		}
		if ss.batch.frames >= ResponseBatch {
			ss.flush()
		}
	}
	return consumed, false
}

// handleFrame answers one frame whose boundary was sound; fieldErr is the
// codec's verdict on its fields. It reports whether to close.
func (ss *session) handleFrame(req *codec.Request, fieldErr error) bool {
	op := opOf(req.Op)
	ss.srv.metrics.countRequest(op)
	if req.Op == codec.OpHello {
		return ss.handleHello(req, fieldErr)
	}
	ss.sawRequest = true
	if ss.srv.cfg.Auth != nil && !ss.welcomed {
		ss.appendError(req.Owner, codec.AuthRequired)
		return true
	}
	if ss.srv.draining.Load() {
		ss.appendError(req.Owner, codec.ShuttingDown)
		return true
	}
	if fieldErr != nil {
		ss.appendError(req.Owner, fieldErr.(codec.Reason))
		return false
	}
	if ss.ownerInFlight(req.Owner) {
		ss.appendError(req.Owner, codec.DupOwner)
		return false
	}
	switch req.Op {
	case codec.OpAcquire:
		ss.acquire(req)
	case codec.OpRelease:
		r := ss.srv.engine.Release(ss.ns, req.Key, req.Token)
		ss.appendResult(opRelease, req.Owner, r)
	case codec.OpPing:
		ss.appendOwnerOnly(opPing, codec.OpPong, req.Owner)
	}
	return false
}

func (ss *session) ownerInFlight(owner uint64) bool {
	ss.mu.Lock()
	_, dup := ss.pending[owner]
	ss.mu.Unlock()
	return dup
}

// handleHello authenticates the connection (SPEC §7). An unknown tenant
// costs the same MAC computation and comparison as a wrong MAC, so the
// two cannot be told apart by timing.
func (ss *session) handleHello(req *codec.Request, fieldErr error) bool {
	if ss.welcomed || ss.sawRequest {
		ss.appendError(0, codec.BadRequest)
		return true
	}
	ss.sawRequest = true
	if fieldErr != nil {
		ss.srv.metrics.authFailures.Add(1)
		ss.appendError(0, codec.AuthFailed)
		return true
	}
	var serverMAC [codec.MACLen]byte
	if auth := ss.srv.cfg.Auth; auth != nil {
		secret, known := auth[string(req.Tenant)]
		want := codec.ClientMAC(secretOrDecoy(secret, known), ss.serverNonce, req.ClientNonce, req.Tenant)
		if !codec.EqualMAC(want, req.MAC) || !known {
			ss.srv.metrics.authFailures.Add(1)
			ss.appendError(0, codec.AuthFailed)
			return true
		}
		serverMAC = codec.ServerMAC(secret, req.ClientNonce, ss.serverNonce, req.Tenant)
	}
	ss.welcomed = true
	ss.tenant = string(req.Tenant)
	ss.ns = ss.srv.engine.Namespace(ss.tenant)
	ss.batch.buf = codec.AppendWelcome(ss.batch.buf, serverMAC)
	ss.batch.frames++
	ss.srv.metrics.countResult(opHello, resultWelcome)
	return false
}

// decoySecret keys the MAC computed for an unknown tenant.
var decoySecret = make([]byte, 32)

func secretOrDecoy(secret []byte, known bool) []byte {
	if known {
		return secret
	}
	return decoySecret
}

func (ss *session) acquire(req *codec.Request) {
	ss.mu.Lock()
	if len(ss.pending) >= ss.srv.cfg.MaxConnInflight {
		ss.mu.Unlock()
		ss.srv.metrics.connInflightBusy.Add(1)
		ss.appendOwnerOnly(opAcquire, codec.OpBusy, req.Owner)
		return
	}
	ss.pending[req.Owner] = pendingAcquire{}
	ss.mu.Unlock()

	lease := time.Duration(req.LeaseSeconds) * time.Second
	wait := time.Duration(req.WaitSeconds) * time.Second
	r, w := ss.srv.engine.Acquire(ss.ns, req.Key, req.Owner, lease, wait, ss)

	ss.mu.Lock()
	if r.Outcome != engine.Queued {
		delete(ss.pending, req.Owner)
	} else if _, stillQueued := ss.pending[req.Owner]; stillQueued {
		ss.pending[req.Owner] = pendingAcquire{wait: w, key: string(req.Key)}
	}
	ss.mu.Unlock()
	if r.Outcome != engine.Queued {
		ss.appendResult(opAcquire, req.Owner, r)
	}
}

// Resolve implements engine.Waiter. It runs under an engine shard lock on
// whatever goroutine resolved the waiter, so it only queues the answer and
// wakes the connection's loop.
func (ss *session) Resolve(owner uint64, r engine.Result) {
	ss.mu.Lock()
	p := ss.pending[owner]
	delete(ss.pending, owner)
	if ss.closed {
		ss.mu.Unlock()
		if r.Outcome == engine.Granted {
			ss.srv.adoptOrphan(orphan{ns: ss.ns, key: p.key, token: r.Token})
		}
		return
	}
	wake := len(ss.outbox) == 0
	ss.outbox = ss.srv.metrics.encodeResult(ss.outbox, opAcquire, owner, r)
	if r.Outcome == engine.ShuttingDown && !ss.closeOnWake {
		ss.closeOnWake = true
		ss.srv.pendingCloses.Add(1)
	}
	ss.mu.Unlock()
	if wake {
		_ = ss.gc.Wake(nil)
	}
}

// close drops the connection's queued waiters; the locks it holds stay.
// A peer whose stream ended inside a frame is told bad_request, in case
// it only half-closed and still reads.
func (ss *session) close(peerEnded bool) {
	if ss.partialFrame {
		ss.srv.markStalled(ss, false)
		if peerEnded {
			ss.appendError(0, codec.BadRequest)
			ss.flush()
		}
	}
	ss.mu.Lock()
	ss.closed = true
	waits := make([]*engine.Wait, 0, len(ss.pending))
	for _, p := range ss.pending {
		if p.wait != nil {
			waits = append(waits, p.wait)
		}
	}
	if ss.closeOnWake {
		ss.srv.pendingCloses.Add(-1)
	}
	ss.mu.Unlock()
	for _, w := range waits {
		ss.srv.engine.Cancel(w)
	}
}

func (ss *session) appendResult(op opKind, owner uint64, r engine.Result) {
	ss.batch.buf = ss.srv.metrics.encodeResult(ss.batch.buf, op, owner, r)
	ss.batch.frames++
}

func (ss *session) appendOwnerOnly(op opKind, respOp byte, owner uint64) {
	ss.batch.buf = codec.AppendOwnerOnly(ss.batch.buf, respOp, owner)
	ss.batch.frames++
	ss.srv.metrics.countResult(op, resultOf(respOp))
}

func (ss *session) appendError(owner uint64, reason codec.Reason) {
	ss.batch.buf = codec.AppendError(ss.batch.buf, owner, reason)
	ss.batch.frames++
	ss.srv.metrics.errors[reason].Add(1)
}

// batch collects responses for one write. An event loop serves one
// connection at a time and every pass ends with a flush, so one batch per
// loop serves all its connections: an idle connection costs no buffer.
type batch struct {
	buf    []byte
	frames int
}

func (ss *session) flush() {
	if len(ss.batch.buf) > 0 {
		_, _ = ss.gc.Write(ss.batch.buf)
		ss.srv.metrics.writes.Add(1)
	}
	ss.batch.buf = ss.batch.buf[:0]
	ss.batch.frames = 0
}

// waitedMs truncates: a client adds waited_ms to its send instant to bound
// the lease's end, so rounding down keeps that bound conservative.
func waitedMs(d time.Duration) uint32 {
	ms := d.Milliseconds()
	if ms > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(ms)
}
