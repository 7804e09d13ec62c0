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
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
)

// reconnectMin and reconnectMax bound the backoff of a slot's redials.
const (
	reconnectMin = 50 * time.Millisecond
	reconnectMax = 2 * time.Second
)

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
	// quietAddrs steers dials away from addresses that went silent.
	quietAddrs quietAddrs
	ready      atomic.Pointer[readiness]
	waits      *waitPool

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
		quietAddrs:     newQuietAddrs(cfg.Addrs, cfg.SilenceTimeout),
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
		sl.nextAddr = c.quietAddrs.from(sl.nextAddr, c.clock.Now())
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

// errClientClosing is the cause recorded on the sessions Close ends; it is
// not ErrClosed, which promises that nothing was sent.
var errClientClosing = errors.New("session closed by Client.Close")
