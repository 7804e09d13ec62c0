package client

import (
	"context"
	"errors"
	"sync"
	"time"
)

// waitIdleTimeout is how long a wait session beyond the spares may stay
// idle before the pool closes it.
const waitIdleTimeout = time.Minute

// errIdleClosed is the cause recorded on a wait session the pool closed
// because nobody needed it.
var errIdleClosed = errors.New("wait session closed after a minute idle")

type poolState uint8

const (
	poolBusy poolState = iota // carrying a waiting acquire, or just dialled
	poolIdle                  // ready in the idle list
	poolGone                  // closed and no longer counted
)

// waitPool keeps the wait sessions: connections that carry one waiting
// acquire at a time. A waiting acquire that runs out after its frame may
// have left must close its session (SPEC §6); alone on it, that costs only
// the one call. The pool keeps Config.WaitSpares sessions connected and
// authenticated ahead of need, and its own goroutine replaces closed ones
// and dials for callers waiting for a session, so no call pays a dial
// while a spare is left. At most Config.WaitSessions are open; a caller
// that finds none free waits in the client, certainly unsent, until one is
// or its deadline comes.
type waitPool struct {
	c      *Client
	limit  int
	spares int
	kick   chan struct{}

	mu       sync.Mutex
	idle     []*session // oldest first
	open     int        // idle, busy and being dialled
	all      map[*session]struct{}
	waiting  []*request // callers waiting for a session, oldest first
	owed     int        // sessions closed and not yet replaced
	nextAddr int
	stopped  bool
}

func newWaitPool(c *Client) *waitPool {
	return &waitPool{
		c:      c,
		limit:  c.cfg.WaitSessions,
		spares: max(c.cfg.WaitSpares, 0),
		kick:   make(chan struct{}, 1),
		all:    make(map[*session]struct{}),
	}
}

