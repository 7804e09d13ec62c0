package cluster

// This file owns the request registry: the requests of this node's
// connections awaiting their group, their timers, and the routing of the
// state machine's answers to them.

import (
	"context"
	"time"

	"github.com/lockd/lockd/engine"
)

// pending is a request of this node's connections awaiting its group.
type pending struct {
	id       uint64
	w        engine.Waiter
	owner    uint64
	start    time.Duration // node clock at receipt
	wait     time.Duration
	deadline time.Duration // Unavailable (proposal) or TimedOut (queued) at this instant
	// ungated marks a release or keep: it holds no gate, and it is still
	// answered after Shutdown.
	ungated bool
	queued  bool                // the state machine queued it
	done    bool                // resolved or cancelled
	quota   *engine.TenantGates // of the acquire's tenant, nil without limits
	// group and key (a lock key) of an acquire, to release a grant its
	// waiter abandons.
	group *group
	key   string
}

// staleKeep is called by g's state machine for a KEEP that named an older
// renewal than the lock's current one. If its request still waits on this
// node, the KEEP was proposed from a lagging view (this replica has now
// applied everything before it): it is proposed again, naming the current
// renewal. Otherwise it was a duplicate of one already answered. It runs
// on dragonboat's apply goroutine, so it only queues.
func (g *group) staleKeep(a answer) {
	n := g.n
	if a.node != n.cfg.NodeID || a.id == 0 {
		return
	}
	n.regMu.Lock()
	p := n.reg[a.id]
	n.regMu.Unlock()
	if p == nil {
		return
	}
	tenant, key := splitLockKey(a.key)
	g.queue(func(b []byte) []byte {
		return appendKeep(b, n.cfg.NodeID, a.id, a.token, a.renewals, a.lease, tenant, key)
	})
	g.propose()
}

// register adds p; an acquire is refused once Shutdown ran, checked under
// the lock Shutdown takes, so that no acquire escapes its sweep.
func (n *Node) register(p *pending) bool {
	n.regMu.Lock()
	if !p.ungated && n.shutting.Load() {
		n.regMu.Unlock()
		return false
	}
	n.reg[p.id] = p
	next, ok := n.timers.Next()
	wake := !ok || p.deadline < next
	n.timers.Push(p.deadline, p)
	// Answered requests stay in the heap until their deadline (up to a
	// 255 s wait): drop them once they outnumber the live ones. A queued
	// request keeps its stale first entry too, so the heap stays within
	// twice the live requests after a pass: passes are rare.
	if len(n.timers) > 64 && len(n.timers) > 3*len(n.reg) {
		n.timers.Retain(func(d engine.Deadline[*pending]) bool { return !d.Item.done })
	}
	n.regMu.Unlock()
	if wake {
		select {
		case n.wakeReg <- struct{}{}:
		default:
		}
	}
	return true
}

// finishLocked retires p, giving back its gates; false if it was already.
func (n *Node) finishLocked(p *pending) bool {
	if p.done {
		return false
	}
	p.done = true
	delete(n.reg, p.id)
	if !p.ungated {
		n.inflight.Leave()
		p.quota.LeaveInflight()
		if p.queued {
			n.waiters.Leave()
			p.quota.LeaveWaiter()
		}
	}
	return true
}

// admitWaiter takes a unit of the node's waiters gate and of the tenant's.
func (n *Node) admitWaiter(quota *engine.TenantGates) bool {
	if !n.waiters.Admit() {
		return false
	}
	if !quota.AdmitWaiter() {
		n.waiters.Leave()
		return false
	}
	return true
}

// timerLoop answers requests whose deadline passed: Unavailable while the
// group has not applied them, TimedOut once queued.
func (n *Node) timerLoop(ctx context.Context) {
	tm := time.NewTimer(time.Hour)
	defer tm.Stop()
	var due []*pending
	for {
		now := n.clock()
		next := time.Hour
		n.regMu.Lock()
		for at, ok := n.timers.Next(); ok; at, ok = n.timers.Next() {
			p := n.timers[0].Item
			if p.done || p.deadline != at {
				n.timers.Pop()
				continue
			}
			if at > now {
				next = at - now
				break
			}
			n.timers.Pop()
			n.finishLocked(p)
			due = append(due, p)
		}
		n.regMu.Unlock()
		for i, p := range due {
			r := engine.Result{Outcome: engine.TimedOut}
			if !p.queued {
				r.Outcome = engine.Unavailable
				n.stats.unavailable.Add(1)
			}
			p.w.Resolve(p.owner, r)
			due[i] = nil
		}
		due = due[:0]
		tm.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-tm.C:
		case <-n.wakeReg:
		}
	}
}

