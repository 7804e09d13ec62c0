package server

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

// defaultTenant is the namespace of a connection that never sends HELLO
// while auth is off.
const defaultTenant = "default"

// transport is what a session needs of its connection: a gnet connection
// on the client port, a crypto/tls one on the TLS port. Its methods are
// called from the connection's loop, except wake, which any goroutine may
// call.
type transport interface {
	// write queues b for the client; b is only borrowed during the call.
	write(b []byte)
	// outboundBuffered is how many written bytes the client has not yet
	// taken.
	outboundBuffered() int
	// wake makes the connection's loop run process again, with no new
	// bytes, soon: a callback resolved a request or a frame is overdue.
	wake()
	remoteAddr() net.Addr
}

// session is the state of one client connection. Fields above mu are
// touched only by the connection's loop (a gnet event loop, or the TLS
// port's per-connection lock); fields below it are shared with engine
// callbacks (grants, wait expiry) that run on other goroutines.
type session struct {
	srv *Server
	tr  transport
	// remote is the connection's remote address, for the origins table;
	// zero when it is not a TCP address.
	remote netip.AddrPort

	serverNonce [codec.NonceLen]byte
	welcomed    bool // a HELLO was accepted
	sawRequest  bool // any frame was handled, so HELLO may no longer come
	ns          engine.Namespace
	tenant      string
	// servesAbandon: this connection's GREETING set bit1 (SPEC §6a).
	servesAbandon bool
	// tenantOrigin is the tenant's part of its keys' names in the
	// origins table.
	tenantOrigin uint64
	// sessionKey is what the connection keeps of its SESSION's client_id
	// (SPEC §6a), 0 before one; the client_id itself is never kept.
	sessionKey engine.SessionKey
	// sawAcquire: an ACQUIRE was handled, so SESSION may no longer come.
	sawAcquire   bool
	req          codec.Request
	batch        *batch // on the client port, shared with the loop's other sessions
	partialFrame bool
	watched      bool // in the server's progress scan
	// writing is set around a write: a failed write makes gnet close the
	// connection, and so run close, from inside write.
	writing bool
	// gone is set by close: the connection is closed (its fd may already
	// serve another client), so nothing more may be written or done for it.
	gone bool
	// drained is the outbox's spare slice, swapped in on each delivery so
	// that steady-state grants allocate nothing.
	drained []resolution
	// frameStartedAt is read by the progress scan on another goroutine.
	frameStartedAt atomic.Int64
	// tenantConns is the tenant share this connection holds once
	// welcomed; nil without shares (conngates.go).
	tenantConns *tenantConns

	mu sync.Mutex
	// pending holds the owners of acquires in flight on this connection:
	// reserved before the engine sees them, so a grant racing the return
	// of Acquire still finds its entry.
	pending pendingTable
	outbox  []resolution
	// closeWhenIdle is set once a request was answered E shutting_down:
	// the connection closes when nothing is in flight on it any more, so
	// that every other request on it gets its own answer first.
	closeWhenIdle bool
	closed        bool
}

// resolution is a queued request's answer, left by a backend callback for
// the connection's loop to deliver.
type resolution struct {
	owner  uint64
	result engine.Result
	inFlight
}

// abandonIfGranted hands an undeliverable grant back to the backend, which
// releases it; other answers need nothing.
func (r resolution) abandonIfGranted(s *Server) {
	if r.result.Outcome == engine.Granted && r.async() == opUnknown {
		s.backend.ReleaseUndelivered(r.wait(), r.result.Token)
	}
}

// inFlight is what a connection keeps of a request in flight, in
// one interface value so that a queued waiter costs 16 bytes and no key:
// the queued acquire's handle (to cancel it or to abandon its grant),
// reservedAcquire until the backend has answered, or for an asynchronous
// RELEASE or KEEP (cluster mode) the asyncOp it is to be answered as —
// in flight for dup_owner all the same.
//
// origin is an acquire's key as the origins table names it, so that its
// grant can be recorded when delivered without the connection keeping
// the key.
type inFlight struct {
	h      engine.Handle
	origin uint64
}

// asyncOp marks an asynchronous RELEASE or KEEP in an inFlight; a
// one-byte value in an interface allocates nothing.
type asyncOp opKind

