// Package client is the official Go client of lockd. It turns Acquire,
// Release and Renew into wire frames under the rules of SPEC §6 — durations
// validated before sending, one operation deadline per call, no
// retransmission once a byte may have left, a delivery gate that hands out
// only Tickets with enough validity left, and bounded compensating
// releases. It owns the client side of the wire and the caller's view of a
// lease; it speaks to servers only through the protocol and the codec, and
// never imports the server or the engine.
//
// # Sessions
//
// A Client holds two kinds of authenticated connection ("sessions").
//
// Shared sessions (Config.Sessions, default one per server address) carry
// every release and every acquire with Wait 0, pipelined: the requests of
// concurrent callers that queue while a session's writer is busy go out in
// one write, and every answer one read brings in is handed to its caller
// under one hold of the session's lock, so on a busy client many requests
// share each system call and each wake-up.
//
// Wait sessions carry one waiting acquire (Wait > 0) at a time. The
// server's wait is never shorter than the caller's, so a waiting acquire
// that waits its whole time has no answer when its deadline comes, and
// SPEC §6 then requires closing its session. Alone on it, that costs only
// the one call — no other caller's request is in flight there — and the
// error says why (ErrIndeterminate and ErrWaitElapsed). The pool keeps
// Config.WaitSpares (default 2) wait sessions connected and authenticated
// ahead of need and replaces a closed one in the background, so the next
// waiting acquire does not pay a dial and a handshake. At most
// Config.WaitSessions (default 64) are open: beyond that a waiting acquire
// waits in the client, certainly unsent, for one to come back, and ends
// ErrTimeout if its deadline comes first. Wait sessions beyond the spares
// that stay idle for a minute are closed.
//
// The costs: one connection per waiting acquire in flight (so a server
// sees up to Sessions + WaitSessions connections per Client), and at most
// one reconnect for each waiting acquire that runs out on a lock that
// stays held — Stats.Reconnects and Stats.AbandonedSessions count them.
//
// # Giving back what the client never saw
//
// Where a server's GREETING offers it (SPEC §6a), every connection first
// declares the client's SESSION: a random client_id drawn once per
// Client. An acquire that ends ErrIndeterminate with its session closed
// — the connection cut, the server silent, or the call's deadline or
// context come after its request may have left — may have been granted
// unseen. The client gives it back with an ABANDON naming the request,
// sent on another session (another server when one is down) through the
// queue of compensating releases and under their rules: IODeadline from
// the enqueue, retries and reconnects included; RELEASED or NOT HELD ends
// it, no answer is never success, and a full queue (see
// Config.CompensationQueue) or the end of the 5 s leaves the grant to its
// lease.
// The caller's error stays ErrIndeterminate and says what was queued.
// Stats counts the abandons sent, answered and given up. An acquire
// certainly not sent, or one whose answer arrived, is never abandoned.
//
// # Silence
//
// A session with a request in flight that hears nothing from its server
// for Config.SilenceTimeout (default 2 s) is closed like one whose
// deadline came: a stopped or cut-off server would otherwise hold its
// waiting acquires, and their keys, for their whole wait. Its acquires
// end ErrIndeterminate and are abandoned; its releases and renewals are
// retried on other sessions within their own deadline. While a request
// is in flight the client sends PING each third of the timeout that
// passed without a word from the server, so a live server, even one
// holding a waiting acquire for minutes, keeps its session.
//
// # Contexts
//
// A call's context can end it early, under the same rules as its deadline.
// Calls on the shared sessions under a context that many of them share —
// a service's base context, say — do not each select on its Done channel:
// once eight calls in a row came with it, the client watches that context
// (one at a time, until it ends) and ends its calls itself when it ends,
// so each call waits on its answer alone. Other contexts are selected on
// per call.
//
// # Renewing a lease
//
// Ticket.Renew sends KEEP for the Ticket's token on a shared session,
// under the time rules of a release: IODeadline from the call, retries
// included, never an unbounded wait. Only a correlated ACQUIRED — which
// carries the same token — moves the Ticket's validity, to the send
// instant of that KEEP plus the new lease, minus the drift margin; NOT
// HELD ends the validity and closes Lost; no answer leaves the old
// validity in force, never assumed extended. Ticket.KeepAlive renews at a
// fixed interval until its context ends, and returns early only when the
// lock is lost: NOT HELD, or a validity that ran out before a renewal was
// confirmed. Renew allocates nothing in steady state.
package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/defaults"
)

