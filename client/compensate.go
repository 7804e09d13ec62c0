package client

import (
	"context"
	"errors"
	"time"
)

// compensationWorkers send the queued compensations, so that one waiting
// for a silent server does not hold up the others.
const compensationWorkers = 4

// compensation is work the client owes a server after a call ended
// without handing the caller what the server did: the release of a grant
// the delivery gate refused (SPEC §6), or the ABANDON of an ACQUIRE that
// ended ErrIndeterminate with its session closed (SPEC §6a). Both go
// through one bounded queue under the same rules: IODeadline from the
// enqueue, retries and reconnects included; a full queue, a closing
// client or an elapsed deadline leaves the lock to its lease.
type compensation struct {
	kind     opKind // opRelease or opAbandon
	key      string
	token    uint64 // opRelease: the grant's token
	target   uint64 // opAbandon: the ACQUIRE's owner
	deadline time.Time
}

// compensate queues comp and reports whether the queue took it; a
// refusal is counted as the lock left to its lease.
func (c *Client) compensate(comp compensation) bool {
	c.compMu.Lock()
	defer c.compMu.Unlock()
	if !c.compClosed {
		select {
		case c.compQueue <- comp:
			if comp.kind == opRelease {
				c.stats.compensationsQueued.Add(1)
			}
			return true
		default:
		}
	}
	if comp.kind == opRelease {
		c.stats.dropped.Add(1)
	} else {
		c.stats.abandonsGivenUp.Add(1)
	}
	return false
}

// compensateRelease queues the release of a grant the caller will never
// see, and says what became of it, for the caller's error.
func (c *Client) compensateRelease(key string, token uint64, now time.Time) string {
	if c.compensate(compensation{kind: opRelease, key: key, token: token, deadline: now.Add(IODeadline)}) {
		return "its release is queued as compensation"
	}
	return "the compensation queue was full: it is left to its lease"
}

// giveBack queues the ABANDON of req, an ACQUIRE that ended with its
// session closed after it may have left, and says what becomes of
// whatever the server did with it, for the caller's error.
func (c *Client) giveBack(req *request) string {
	if !req.abandonable {
		return "this server does not take ABANDON, so a grant it may have made is left to its lease"
	}
	comp := compensation{kind: opAbandon, key: req.key, target: req.owner, deadline: c.clock.Now().Add(IODeadline)}
	if c.compensate(comp) {
		return "an ABANDON is queued to give back whatever the server did with it"
	}
	return "the compensation queue was full (or the client closing), so a grant the server may have made is left to its lease"
}

func (c *Client) runCompensations() {
	for comp := range c.compQueue {
		if comp.kind == opAbandon {
			c.sendAbandon(comp)
			continue
		}
		err := c.release(context.Background(), comp.key, comp.token, c.clock.Now(), comp.deadline)
		if err == nil || errors.Is(err, ErrNotHeld) {
			c.stats.compensationsDone.Add(1)
		} else {
			c.stats.compensationsFailed.Add(1)
		}
	}
}

// sendAbandon sends comp's ABANDON on a session that declared the
// client's SESSION until it is answered or its deadline passes. Like a
// release it may be repeated after a byte may have left: a repeat finds
// the tombstone of the first and changes nothing.
func (c *Client) sendAbandon(comp compensation) {
	owner, err := c.nextOwner()
	if err != nil {
		c.stats.abandonsGivenUp.Add(1)
		return
	}
	ctx := context.Background()
	req := c.newRequest(ctx, opAbandon, owner, comp.key, c.clock.Now(), comp.deadline)
	defer c.freeRequest(req)
	req.target = comp.target
	out, err := c.exchange(ctx, req, c.cfg.MaxInFlight+c.releaseReserve, true)
	if !req.sentAt.IsZero() {
		c.stats.abandonsSent.Add(1)
	}
	switch {
	case err == nil && out == outReleased:
		c.stats.abandonsReleased.Add(1)
	case err == nil && out == outNotHeld:
		c.stats.abandonsNotHeld.Add(1)
	default:
		c.stats.abandonsGivenUp.Add(1)
	}
}