// reservedAcquire is an acquire the backend has not answered yet.
var reservedAcquire = inFlight{h: asyncOp(opUnknown)}

// queuedAcquire is an acquire of the key named origin that the backend
// queued, with its handle; without one (nil), not answered yet.
func queuedAcquire(h engine.Handle, origin uint64) inFlight {
	if h == nil {
		h = reservedAcquire.h
	}
	return inFlight{h: h, origin: origin}
}

// async is the op an asynchronous request is answered as, opUnknown for
// an acquire.
func (p inFlight) async() opKind {
	if op, ok := p.h.(asyncOp); ok {
		return opKind(op)
	}
	return opUnknown
}

// wait is a queued acquire's handle, nil for anything else.
func (p inFlight) wait() engine.Handle {
	if _, ok := p.h.(asyncOp); ok {
		return nil
	}
	return p.h
}

// newSession starts the session of a connection whose responses are
// collected in b; it returns the greeting to send first.
func newSession(s *Server, tr transport, b *batch) (*session, []byte, error) {
	ss := &session{
		srv:     s,
		tr:      tr,
		remote:  remoteAddrPort(tr.remoteAddr()),
		pending: newPendingTable(),
		batch:   b,
	}
	if b.latency == nil { // a batch's first session: the loop's or the TLS connection's
		b.latency = s.metrics.nextLatencyStripe()
		b.answers = make([]acquireAnswer, 0, ResponseBatch)
	}
	if _, err := rand.Read(ss.serverNonce[:]); err != nil {
		return nil, nil, fmt.Errorf("server nonce: %w", err)
	}
	if !s.budget.enterHandshake() {
		return nil, nil, errNoRoom
	}
	if s.cfg.Auth == nil {
		ss.tenant = defaultTenant
		ss.tenantOrigin = s.origins.tenantOrigin(defaultTenant)
		ss.ns = s.backend.Namespace(defaultTenant)
	}
	var flags uint8
	// Read per connection: a cluster node serves §6a only once every
	// group's log format has risen, which happens after it started.
	ss.servesAbandon = s.backend.ServesAbandon()
	if ss.servesAbandon {
		flags |= codec.GreetingAbandon
	}
	if s.cfg.Auth != nil {
		flags |= codec.GreetingAuthRequired
		// The handshake is on the progress clock from connect.
		ss.frameStartedAt.Store(int64(s.clock.Now()))
		ss.watched = true
		s.markStalled(ss, true)
	}
	return ss, codec.AppendGreeting(nil, flags, ss.serverNonce, s.cfg.NodeName), nil
}

// process is one pass of the connection's loop over the bytes it holds:
// it decodes every complete frame at the start of buf, answers them in
// batches of ResponseBatch per write, then writes what engine callbacks
// left in the outbox. A wake runs it with no new bytes. It returns how
// many bytes of buf it consumed and whether the connection must close.
func (ss *session) process(buf []byte) (consumed int, closing bool) {
	ss.batch.arrived = int64(ss.srv.clock.Now())
	consumed, closing = ss.handleFrames(buf)
	if ss.gone {
		// A write failed and gnet closed the connection under us.
		return consumed, true
	}
	if consumed > 0 {
		ss.srv.backend.Flush()
	}
	if !closing {
		closing = ss.checkProgress(consumed > 0, consumed < len(buf))
	}
	closing = ss.deliverResolutions(closing)
	ss.flush()
	if ss.gone || closing || ss.drainedIdle() {
		return consumed, true
	}
	if ss.tr.outboundBuffered() > ss.srv.cfg.MaxOutbound {
		ss.srv.metrics.slowDropped.Add(1)
		ss.srv.log.Warn().Str("remote", ss.tr.remoteAddr().String()).Msg("dropping a client that does not read its responses")
		return consumed, true
	}
	return consumed, false
}

