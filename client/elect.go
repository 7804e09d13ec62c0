package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockd/lockd/codec"
)

// Leader election is a lock on the election's name held with KEEP: the
// winner's fencing token is its term, so a later leader's term is always
// higher, and every write a leader makes can carry its term to be fenced.

const (
	// DefaultElectionLease is the lease of a Campaign whose Lease is zero.
	DefaultElectionLease = 15 * time.Second
	// DefaultElectionRound is the wait of each round of a Campaign whose
	// Round is zero.
	DefaultElectionRound = 30 * time.Second
	// electionRetryMin and electionRetryMax space the rounds that end at
	// once (no session, a busy or leaderless server), so that a campaign
	// does not spin while a node or the network is down.
	electionRetryMin = 50 * time.Millisecond
	electionRetryMax = 2 * time.Second
)

// ElectionOptions are the durations of a Campaign; zero values take the
// defaults. Like AcquireOptions they are rounded up to whole seconds
// where they go on the wire, and refused, never clamped, when out of
// range.
type ElectionOptions struct {
	// Lease is how long the server keeps leadership without a renewal:
	// 2 s..1 h, default DefaultElectionLease. The leader renews it every
	// third of Lease; a leader that dies or is cut off hands over after
	// at most Lease (plus, in cluster mode, the Raft failover).
	Lease time.Duration
	// Round bounds each wait in the server's queue for the name: 1..255 s,
	// default DefaultElectionRound. A round that runs out queues again at
	// once, so a campaign never sends an unbounded wait, and each round
	// that runs out costs one reconnect (SPEC §6).
	Round time.Duration
	// Grace is how long before the last confirmed validity ends Lost is
	// closed: the time the leader has to stop acting as one. Default a
	// tenth of Lease; it must leave a renewal room, so a third of Lease
	// plus Grace must fit, rounded up to seconds, below Lease.
	Grace time.Duration
}

// electionParams are ElectionOptions after defaults and range checks.
type electionParams struct {
	lease, round, grace, interval time.Duration
	acquire                       AcquireOptions
}

func (o ElectionOptions) normalize() (electionParams, error) {
	var p electionParams
	lease := o.Lease
	if lease == 0 {
		lease = DefaultElectionLease
	}
	leaseSeconds, err := wholeSeconds("Lease", lease, 2, codec.MaxLeaseSeconds)
	if err != nil {
		return p, err
	}
	round := o.Round
	if round == 0 {
		round = DefaultElectionRound
	}
	roundSeconds, err := wholeSeconds("Round", round, 1, codec.MaxWaitSeconds)
	if err != nil {
		return p, err
	}
	p.lease = time.Duration(leaseSeconds) * time.Second
	p.round = time.Duration(roundSeconds) * time.Second
	p.interval = p.lease / 3
	p.grace = o.Grace
	if p.grace == 0 {
		p.grace = p.lease / 10
	}
	if p.grace < 0 {
		return p, fmt.Errorf("%w: Grace %v is negative", ErrUnsupportedDuration, p.grace)
	}
	// A win must leave time for the first renewal to be confirmed before
	// Lost would close.
	budget := p.interval + p.grace
	if ceilSeconds(budget) >= leaseSeconds {
		return p, fmt.Errorf("%w: Grace %v plus a third of the lease, %v, rounded up to seconds, leaves no time in the lease %v for a renewal",
			ErrInsufficientLease, p.grace, budget, p.lease)
	}
	p.acquire = AcquireOptions{Lease: p.lease, Wait: p.round, MinWorkBudget: Budget(budget)}
	return p, nil
}

// Leadership is a won election: it holds the election's name with KEEP
// until Resign, or until it is lost. It is safe for concurrent use.
type Leadership struct {
	c      *Client
	name   string
	term   uint64
	p      electionParams
	lost   chan struct{}
	stop   context.CancelFunc
	kept   chan struct{} // closed when the keeper has returned
	ticket Ticket        // owned by the keeper until kept is closed

	mu  sync.Mutex
	err error
}

// Campaign campaigns for leadership of name until it wins or ctx ends. It
// queues for name in bounded rounds (opts.Round), queueing again when a
// round runs out or a round fails on the way (a node down, the session
// lost, a busy server), and returns the Leadership once it is granted.
// The returned Leadership renews itself (KEEP) every third of the lease
// until Resign or until it is lost; watch Lost.
//
// Errors: ctx's end (errors.Is with context.Canceled or
// context.DeadlineExceeded), bad input (ErrBadKey,
// ErrUnsupportedDuration, ErrInsufficientLease), ErrAuth, ErrClosed,
// ErrOwnerExhausted or ErrTokenExhausted: nothing is held by this
// campaign. A round that ran out while a grant may have come at its last
// instant leaves that grant to lapse with its lease, as any acquire does.
func (c *Client) Campaign(ctx context.Context, name string, opts ElectionOptions) (*Leadership, error) {
	if !codec.ValidClientKey(name) {
		return nil, fmt.Errorf("%w: election name %q", ErrBadKey, name)
	}
	p, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	retry := electionRetryMin
	for {
		t, err := c.Acquire(ctx, name, p.acquire)
		if err == nil {
			return c.lead(t, p), nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("campaign for %q: %w", name, err)
		}
		if !campaignGoesOn(err) {
			return nil, fmt.Errorf("campaign for %q: %w", name, err)
		}
		if errors.Is(err, ErrWaitElapsed) || errors.Is(err, ErrTimeout) {
			// The name stayed held for the whole round: queue again now.
			retry = electionRetryMin
			continue
		}
		if err := c.sleep(ctx, retry); err != nil {
			return nil, fmt.Errorf("campaign for %q: %w", name, err)
		}
		retry = min(2*retry, electionRetryMax)
	}
}