const (
	defaultMaxInFlight       = 4096
	defaultWaitSessions      = 64
	defaultWaitSpares        = 2
	defaultDialTimeout       = 5 * time.Second
	defaultCompensationQueue = 256
	defaultSilenceTimeout    = 2 * time.Second
	// minSilenceTimeout keeps a session from being closed by a scheduling
	// hiccup, and its PINGs few.
	minSilenceTimeout   = 100 * time.Millisecond
	compensationWorkers = 4
	// maxAttempts bounds the retries of one call; each needs a session to
	// fail under it, so real calls end at their deadline long before.
	maxAttempts = 16
	// maxPickRounds bounds how often one call waits for a session to
	// become ready.
	maxPickRounds = 1024
	reconnectMin  = 50 * time.Millisecond
	reconnectMax  = 2 * time.Second
	// releaseBackoffMin and releaseBackoffMax space the retries of a
	// release that every session was too full to take, or that a draining
	// or leaderless server refused: such a refusal comes back at once, and
	// retrying at once would spend the release's 5 s in a few
	// milliseconds.
	releaseBackoffMin = 20 * time.Millisecond
	releaseBackoffMax = 500 * time.Millisecond
)

// Config configures Dial.
type Config struct {
	// Addrs are the servers, "host:port"; at least one. Sessions are
	// spread over them and move on to the next address when one fails.
	Addrs []string
	// Tenant is the tenant's name; required with Secret. Empty with no
	// Secret means the server's default tenant, without HELLO.
	Tenant string
	// Secret is the tenant's shared secret. With a secret the client
	// authenticates and insists that the server proves the secret too.
	Secret []byte
	// Sessions is the number of shared, pipelined sessions, which carry
	// releases and acquires with Wait 0; default one per address in Addrs.
	Sessions int
	// MaxInFlight caps the acquires queued or in flight per shared
	// session; default 4096, the server's default per connection.
	// Releases have a reserve of a quarter more, so that a pool full of
	// acquires can still release.
	MaxInFlight int
	// WaitSessions caps the wait sessions, each carrying one acquire with
	// a Wait at a time; default 64.
	WaitSessions int
	// WaitSpares is how many idle wait sessions the client keeps
	// connected ahead of need; default 2, negative for none (the first
	// waiting acquire then waits for a dial).
	WaitSpares int
	// DialTimeout bounds a connect plus handshake; default 5 s.
	DialTimeout time.Duration
	// CompensationQueue bounds the compensating releases waiting to be
	// sent; default 256. When it is full, a lock the client could not hand
	// over is left to its lease, and Stats counts it.
	CompensationQueue int
	// SilenceTimeout closes a session that hears nothing from its server
	// for this long while a request is in flight on it, as if that
	// request's deadline had come (SPEC §6a): an acquire in flight ends
	// ErrIndeterminate and is abandoned, a release or renewal moves to
	// another session. While a request waits, the client sends PING every
	// third of it, so a live server, even one holding a waiting acquire
	// for minutes, always breaks the silence; a session is closed after
	// at least SilenceTimeout of silence and at most about a third more.
	// Default 2 s; at least 100 ms.
	SilenceTimeout time.Duration
	// Dialer opens connections; default a net.Dialer.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS, when set, runs every session over TLS with this configuration
	// (the server's TLS port, lockd serve --tls-listen), the handshake
	// within DialTimeout. An empty ServerName is taken from each address's
	// host. LoadTLSConfig builds one from PEM files.
	TLS *tls.Config
}