// checkProgress runs the progress clock (SPEC §2): it starts when a frame
// is left incomplete and restarts only when a frame completes. With auth
// required it also runs from connect until WELCOME, so connections that
// never authenticate cannot hold --max-conns forever. It reports whether
// the clock ran out, after queuing the answer.
func (ss *session) checkProgress(progressed, partial bool) bool {
	awaitingHello := ss.srv.cfg.Auth != nil && !ss.welcomed
	if partial && !awaitingHello && (!ss.partialFrame || progressed) {
		ss.frameStartedAt.Store(int64(ss.srv.clock.Now()))
	}
	ss.partialFrame = partial
	watch := partial || awaitingHello
	if watch != ss.watched {
		ss.watched = watch
		ss.srv.markStalled(ss, watch)
	}
	limit := ProgressTimeout
	if awaitingHello {
		limit = HandshakeTimeout
	}
	if !watch || int64(ss.srv.clock.Now())-ss.frameStartedAt.Load() < int64(limit) {
		return false
	}
	ss.srv.metrics.progressTimeouts.Add(1)
	if partial {
		ss.appendError(0, codec.BadRequest)
	} else {
		ss.appendError(0, codec.AuthRequired)
	}
	return true
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
		closing := ss.handleFrame(&ss.req, err)
		if ss.req.Op == codec.OpSession {
			// The client_id is a bearer secret: nothing keeps it past
			// its frame (SPEC §6a).
			ss.req.ClientID = [codec.ClientIDLen]byte{}
		}
		if closing {
			return consumed, true
		}
		if ss.batch.frames >= ResponseBatch {
			ss.flush()
			if ss.gone {
				return consumed, true
			}
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
	if ss.outOfSessionOrder(req.Op) {
		ss.appendError(req.Owner, codec.BadRequest)
		return true
	}
	if req.Op == codec.OpAcquire {
		// Any ACQUIRE, answered or refused, ends the time for SESSION.
		ss.sawAcquire = true
	}
	if ss.srv.draining.Load() {
		ss.appendError(req.Owner, codec.ShuttingDown)
		ss.mu.Lock()
		ss.markCloseWhenIdleLocked()
		ss.mu.Unlock()
		return false
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
		return ss.acquire(req)
	case codec.OpRelease:
		if ss.srv.asyncAnswers {
			ss.releaseAsync(req)
			break
		}
		r := ss.srv.backend.Release(ss.ns, req.Key, req.Owner, req.Token, nil)
		ss.appendResult(opRelease, req.Owner, r)
	case codec.OpKeep:
		lease := time.Duration(req.LeaseSeconds) * time.Second
		if ss.srv.asyncAnswers {
			ss.keepAsync(req, lease)
			break
		}
		r := ss.srv.backend.Keep(ss.ns, req.Key, req.Owner, req.Token, lease, nil)
		ss.appendResult(opKeep, req.Owner, r)
	case codec.OpPing:
		ss.appendOwnerOnly(opPing, codec.OpPong, req.Owner)
	case codec.OpSession:
		ss.sessionKey = engine.NewSessionKey(req.ClientID)
		ss.appendOwnerOnly(opSession, codec.OpPong, req.Owner)
	case codec.OpAbandon:
		ss.abandon(req)
	}
	return false
}

// outOfSessionOrder reports a SESSION or ABANDON that SPEC §6a answers E
// bad_request and closes: a second SESSION, a SESSION after an ACQUIRE,
// an ABANDON before SESSION; and either one on a server that does not
// serve §6a (GREETING without bit1), where they are unknown ops.
func (ss *session) outOfSessionOrder(op byte) bool {
	switch op {
	case codec.OpSession:
		return !ss.servesAbandon || ss.sessionKey != 0 || ss.sawAcquire
	case codec.OpAbandon:
		return !ss.servesAbandon || ss.sessionKey == 0
	}
	return false
}

// abandon answers an ABANDON (SPEC §6a) of the session's request
// req.Target: R when its grant was released, N otherwise. Like RELEASE it
// passes no admission limit, --max-conn-inflight included.
func (ss *session) abandon(req *codec.Request) {
	r := ss.sessionKey.Requester(req.Target)
	if ss.srv.asyncAnswers {
		ss.reserveAsync(req.Owner, opAbandon)
		ss.answerAsync(opAbandon, req.Owner, ss.srv.backend.Abandon(ss.ns, req.Key, req.Owner, r, ss))
		return
	}
	ss.appendResult(opAbandon, req.Owner, ss.srv.backend.Abandon(ss.ns, req.Key, req.Owner, r, nil))
}

func (ss *session) ownerInFlight(owner uint64) bool {
	ss.mu.Lock()
	_, dup := ss.pending.get(owner)
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
		tc, ok := ss.srv.budget.welcome(string(req.Tenant))
		if !ok {
			// The tenant holds its share: closed without an answer, as a
			// connection past --max-conns is.
			ss.welcomed = true // holds nothing any more
			return true
		}
		ss.tenantConns = tc
	} else if !ss.srv.admitOpenTenant(req.Tenant) {
		ss.srv.metrics.authFailures.Add(1)
		ss.appendError(0, codec.AuthFailed)
		return true
	}
	ss.welcomed = true
	ss.tenant = string(req.Tenant)
	ss.tenantOrigin = ss.srv.origins.tenantOrigin(ss.tenant)
	ss.ns = ss.srv.backend.Namespace(ss.tenant)
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

// acquire answers an ACQUIRE at once or leaves it queued. It never closes
// the connection itself: a shutting_down answer closes it once idle.
func (ss *session) acquire(req *codec.Request) bool {
	ss.mu.Lock()
	if ss.pending.len() >= ss.srv.cfg.MaxConnInflight {
		ss.mu.Unlock()
		ss.srv.metrics.connInflightBusy.Add(1)
		ss.appendOwnerOnly(opAcquire, codec.OpBusy, req.Owner)
		ss.batch.answeredAcquire(acquireBusy, ss.batch.arrived)
		return false
	}
	origin := ss.srv.origins.originKey(ss.tenantOrigin, req.Key)
	ss.pending.put(req.Owner, queuedAcquire(nil, origin))
	ss.mu.Unlock()

	lease := time.Duration(req.LeaseSeconds) * time.Second
	wait := time.Duration(req.WaitSeconds) * time.Second
	r, w := ss.srv.backend.Acquire(ss.ns, req.Key, req.Owner, ss.sessionKey.Requester(req.Owner), lease, wait, ss)

	ss.mu.Lock()
	switch _, stillQueued := ss.pending.get(req.Owner); {
	case r.Outcome != engine.Queued:
		ss.pending.remove(req.Owner)
		if r.Outcome == engine.ShuttingDown {
			ss.markCloseWhenIdleLocked()
		}
	case stillQueued:
		ss.pending.put(req.Owner, queuedAcquire(w, origin))
	default:
		// Resolved before Acquire returned: give its answer the handle
		// an abandoned grant needs if the connection closes first.
		for i := range ss.outbox {
			if ss.outbox[i].owner == req.Owner {
				ss.outbox[i].inFlight = queuedAcquire(w, origin)
			}
		}
	}
	ss.mu.Unlock()
	if r.Outcome == engine.Queued {
		return false
	}
	ss.appendAcquireResult(req.Owner, origin, r)
	ss.batch.answeredAcquire(acquireOutcomeOf(r.Outcome), ss.batch.arrived)
	return false
}

// markCloseWhenIdleLocked notes that the connection closes once nothing
// is in flight on it (SPEC §9: shutting_down closes); Close waits for it.
// Called with ss.mu held.
func (ss *session) markCloseWhenIdleLocked() {
	if !ss.closeWhenIdle {
		ss.closeWhenIdle = true
		ss.srv.pendingCloses.Add(1)
	}
}

// drainedIdle reports whether a connection that answered shutting_down
// has nothing in flight and nothing left to write: then it closes. Loop
// only.
func (ss *session) drainedIdle() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.closeWhenIdle && ss.pending.len() == 0 && len(ss.outbox) == 0
}

