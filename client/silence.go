package client

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/lockd/lockd/codec"
)

// silenceWatch closes a session whose server has gone silent (SPEC §6a):
// a node stopped or cut off from the client answers nothing, and the
// requests sent to it would otherwise hold their callers, and their keys,
// until their deadlines. It ticks every third of Config.SilenceTimeout for
// the session's whole life. A tick that finds nothing heard for a third
// sends a PING, whether or not a request is in flight, so a live
// server, even one holding a waiting ACQUIRE, always breaks the silence,
// and a stopped one is found out within the timeout of its stop rather
// than of the next request sent to it: a release or acquire sent to it
// meanwhile waits only for what is left of that. The session is closed
// once it has heard nothing for the silence timeout and its PING has gone
// unanswered for at least a tick: while a PING is out, the watch's next
// tick comes when that is due, so the session closes at the timeout, not
// a tick later. A PING unanswered for a tick marks the session quiet,
// and callers choose another one while they can.
// Guarded by the session's mu.
type silenceWatch struct {
	tick timer // runs checkSilence
	// heardAt is when the reader last brought answers, or when the
	// session started.
	heardAt time.Time
	// pingOwner is the PING in flight, 0 when none; pingDue asks the
	// writer to send it.
	pingOwner  uint64
	pingSentAt time.Time
	pingDue    bool
}

// errSilent is the cause recorded on a session closed by its silence.
type errSilent struct {
	addr    string
	timeout time.Duration
}

func (e errSilent) Error() string {
	return fmt.Sprintf("session to %s closed: heard nothing for %v with a request in flight", e.addr, e.timeout)
}

// watchSilence starts the watch of a new session.
func (s *session) watchSilence() {
	s.silence.heardAt = s.client.clock.Now()
	s.silence.tick.Reset(silenceTick(s.client.cfg.SilenceTimeout))
}

// silenceTick is a third of the silence timeout, rounded up so that three
// ticks span all of it.
func silenceTick(timeout time.Duration) time.Duration { return (timeout + 2) / 3 }

// checkSilence is the watch's tick.
func (s *session) checkSilence() {
	now := s.client.clock.Now()
	timeout := s.client.cfg.SilenceTimeout
	period := silenceTick(timeout)
	s.mu.Lock()
	w := &s.silence
	if s.closed {
		s.mu.Unlock()
		return
	}
	quiet := now.Sub(w.heardAt)
	unanswered := w.pingOwner != 0 && now.Sub(w.pingSentAt) >= period
	if unanswered && quiet >= timeout {
		closing := s.markClosed()
		s.mu.Unlock()
		if closing {
			s.client.stats.silentSessions.Add(1)
			s.client.quietAddrs.mark(s.addr, now)
			s.shutdown(errSilent{addr: s.addr, timeout: timeout})
		}
		return
	}
	if unanswered {
		s.quiet.Store(true)
	}
	wake := false
	if w.pingOwner == 0 && quiet >= period {
		if owner, err := s.client.nextOwner(); err == nil {
			w.pingOwner, w.pingSentAt, w.pingDue = owner, now, true
			wake = true
		}
	}
	next := period
	if w.pingOwner != 0 {
		closeAt := w.heardAt.Add(timeout)
		if answerBy := w.pingSentAt.Add(period); answerBy.After(closeAt) {
			closeAt = answerBy
		}
		if d := closeAt.Sub(now); d > 0 && d < next {
			next = d
		}
	}
	w.tick.Reset(next)
	s.mu.Unlock()
	if wake {
		s.wakeWriter()
	}
}

// pingAnswered takes the PONG of the PING in flight; s.mu is held.
func (w *silenceWatch) pingAnswered(resp *codec.Response) bool {
	if resp.Owner == 0 || resp.Owner != w.pingOwner {
		return false
	}
	w.pingOwner = 0
	return true
}

// quietAddrs remembers, per address of Config.Addrs, when a session to it
// last went silent or a handshake with it heard nothing. A stopped node's
// kernel still accepts connections, so a dial to it costs a whole
// silence timeout: the dialers choose another address for a while.
type quietAddrs struct {
	addrs []string
	at    []atomic.Int64 // the client clock's UnixNano, 0 for never
	avoid time.Duration
}

func newQuietAddrs(addrs []string, silence time.Duration) quietAddrs {
	return quietAddrs{addrs: addrs, at: make([]atomic.Int64, len(addrs)), avoid: quietAddrAvoidance * silence}
}

// quietAddrAvoidance is how many silence timeouts a quiet address is
// passed over for: long enough to outlast a short stop, short enough that
// a node back in service gets sessions again.
const quietAddrAvoidance = 5

func (q *quietAddrs) mark(addr string, now time.Time) {
	for i, a := range q.addrs {
		if a == addr {
			q.at[i].Store(now.UnixNano())
		}
	}
}

// from is the first address at or after index i, round the list, that
// has not been quiet lately; i itself when all have.
func (q *quietAddrs) from(i int, now time.Time) int {
	for k := range len(q.addrs) {
		j := (i + k) % len(q.addrs)
		at := q.at[j].Load()
		if at == 0 || now.Sub(time.Unix(0, at)) >= q.avoid {
			return j
		}
	}
	return i
}