func (cfg Config) normalize() (Config, error) {
	if len(cfg.Addrs) == 0 {
		return cfg, fmt.Errorf("%w: no server address", ErrConfig)
	}
	for _, a := range cfg.Addrs {
		if a == "" {
			return cfg, fmt.Errorf("%w: empty server address", ErrConfig)
		}
	}
	if cfg.Tenant != "" && !codec.ValidTenant([]byte(cfg.Tenant)) {
		return cfg, fmt.Errorf("%w: tenant %q is not 1..32 bytes of [A-Za-z0-9._-]", ErrConfig, cfg.Tenant)
	}
	if len(cfg.Secret) != 0 && cfg.Tenant == "" {
		return cfg, fmt.Errorf("%w: a secret needs a tenant", ErrConfig)
	}
	if cfg.Sessions < 0 || cfg.MaxInFlight < 0 || cfg.WaitSessions < 0 || cfg.DialTimeout < 0 || cfg.CompensationQueue < 0 || cfg.SilenceTimeout < 0 {
		return cfg, fmt.Errorf("%w: negative Sessions, MaxInFlight, WaitSessions, DialTimeout, CompensationQueue or SilenceTimeout", ErrConfig)
	}
	cfg.Addrs = append([]string(nil), cfg.Addrs...)
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	cfg.Sessions = defaults.Or(cfg.Sessions, len(cfg.Addrs))
	cfg.MaxInFlight = defaults.Or(cfg.MaxInFlight, defaultMaxInFlight)
	cfg.WaitSessions = defaults.Or(cfg.WaitSessions, defaultWaitSessions)
	switch {
	case cfg.WaitSpares == 0:
		cfg.WaitSpares = min(defaultWaitSpares, cfg.WaitSessions)
	case cfg.WaitSpares > cfg.WaitSessions:
		return cfg, fmt.Errorf("%w: WaitSpares %d exceeds WaitSessions %d", ErrConfig, cfg.WaitSpares, cfg.WaitSessions)
	}
	cfg.DialTimeout = defaults.Or(cfg.DialTimeout, defaultDialTimeout)
	cfg.CompensationQueue = defaults.Or(cfg.CompensationQueue, defaultCompensationQueue)
	cfg.SilenceTimeout = defaults.Or(cfg.SilenceTimeout, defaultSilenceTimeout)
	if cfg.SilenceTimeout < minSilenceTimeout {
		return cfg, fmt.Errorf("%w: SilenceTimeout %v is below %v", ErrConfig, cfg.SilenceTimeout, minSilenceTimeout)
	}
	if cfg.Dialer == nil {
		cfg.Dialer = (&net.Dialer{}).DialContext
	}
	return cfg, nil
}