// deliver routes one answer of g's state machine, given after Update
// released the state machine's lock; only the node that owns the request
// acts on it.
func (g *group) deliver(a answer) {
	switch a.kind {
	case answerDirect:
		g.result(a.key, a.node, a.id, a.r)
	case answerHandOff:
		if a.r.Outcome == engine.Granted {
			g.granted(a.key, a.node, a.id, a.r)
		} else {
			g.result(a.key, a.node, a.id, a.r)
		}
	case answerStaleKeep:
		g.staleKeep(a)
	case answerForgotten:
		if a.node == g.n.cfg.NodeID && a.id == g.n.idFirst {
			g.house.pastRunsForgotten.Store(true)
		}
	case answerRestored:
		if a.r.Outcome == engine.Granted {
			g.restoredGrant(a.id, a.r.Token)
		} else {
			g.result(a.key, a.node, a.id, a.r)
		}
	}
}

// result is the answer to a request of this node's (or of the waiter a
// handoff passed); a grant nobody waits for any more is released, and
// one still waited for is answered at once.
func (g *group) result(key string, node, id uint64, r engine.Result) {
	n := g.n
	if node != n.cfg.NodeID || id == 0 {
		return
	}
	n.regMu.Lock()
	p := n.reg[id]
	if p == nil {
		n.regMu.Unlock()
		if p == nil && !n.ownRun(id) {
			return
		}
		// Answered already (unavailable, cancelled before it applied, or a
		// duplicate of a retried proposal, which may apply after its
		// request's cancel or beside its first grant): nobody will use
		// this grant, or wait in this queue entry, so the grant is
		// released and the entry cancelled.
		switch r.Outcome {
		case engine.Granted:
			g.orphan(key, r.Token)
		case engine.Queued:
			g.cancel(key, id)
		}
		return
	}
	if r.Outcome == engine.Queued {
		if p.queued { // a retried proposal applied twice; its grant will be released
			n.regMu.Unlock()
			return
		}
		if n.shutting.Load() { // draining: it would wait for nobody
			n.finishLocked(p)
			n.regMu.Unlock()
			g.cancel(key, id)
			p.w.Resolve(p.owner, engine.Result{Outcome: engine.ShuttingDown})
			return
		}
		if !n.admitWaiter(p.quota) {
			n.finishLocked(p)
			n.regMu.Unlock()
			g.cancel(key, id)
			p.w.Resolve(p.owner, engine.Result{Outcome: engine.Busy})
			return
		}
		p.queued = true
		p.deadline = p.start + p.wait
		n.timers.Push(p.deadline, p)
		n.regMu.Unlock()
		select {
		case n.wakeReg <- struct{}{}:
		default:
		}
		return
	}
	if r.Outcome == engine.Granted {
		r.Waited = 0 // an immediate grant: the lease starts at apply, after receipt
	}
	n.finishLocked(p)
	n.regMu.Unlock()
	p.w.Resolve(p.owner, r)
}

// granted is called by g's state machine when a queued waiter gets the
// lock. The owning node answers it at once (waited_ms bounded:
// deliverable), or releases it when the waiter is gone (timed out here,
// cancelled, answered unavailable, or from a previous run of this node).
func (g *group) granted(key string, node, id uint64, r engine.Result) {
	n := g.n
	if node != n.cfg.NodeID {
		return
	}
	n.regMu.Lock()
	p := n.reg[id]
	if p == nil {
		n.regMu.Unlock()
		if n.ownRun(id) {
			g.orphan(key, r.Token) // a waiter gone, or a duplicate's grant
		}
		return
	}
	n.finishLocked(p)
	n.regMu.Unlock()
	p.w.Resolve(p.owner, n.deliverable(p, r))
}

// restoredGrant answers request id with a grant this node learnt of only
// from a snapshot (it had fallen behind its group), if the request still
// waits for it. A request no longer registered may have been answered
// with this very grant before the node fell behind, so that lock is left
// to its lease, never released here. Waited is 0: the client's validity
// bound then ends at its send instant + lease, before the lease ends on
// any replica.
func (g *group) restoredGrant(id, token uint64) {
	n := g.n
	n.regMu.Lock()
	p := n.reg[id]
	if p == nil {
		n.regMu.Unlock()
		return
	}
	n.finishLocked(p)
	n.regMu.Unlock()
	p.w.Resolve(p.owner, engine.Result{Outcome: engine.Granted, Token: token})
}

// deliverable is a grant as the client gets it: waited_ms no more than
// this node's own elapsed time since receipt, so the client's validity
// bound never ends after the lease on any replica.
func (n *Node) deliverable(p *pending, r engine.Result) engine.Result {
	r.Waited = max(0, min(r.Waited, n.clock()-p.start))
	return r
}