// releaseAsync hands a RELEASE to a backend that answers it through
// Resolve. The owner is reserved first, as for an acquire, so an answer
// racing the return still finds its entry. Releases pass no admission
// limit, --max-conn-inflight included.
func (ss *session) releaseAsync(req *codec.Request) {
	ss.reserveAsync(req.Owner, opRelease)
	r := ss.srv.backend.Release(ss.ns, req.Key, req.Owner, req.Token, ss)
	ss.answerAsync(opRelease, req.Owner, r)
}

// keepAsync is releaseAsync for a KEEP: no admission limit either.
func (ss *session) keepAsync(req *codec.Request, lease time.Duration) {
	ss.reserveAsync(req.Owner, opKeep)
	r := ss.srv.backend.Keep(ss.ns, req.Key, req.Owner, req.Token, lease, ss)
	ss.answerAsync(opKeep, req.Owner, r)
}

func (ss *session) reserveAsync(owner uint64, op opKind) {
	ss.mu.Lock()
	ss.pending.put(owner, inFlight{h: asyncOp(op)})
	ss.mu.Unlock()
}

// answerAsync answers at once what the backend did not queue.
func (ss *session) answerAsync(op opKind, owner uint64, r engine.Result) {
	if r.Outcome == engine.Queued {
		return
	}
	ss.mu.Lock()
	ss.pending.remove(owner)
	ss.mu.Unlock()
	ss.appendResult(op, owner, r)
}