// Client is a pool of sessions to lockd. It is safe for concurrent use.
type Client struct {
	cfg            Config
	clock          clock
	releaseReserve int
	// clientID is sent in the SESSION of every connection (SPEC §6a): a
	// bearer secret that lets this client, and only it, abandon its own
	// ACQUIREs. Held through a pointer so that printing a Client (%v,
	// %+v, %#v) shows an address, never the bytes.
	clientID *[codec.ClientIDLen]byte

	slots []slot
	next  atomic.Uint64 // round-robin start of session picks
	ready atomic.Pointer[readiness]
	waits *waitPool

	watch        atomic.Pointer[contextWatch]
	unwatched    atomic.Value // <-chan struct{}: the last Done no watch had
	unwatchedRun atomic.Int32 // calls in a row that came with it

	lastOwner atomic.Uint64
	requests  sync.Pool

	compMu     sync.Mutex
	compClosed bool
	compQueue  chan compensation
	compWG     sync.WaitGroup

	watches watches
	stats   counters

	closing   atomic.Bool   // refuses new calls
	stopping  chan struct{} // closed once compensations are drained
	lifetime  context.Context
	stop      context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// slot is one place in the pool; its maintainer keeps a session in it.
type slot struct {
	session  atomic.Pointer[session]
	nextAddr int // owned by whoever dials for the slot
}

// readiness is closed and replaced whenever a session becomes ready, to
// wake callers waiting for one.
type readiness struct{ ch chan struct{} }

type counters struct {
	reconnects, protocolErrors, abandoned, silentSessions                atomic.Uint64
	compensationsQueued, compensationsDone, compensationsFailed, dropped atomic.Uint64
	abandonsSent, abandonsReleased, abandonsNotHeld, abandonsGivenUp     atomic.Uint64
}

// Stats are counters of a Client's life.
type Stats struct {
	// Sessions is the number of shared sessions connected now.
	Sessions int
	// WaitSessions is the number of wait sessions open or being dialled
	// now, WaitSessionsIdle those ready for the next waiting acquire.
	WaitSessions, WaitSessionsIdle int
	// Reconnects counts the sessions dialled after Dial returned to
	// replace one that closed.
	Reconnects uint64
	// AbandonedSessions counts sessions closed because a call ended after
	// its request may have been sent (SPEC §6) — on a wait session, the
	// waiting acquire that ran out.
	AbandonedSessions uint64
	// SilentSessions counts sessions closed because their server said
	// nothing for Config.SilenceTimeout while a request was in flight.
	SilentSessions uint64
	// ProtocolErrors counts sessions closed because the server broke the
	// protocol.
	ProtocolErrors uint64
	// CompensationsQueued counts compensating releases queued by the
	// delivery gate; CompensationsDone those answered RELEASED or NOT
	// HELD; CompensationsFailed those without an answer within 5 s.
	CompensationsQueued, CompensationsDone, CompensationsFailed uint64
	// CompensationsDropped counts locks left to lease expiry because the
	// compensation queue was full or the client was closing.
	CompensationsDropped uint64
	// AbandonsSent counts the acquires that ended ErrIndeterminate with
	// their session closed and were given back with an ABANDON (SPEC §6a)
	// that left for a server, each once however often it was retried.
	// AbandonsReleased counts those answered RELEASED (the server had
	// granted the lock and freed it), AbandonsNotHeld those answered NOT
	// HELD (a waiter dropped, or nothing to give back). AbandonsGivenUp
	// counts the acquires left to their lease instead: the compensation
	// queue was full, the client was closing, or no RELEASED or NOT HELD
	// came within 5 s of the enqueue. An acquire on a server that does
	// not serve ABANDON is counted in none of them.
	AbandonsSent, AbandonsReleased, AbandonsNotHeld, AbandonsGivenUp uint64
}

// Dial connects the pool: it tries every session once (each through the
// addresses in turn, each address bounded by DialTimeout) and returns
// when at least one is ready; the others keep redialling in the
// background. It fails if no address can
// be reached, or on any authentication or TLS failure: a server that cannot prove
// the secret is not to be used through another session either.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	return dial(ctx, cfg, systemClock{})
}

func dial(ctx context.Context, cfg Config, clk clock) (*Client, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:            cfg,
		clock:          clk,
		releaseReserve: max(cfg.MaxInFlight/4, 1),
		slots:          make([]slot, cfg.Sessions),
		compQueue:      make(chan compensation, cfg.CompensationQueue),
		stopping:       make(chan struct{}),
		clientID:       new([codec.ClientIDLen]byte),
	}
	rand.Read(c.clientID[:])
	c.lifetime, c.stop = context.WithCancel(context.Background())
	c.ready.Store(&readiness{ch: make(chan struct{})})
	c.requests.New = func() any {
		return &request{done: make(chan struct{}, 1), handoff: make(chan *session, 1), timer: clk.NewTimer(), heapIndex: notInHeap}
	}
	c.waits = newWaitPool(c)

	errs := make([]error, len(c.slots))
	var dialing sync.WaitGroup
	for i := range c.slots {
		c.slots[i].nextAddr = i % len(cfg.Addrs)
		dialing.Go(func() {
			var s *session
			s, errs[i] = c.connectSlot(ctx, &c.slots[i], len(cfg.Addrs))
			c.slots[i].session.Store(s)
		})
	}
	dialing.Wait()
	connected := 0
	for i := range c.slots {
		if c.slots[i].session.Load() != nil {
			connected++
		}
	}
	if authErr := firstAuthError(errs); connected == 0 || authErr != nil {
		for i := range c.slots {
			if s := c.slots[i].session.Load(); s != nil {
				s.fail(errClientClosing)
			}
		}
		c.stop()
		c.wg.Wait()
		if authErr != nil {
			return nil, readable(authErr)
		}
		return nil, readable(errors.Join(errs...))
	}
	for i := range c.slots {
		c.wg.Add(1)
		go c.maintain(&c.slots[i])
	}
	c.wg.Add(1)
	go c.waits.run()
	c.waits.poke()
	for range compensationWorkers {
		c.compWG.Go(c.runCompensations)
	}
	return c, nil
}

