package client

import (
	"fmt"
	"time"

	"github.com/lockd/lockd/codec"
)

// silenceWatch closes a session whose server has gone silent while a
// request is in flight (SPEC §6a): a node stopped or cut off from the
// client answers nothing, and its waiting acquires would otherwise hold
// their callers, and their keys, for their whole wait. It ticks every
// third of Config.SilenceTimeout while a request is in flight. A tick
// that finds nothing heard since the one before sends a PING, so a live
// server, even one holding a waiting ACQUIRE, always breaks the silence.
// The session is closed at the first tick that finds nothing heard for
// the silence timeout and a PING unanswered for at least a tick: a
// silence of at least the timeout, and at most about a third more.
// Guarded by the session's mu.
type silenceWatch struct {
	tick  timer // runs checkSilence
	armed bool
	// heard counts the reads that brought answers; quietSince is when the
	// last tick saw it move, or when the watch was armed.
	heard, heardAtTick uint64
	quietSince         time.Time
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

// listen starts the watch when a request has just been sent and it is
// not running; s.mu is held. In steady state it is running, and this
// costs one test.
func (s *session) listen(now time.Time) {
	w := &s.silence
	if w.armed {
		return
	}
	w.armed = true
	w.heardAtTick = w.heard
	w.quietSince = now
	w.tick.Reset(silenceTick(s.client.cfg.SilenceTimeout))
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
	if s.closed || !w.armed {
		s.mu.Unlock()
		return
	}
	if w.heard != w.heardAtTick {
		w.heardAtTick = w.heard
		w.quietSince = now
	}
	// Requests in the table beyond the queue's are in flight.
	if s.table.count == len(s.queue) {
		w.armed = false
		s.mu.Unlock()
		return
	}
	quiet := now.Sub(w.quietSince)
	if w.pingOwner != 0 && quiet >= timeout && now.Sub(w.pingSentAt) >= period {
		closing := s.markClosed()
		s.mu.Unlock()
		if closing {
			s.client.stats.silentSessions.Add(1)
			s.shutdown(errSilent{addr: s.addr, timeout: timeout})
		}
		return
	}
	wake := false
	if w.pingOwner == 0 && quiet >= period {
		if owner, err := s.client.nextOwner(); err == nil {
			w.pingOwner, w.pingSentAt, w.pingDue = owner, now, true
			wake = true
		}
	}
	w.tick.Reset(period)
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