// campaignGoesOn reports whether a round that ended with err is followed
// by another: it did when nothing the caller could fix went wrong.
func campaignGoesOn(err error) bool {
	switch {
	case errors.Is(err, ErrBadKey), errors.Is(err, ErrUnsupportedDuration), errors.Is(err, ErrInsufficientLease),
		errors.Is(err, ErrAuth), errors.Is(err, ErrTLS), errors.Is(err, ErrClosed), errors.Is(err, ErrConfig),
		errors.Is(err, ErrOwnerExhausted), errors.Is(err, ErrTokenExhausted), errors.Is(err, ErrProtocol):
		return false
	}
	return true
}

// sleep waits d, or less when ctx ends first.
func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	t := c.clock.NewTimer()
	defer t.Stop()
	t.Reset(d)
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.stopping:
		return ErrClosed
	}
}

func (c *Client) lead(t Ticket, p electionParams) *Leadership {
	keepCtx, stop := context.WithCancel(context.Background())
	l := &Leadership{c: c, name: t.key, term: t.token, p: p, lost: make(chan struct{}), stop: stop, kept: make(chan struct{}), ticket: t}
	go l.keep(keepCtx)
	return l
}

// Name is the election's name.
func (l *Leadership) Name() string { return l.name }

// Term is the leadership's fencing token: a later leader of the same
// name always has a higher term. Pass it with every write the leader
// makes, so that a deposed leader's late writes can be refused.
func (l *Leadership) Term() uint64 { return l.term }

// Lost is closed when this process must stop acting as the leader: Grace
// before the last confirmed validity ends without a renewal confirmed in
// time — so before the lease could lapse on the server —, at once when
// the server answers that the name is no longer held, and on Resign.
func (l *Leadership) Lost() <-chan struct{} { return l.lost }

// Err says why Lost was closed: nil before, ErrResigned after Resign,
// otherwise the failed renewal (ErrNotHeld when the server said so).
func (l *Leadership) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// ErrResigned is Leadership.Err after Resign.
var ErrResigned = errors.New("lockd client: leadership resigned")

// Resign ends the leadership: it stops the renewals, closes Lost and
// releases the name, so that the next candidate wins at once rather than
// after the lease. nil means released; ErrNotHeld that the leadership had
// already been lost; ErrIndeterminate that no answer came, and the name is
// left to its lease. ctx bounds the release as in Release.
func (l *Leadership) Resign(ctx context.Context) error {
	l.stop()
	<-l.kept
	l.end(ErrResigned)
	return l.c.Release(ctx, l.ticket)
}

// end closes Lost with err as its reason, once.
func (l *Leadership) end(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	close(l.lost)
}

// keep renews the lease every third of it until ctx ends or leadership
// is lost. Each renewal must be confirmed before Lost is due: its context
// ends there, and a renewal that failed is tried again soon while time is
// left.
func (l *Leadership) keep(ctx context.Context) {
	defer close(l.kept)
	clk := l.c.clock
	lostAt := l.ticket.ValidUntil().Add(-l.p.grace)
	next := clk.Now().Add(l.p.interval)
	var failed error
	for {
		now := clk.Now()
		if !now.Before(lostAt) {
			if failed == nil {
				failed = ErrIndeterminate
			}
			l.end(fmt.Errorf("leadership of %q (term %d): no renewal confirmed in time: %w", l.name, l.term, failed))
			return
		}
		if err := l.c.sleep(ctx, min(next.Sub(now), lostAt.Sub(now))); err != nil {
			if ctx.Err() == nil { // the client closed: nothing can renew any more
				l.end(fmt.Errorf("leadership of %q (term %d): %w", l.name, l.term, err))
			}
			return
		}
		if clk.Now().Before(next) {
			continue
		}
		renewing, cancel := context.WithDeadline(ctx, lostAt)
		err := l.ticket.Renew(renewing, l.p.lease)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			failed = nil
			lostAt = l.ticket.ValidUntil().Add(-l.p.grace)
			next = clk.Now().Add(l.p.interval)
		case errors.Is(err, ErrNotHeld):
			l.end(fmt.Errorf("leadership of %q (term %d): %w", l.name, l.term, err))
			return
		default:
			failed = err
			next = clk.Now().Add(min(l.p.interval/2, time.Second))
		}
	}
}