// firstAuthError finds a refused identity, the server's or this client's,
// which no other session would fare better with.
func firstAuthError(errs []error) error {
	for _, err := range errs {
		if errors.Is(err, ErrAuth) || errors.Is(err, ErrTLS) {
			return err
		}
	}
	return nil
}

// connectSlot tries up to tries addresses, starting at the slot's next
// one, and keeps the address that worked for the slot's next dial.
func (c *Client) connectSlot(ctx context.Context, sl *slot, tries int) (*session, error) {
	var errs []error
	for range tries {
		addr := c.cfg.Addrs[sl.nextAddr]
		s, err := c.connect(ctx, addr, c.cfg.MaxInFlight+c.releaseReserve, nil)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		sl.nextAddr = (sl.nextAddr + 1) % len(c.cfg.Addrs)
		if errors.Is(err, ErrAuth) || ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// maintain keeps the slot's session alive for the client's lifetime:
// when it dies, it dials the next address with capped exponential backoff.
func (c *Client) maintain(sl *slot) {
	defer c.wg.Done()
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	delay := reconnectMin
	for {
		if s := sl.session.Load(); s != nil {
			select {
			case <-s.dead:
				sl.session.Store(nil)
			case <-c.stopping:
				s.fail(errClientClosing)
				return
			}
		}
		s, err := c.connectSlot(c.lifetime, sl, 1)
		if err != nil {
			backoff.Reset(delay)
			select {
			case <-backoff.C:
			case <-c.stopping:
				return
			}
			delay = min(2*delay, reconnectMax)
			continue
		}
		delay = reconnectMin
		c.stats.reconnects.Add(1)
		sl.session.Store(s)
		c.announceReady()
	}
}

func (c *Client) announceReady() {
	old := c.ready.Swap(&readiness{ch: make(chan struct{})})
	close(old.ch)
}

// nextOwner hands out the client-wide owner ids: distinct, non-zero, and
// never wrapping — at the end of the range the client fails closed.
func (c *Client) nextOwner() (uint64, error) {
	for {
		last := c.lastOwner.Load()
		if last == math.MaxUint64 {
			return 0, ErrOwnerExhausted
		}
		if c.lastOwner.CompareAndSwap(last, last+1) {
			return last + 1, nil
		}
	}
}

// newRequest returns a pooled request with the single deadline of the
// call: the one the call's duration gives, or the context's if that is
// earlier.
func (c *Client) newRequest(ctx context.Context, kind opKind, owner uint64, key string, now, deadline time.Time) *request {
	// Rebased on now, so that the one deadline of the call is monotonic
	// even when the context's deadline carries only a wall-clock reading.
	if d, ok := ctx.Deadline(); ok {
		if left := d.Sub(now); left < deadline.Sub(now) {
			deadline = now.Add(left)
		}
	}
	req := c.requests.Get().(*request)
	req.kind, req.owner, req.key, req.deadline = kind, owner, key, deadline
	return req
}

// freeRequest pools req again; its timer is stopped already, by the wait
// that armed it.
func (c *Client) freeRequest(req *request) {
	*req = request{done: req.done, handoff: req.handoff, timer: req.timer, heapIndex: notInHeap}
	c.requests.Put(req)
}

// errPoolFull is a pick that found every ready session at its limit.
var errPoolFull = errors.New("every session is at its in-flight limit")

// errDeadline is a pick that reached the call's deadline.
var errDeadline = errors.New("operation deadline reached")

// errClientClosing is the cause recorded on the sessions Close ends; it is
// not ErrClosed, which promises that nothing was sent.
var errClientClosing = errors.New("session closed by Client.Close")

// pick enqueues req on a ready shared session, round-robin, waiting for
// one to become ready if none is. Waiting is the local queue of SPEC §6:
// its end at the deadline is certainly unsent.
func (c *Client) pick(ctx context.Context, req *request, limit int) (*session, error) {
	// A context already done must not reach a writer: once taken, the
	// request could only end by closing a session other calls share.
	if ctx.Err() != nil {
		req.expired = true
		return nil, context.Cause(ctx)
	}
	n := uint64(len(c.slots))
	for range maxPickRounds {
		ready := c.ready.Load()
		full := false
		start := c.next.Add(1)
		for i := range n {
			s := c.slots[(start+i)%n].session.Load()
			if s == nil || (req.kind == opAbandon && !s.servesAbandon) {
				continue
			}
			switch s.enqueue(req, limit) {
			case enqueued:
				return s, nil
			case sessionFull:
				full = true
			}
		}
		if full {
			return nil, errPoolFull
		}
		if _, err := waitLocally(c, ctx, req, ready.ch); err != nil {
			return nil, err
		}
	}
	return nil, ErrNotConnected
}

// pickWait enqueues a waiting acquire alone on a wait session.
func (c *Client) pickWait(ctx context.Context, req *request) (*session, error) {
	if ctx.Err() != nil {
		req.expired = true
		return nil, context.Cause(ctx)
	}
	for range maxPickRounds {
		s, err := c.waits.take(ctx, req)
		if err != nil {
			return nil, err
		}
		if s.enqueue(req, 1) == enqueued {
			return s, nil
		}
		// It closed since the pool handed it out; died accounts for it.
	}
	return nil, ErrNotConnected
}

// waitLocally waits for ch within req's deadline and ctx: a wait in the
// client, before anything is sent, so its end is certainly unsent.
func waitLocally[T any](c *Client, ctx context.Context, req *request, ch <-chan T) (T, error) {
	req.timer.Reset(req.deadline.Sub(c.clock.Now()))
	defer req.timer.Stop()
	var zero T
	select {
	case v := <-ch:
		return v, nil
	case <-req.timer.C():
		req.expired = true
		return zero, errDeadline
	case <-ctx.Done():
		req.expired = true
		return zero, context.Cause(ctx)
	case <-c.stopping:
		return zero, ErrClosed
	}
}

// await waits for req's outcome. The session ends it at its deadline; a
// context that ends first abandons it, or, when it is watched, has ended
// it already, unless it ended before the request entered the session.
func (c *Client) await(ctx context.Context, s *session, req *request) outcome {
	if req.watch != nil {
		if req.watch.ended.Load() {
			return s.abandon(req)
		}
		<-req.done
		return req.out
	}
	if done := ctx.Done(); done != nil {
		select {
		case <-req.done:
			return req.out
		case <-done:
			return s.abandon(req)
		}
	}
	<-req.done
	return req.out
}

// exchange runs req until it has an outcome no retry may change. A
// certainly-unsent attempt moves to another session with the same owner.
// A release (retrySent) is also retried when it may have been lost — a
// repeat cannot turn into a second grant — and, after a backoff, when
// every session was full or a draining or leaderless server refused it.
// pick's error means the last attempt was never enqueued.
func (c *Client) exchange(ctx context.Context, req *request, limit int, retrySent bool) (outcome, error) {
	out := outNone
	backoff := releaseBackoffMin
	waiting := req.kind == opAcquire && !req.immediate
	if !waiting {
		req.watch = c.watchFor(ctx)
	}
	for range maxAttempts {
		var s *session
		var err error
		if waiting {
			s, err = c.pickWait(ctx, req)
		} else {
			s, err = c.pick(ctx, req, limit)
		}
		if retrySent && errors.Is(err, errPoolFull) && c.pause(ctx, req, &backoff) {
			continue
		}
		if err != nil {
			return outNone, err
		}
		out = c.await(ctx, s, req)
		if waiting {
			c.waits.put(s)
		}
		if out == outLost {
			req.mayHaveLeft = true
		}
		refused := out == outRejected && (req.reason == codec.ShuttingDown || req.reason == codec.Unavailable)
		switch {
		case req.expired:
			return out, nil
		case out == outUnsent, retrySent && out == outLost:
		case retrySent && refused:
			if !c.pause(ctx, req, &backoff) {
				return out, nil
			}
		default:
			return out, nil
		}
	}
	if out == outUnsent {
		return outNone, ErrNotConnected
	}
	return out, nil
}

// pause waits out *backoff, doubling it, and reports false when the call's
// deadline or context comes first.
func (c *Client) pause(ctx context.Context, req *request, backoff *time.Duration) bool {
	t := c.clock.NewTimer()
	defer t.Stop()
	t.Reset(*backoff)
	*backoff = min(2**backoff, releaseBackoffMax)
	_, err := waitLocally(c, ctx, req, t.C())
	return err == nil
}