func (p *waitPool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// take returns a wait session for req, waiting for one until req's
// deadline or the end of ctx; its errors mean req was never sent.
func (p *waitPool) take(ctx context.Context, req *request) (*session, error) {
	p.mu.Lock()
	if s := p.popIdle(); s != nil {
		low := len(p.idle) < p.spares
		p.mu.Unlock()
		if low {
			p.poke()
		}
		return s, nil
	}
	p.waiting = append(p.waiting, req)
	p.mu.Unlock()
	p.poke()

	s, err := waitLocally(p.c, ctx, req, req.handoff)
	if err == nil {
		return s, nil
	}
	p.mu.Lock()
	withdrawn := p.withdraw(req)
	p.mu.Unlock()
	if !withdrawn {
		// A session was handed over as the wait ended: pass it on.
		p.put(<-req.handoff)
	}
	return nil, err
}

// popIdle takes the most recently used live idle session whose server is
// not quiet, or a quiet one when none is left; p.mu is held.
func (p *waitPool) popIdle() *session {
	for len(p.idle) > 0 {
		i := len(p.idle) - 1
		for j := i; j >= 0; j-- {
			if !p.idle[j].quiet.Load() {
				i = j
				break
			}
		}
		s := p.idle[i]
		p.idle = append(p.idle[:i], p.idle[i+1:]...)
		s.poolState = poolBusy
		if s.alive() {
			return s
		}
		// Closing under way: died will count it gone.
	}
	return nil
}

func (p *waitPool) withdraw(req *request) bool {
	for i, w := range p.waiting {
		if w == req {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// put gives back a session whose waiting acquire has its outcome: to the
// oldest waiting caller, or to the idle list. A closed session is left to
// died.
func (p *waitPool) put(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.poolState == poolGone || !s.alive() {
		return
	}
	p.place(s)
}

// place hands a ready session to the oldest waiting caller or makes it
// idle; p.mu is held.
func (p *waitPool) place(s *session) {
	if len(p.waiting) > 0 {
		req := p.waiting[0]
		p.waiting = append(p.waiting[:0], p.waiting[1:]...)
		s.poolState = poolBusy
		req.handoff <- s
		return
	}
	s.poolState = poolIdle
	s.idleSince = p.c.clock.Now()
	p.idle = append(p.idle, s)
}

// died is called once a wait session has closed, by any path.
func (p *waitPool) died(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch s.poolState {
	case poolGone:
		return
	case poolIdle:
		p.removeIdle(s)
	}
	s.poolState = poolGone
	delete(p.all, s)
	p.open--
	if !p.stopped {
		p.owed++
		p.poke()
	}
}

func (p *waitPool) removeIdle(s *session) {
	for i, idle := range p.idle {
		if idle == s {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			return
		}
	}
}

// wantDial reports whether another session should be dialled, and counts
// it open if so; p.mu is held. The pool grows for every caller waiting
// and to keep the spares, within its limit.
func (p *waitPool) wantDial() bool {
	if p.stopped || p.open >= p.limit || len(p.idle) >= p.spares+len(p.waiting) {
		return false
	}
	p.open++
	return true
}

// run dials what the pool needs, one session at a time, closes sessions
// idle past waitIdleTimeout beyond the spares, and closes every session
// when the client stops.
func (p *waitPool) run() {
	defer p.c.wg.Done()
	trim := p.c.clock.NewTimer()
	defer trim.Stop()
	trim.Reset(waitIdleTimeout)
	backoff := p.c.clock.NewTimer()
	defer backoff.Stop()
	delay := reconnectMin
	for {
		select {
		case <-p.kick:
		case <-trim.C():
			p.trimIdle()
			trim.Reset(waitIdleTimeout)
		case <-p.c.stopping:
			p.stop()
			return
		}
		for p.dialOne() != nil {
			backoff.Reset(delay)
			select {
			case <-backoff.C():
			case <-p.c.stopping:
				p.stop()
				return
			}
			delay = min(2*delay, reconnectMax)
		}
		delay = reconnectMin
	}
}

// dialOne dials sessions while the pool wants them; it returns the error
// of a dial that failed.
func (p *waitPool) dialOne() error {
	for {
		p.mu.Lock()
		if !p.wantDial() {
			p.mu.Unlock()
			return nil
		}
		// Round the addresses, one dial each, so that a node's stop
		// takes only its share of the sessions.
		at := p.c.quietAddrs.from(p.nextAddr, p.c.clock.Now())
		p.nextAddr = (at + 1) % len(p.c.cfg.Addrs)
		p.mu.Unlock()
		s, err := p.c.connect(p.c.lifetime, p.c.cfg.Addrs[at], 1, p)
		p.mu.Lock()
		if err != nil {
			p.open--
			p.mu.Unlock()
			return err
		}
		if s.poolState == poolGone {
			// It closed before it could be placed; died counted it.
			p.mu.Unlock()
			continue
		}
		p.all[s] = struct{}{}
		if p.owed > 0 {
			p.owed--
			p.c.stats.reconnects.Add(1)
		}
		if p.stopped {
			p.mu.Unlock()
			s.fail(errClientClosing)
			return nil
		}
		p.place(s)
		p.mu.Unlock()
	}
}

func (p *waitPool) trimIdle() {
	cutoff := p.c.clock.Now().Add(-waitIdleTimeout)
	p.mu.Lock()
	var stale []*session
	for len(p.idle) > p.spares && !p.idle[0].idleSince.After(cutoff) {
		s := p.idle[0]
		p.idle = append(p.idle[:0], p.idle[1:]...)
		s.poolState = poolGone
		delete(p.all, s)
		p.open--
		stale = append(stale, s)
	}
	p.mu.Unlock()
	for _, s := range stale {
		s.fail(errIdleClosed)
	}
}

// stop closes every wait session; their calls in flight end lost, and
// callers still waiting for one end with ErrClosed.
func (p *waitPool) stop() {
	p.mu.Lock()
	p.stopped = true
	sessions := make([]*session, 0, len(p.all))
	for s := range p.all {
		sessions = append(sessions, s)
	}
	p.mu.Unlock()
	for _, s := range sessions {
		s.fail(errClientClosing)
	}
}

// counts reports the open and idle wait sessions.
func (p *waitPool) counts() (open, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open, len(p.idle)
}