// Resolve implements engine.Waiter. It runs under an engine shard lock on
// whatever goroutine resolved the waiter, so it only queues the answer and
// wakes the connection's loop.
func (ss *session) Resolve(owner uint64, r engine.Result) {
	ss.mu.Lock()
	p, _ := ss.pending.remove(owner)
	res := resolution{owner: owner, result: r, inFlight: p}
	if ss.closed {
		ss.mu.Unlock()
		res.abandonIfGranted(ss.srv)
		return
	}
	wake := len(ss.outbox) == 0
	ss.outbox = append(ss.outbox, res)
	if r.Outcome == engine.ShuttingDown {
		ss.markCloseWhenIdleLocked()
	}
	ss.mu.Unlock()
	if wake && !ss.batch.enlist(ss) {
		ss.wake()
	}
}

// wake makes the connection's loop run a pass for it soon; any goroutine.
func (ss *session) wake() {
	ss.srv.metrics.wakeups.Add(1)
	ss.tr.wake()
}

// deliverResolutions answers what backend callbacks resolved since the
// last pass. On a connection that is closing nobody will read them, so a
// grant among them is released by the server instead of being written
// after the closing E. It reports whether the connection must close.
func (ss *session) deliverResolutions(closing bool) bool {
	ss.mu.Lock()
	resolved := ss.outbox
	ss.outbox = ss.drained
	ss.mu.Unlock()
	for _, r := range resolved {
		if closing {
			r.abandonIfGranted(ss.srv)
			continue
		}
		op := opAcquire
		if async := r.async(); async != opUnknown {
			op = async
		}
		if op != opAcquire {
			ss.appendResult(op, r.owner, r.result)
		} else {
			ss.appendAcquireResult(r.owner, r.origin, r.result)
			ss.batch.answeredAcquire(acquireOutcomeOf(r.result.Outcome), ss.srv.arrivalOf(r.wait(), ss.batch.arrived))
			if r.result.Outcome == engine.Granted && r.result.Waited > 0 {
				ss.batch.latency.queueWait.Observe(r.result.Waited)
			}
		}
		if ss.batch.frames >= ResponseBatch {
			ss.flush()
		}
	}
	ss.drained = resolved[:0]
	return closing
}

// close drops the connection's queued waiters; the locks it holds stay.
// A peer whose stream ended inside a frame is told bad_request, in case
// it only half-closed and still reads.
func (ss *session) close(peerEnded bool) {
	if ss.watched {
		ss.srv.markStalled(ss, false)
	}
	if ss.partialFrame && peerEnded && !ss.writing {
		ss.appendError(0, codec.BadRequest)
		ss.flush()
	}
	ss.gone = true
	ss.srv.budget.leave(ss.welcomed, ss.tenantConns)
	ss.mu.Lock()
	ss.closed = true
	for _, r := range ss.outbox {
		r.abandonIfGranted(ss.srv)
	}
	ss.outbox = nil
	waits := make([]engine.Handle, 0, ss.pending.len())
	ss.pending.each(func(_ uint64, p inFlight) {
		if w := p.wait(); w != nil {
			waits = append(waits, w)
		}
	})
	if ss.closeWhenIdle {
		ss.srv.pendingCloses.Add(-1)
	}
	ss.mu.Unlock()
	for _, w := range waits {
		ss.srv.backend.Cancel(w)
	}
}
