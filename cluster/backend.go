package cluster

// This file owns the Node's side of the backend interface the server
// talks to, and the request registry: each request becomes a command in
// its group's next proposal, and waits in the registry until the state
// machine's answer (fsm.go, group.answer) or its deadline resolves it.

import (
	"context"
	"time"

	"github.com/lockd/lockd/engine"
)

// Namespace interns a tenant; commands carry the tenant's name, since
// interned numbers are local to a process.
// A tenant with limits gets its gates then.
func (n *Node) Namespace(tenant string) engine.Namespace {
	ns := n.tenants.Intern(tenant)
	n.quotas.Add(ns, tenant)
	return ns
}

func (n *Node) tenant(ns engine.Namespace) string { return n.tenants.Name(ns) }

// Acquire proposes the acquire to the key's group and answers Queued: the
// outcome comes through w once the group applied it, or Unavailable when
// it did not within ProposeTimeout (or the wait, if shorter).
func (n *Node) Acquire(ns engine.Namespace, key []byte, owner uint64, r engine.Requester, lease, wait time.Duration, w engine.Waiter) (engine.Result, engine.Handle) {
	if n.shutting.Load() {
		return engine.Result{Outcome: engine.ShuttingDown}, nil
	}
	if !n.inflight.Admit() {
		return engine.Result{Outcome: engine.Busy}, nil
	}
	tenant := n.tenant(ns)
	g := n.groups[groupOf(tenant, key, len(n.groups))]
	if g.halted() {
		n.inflight.Leave()
		return engine.Result{Outcome: engine.Unavailable}, nil
	}
	quota := n.quotas.Of(ns)
	if !quota.AdmitInflight() {
		n.inflight.Leave()
		return engine.Result{Outcome: engine.Busy}, nil
	}
	if !n.admitTenantKey(quota, g, tenant, key) {
		quota.LeaveInflight()
		n.inflight.Leave()
		return engine.Result{Outcome: engine.Busy}, nil
	}
	now := n.clock()
	limit := n.cfg.ProposeTimeout
	if wait > 0 && wait < limit {
		limit = wait
	}
	p := &pending{id: n.nextID(), w: w, owner: owner, start: now, wait: wait, deadline: now + limit, quota: quota, group: g, key: lockKey([]byte(tenant), key)}
	if !n.register(p) {
		quota.LeaveInflight()
		n.inflight.Leave()
		return engine.Result{Outcome: engine.ShuttingDown}, nil
	}
	if g.logFormat.Load() < logFormat4 {
		r = 0 // the group cannot record it yet; no ABANDON is served until it can (ServesAbandon)
	}
	g.queue(func(b []byte) []byte {
		return appendAcquire(b, n.cfg.NodeID, p.id, uint16(lease/time.Second), int64(wait), uint32(g.maxKeys), r, tenant, key)
	})
	return engine.Result{Outcome: engine.Queued}, p
}

// admitTenantKey is the tenant's keys quota for an acquire of key in g: a
// key this replica holds already needs no new key; otherwise the tenant's
// keys in this node's replicas of every group decide, with the gate's
// hysteresis. The replicas may lag their groups by a few commands, which
// an admission gate tolerates.
func (n *Node) admitTenantKey(quota *engine.TenantGates, g *group, tenant string, key []byte) bool {
	if quota == nil || quota.Keys == nil {
		return true
	}
	if f := g.fsm.Load(); f != nil && f.holds(lockKey([]byte(tenant), key)) {
		return true
	}
	return quota.AdmitKeyCounted(n.tenantKeys(tenant))
}

// tenantKeys counts tenant's keys in this node's replicas.
func (n *Node) tenantKeys(tenant string) int {
	count := 0
	for _, g := range n.groups {
		if f := g.fsm.Load(); f != nil {
			count += f.tenantKeys(tenant)
		}
	}
	return count
}

// AsyncAnswers: releases and keeps are answered through the Waiter once
// applied.
func (n *Node) AsyncAnswers() bool { return true }

// Release proposes the release; the answer comes through w. A nil w is
// the server releasing an orphaned grant: nobody is told.
func (n *Node) Release(ns engine.Namespace, key []byte, owner, token uint64, w engine.Waiter) engine.Result {
	g, tenant, id, ok := n.ungated(ns, key, owner, w, 0)
	if !ok {
		return engine.Result{Outcome: engine.Unavailable}
	}
	g.queue(func(b []byte) []byte { return appendRelease(b, n.cfg.NodeID, id, token, tenant, key) })
	if w == nil {
		g.propose()
	}
	return engine.Result{Outcome: engine.Queued}
}

// Keep proposes the renewal (SPEC §5 KEEP); the answer comes through w:
// Renewed with the same token, NotHeld, or Unavailable when the group did
// not apply it within ProposeTimeout (the lease may or may not have been
// renewed). Like Release it passes no gate.
func (n *Node) Keep(ns engine.Namespace, key []byte, owner, token uint64, lease time.Duration, w engine.Waiter) engine.Result {
	g, tenant, id, ok := n.ungated(ns, key, owner, w, 0)
	if !ok {
		return engine.Result{Outcome: engine.Unavailable}
	}
	renewals := g.fsm.Load().renewalsOf(lockKey([]byte(tenant), key), token)
	g.queue(func(b []byte) []byte {
		return appendKeep(b, n.cfg.NodeID, id, token, renewals, uint16(lease/time.Second), tenant, key)
	})
	return engine.Result{Outcome: engine.Queued}
}

// ungated starts a release, keep or abandon of key, which passes no gate:
// it returns key's group, the tenant's name and the request's id, which
// w is answered for (0 for a nil w: nobody is told); !ok when this
// node's replica of the group halted or is below log format minFormat.
func (n *Node) ungated(ns engine.Namespace, key []byte, owner uint64, w engine.Waiter, minFormat uint32) (g *group, tenant string, id uint64, ok bool) {
	tenant = n.tenant(ns)
	g = n.groups[groupOf(tenant, key, len(n.groups))]
	if g.halted() || g.logFormat.Load() < minFormat {
		return nil, "", 0, false
	}
	if w != nil {
		now := n.clock()
		p := &pending{id: n.nextID(), w: w, owner: owner, start: now, deadline: now + n.cfg.ProposeTimeout, ungated: true}
		n.register(p)
		id = p.id
	}
	return g, tenant, id, true
}

// Abandon proposes SPEC §6a ABANDON of the request tagged r on key (a
// replicated command, applied by the engine's rule core on every
// replica); the answer comes through w: Released, NotHeld, or Unavailable
// when the group did not apply it within ProposeTimeout. Like Release it
// passes no gate.
func (n *Node) Abandon(ns engine.Namespace, key []byte, owner uint64, r engine.Requester, w engine.Waiter) engine.Result {
	g, tenant, id, ok := n.ungated(ns, key, owner, w, logFormat4)
	if !ok {
		return engine.Result{Outcome: engine.Unavailable}
	}
	g.queue(func(b []byte) []byte { return appendAbandon(b, n.cfg.NodeID, id, r, tenant, key) })
	return engine.Result{Outcome: engine.Queued}
}

// ServesAbandon is true once every group's log format is 4 on this
// node's replica (the log-format rule of upgrades: every member of every
// group then reads cmdAbandon), and no replica here halted.
func (n *Node) ServesAbandon() bool {
	for _, g := range n.groups {
		if g.logFormat.Load() < logFormat4 || g.halted() {
			return false
		}
	}
	return true
}

// ReleaseUndelivered releases the grant of an acquire whose waiter's
// connection closed before the grant could be written: the same release,
// checked against the current token first, as for a grant whose waiter is
// gone from the registry.
func (n *Node) ReleaseUndelivered(h engine.Handle, token uint64) {
	if p, ok := h.(*pending); ok && p.group != nil {
		p.group.orphan(p.key, token)
	}
}

// Cancel drops a waiter whose connection closed (SPEC §5) from the
// registry and, once this replica has applied its acquire as queued, from
// the replicated queue too (cmdCancel), so that a lock freeing later goes
// to a live waiter. The cancel then follows the acquire in the group's
// log, although a node may have two proposals in flight. An acquire not
// applied yet is cancelled when it applies as Queued and finds its
// request gone (group.result); one applied as a grant is released as an
// orphan, as is a grant that reaches the entry before the cancel applies.
func (n *Node) Cancel(h engine.Handle) {
	p, ok := h.(*pending)
	if !ok || p == nil {
		return
	}
	n.regMu.Lock()
	queued := n.finishLocked(p) && p.queued
	n.regMu.Unlock()
	if queued {
		p.group.cancel(p.key, p.id)
	}
}

// cancel proposes the removal of this node's waiter id from the queue of
// key (a lock key). It runs on event loops and on dragonboat's apply
// goroutine, so it only queues; the server flushes no batch after a
// connection closed, so it wakes the proposer itself.
func (g *group) cancel(key string, id uint64) {
	tenant, k := splitLockKey(key)
	g.queue(func(b []byte) []byte { return appendCancel(b, g.n.cfg.NodeID, id, tenant, k) })
	g.propose()
}

// Flush proposes what this event-loop batch queued: one proposal per
// touched group (group commit).
func (n *Node) Flush() {
	for _, g := range n.groups {
		if g.dirty.Load() {
			g.proposeFromLoop()
		}
	}
}

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
		n.wakeTimers()
	}
	return true
}

// wakeTimers has timerLoop look at the earliest deadline again.
func (n *Node) wakeTimers() {
	select {
	case n.wakeReg <- struct{}{}:
	default:
	}
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

// Shutdown starts the node's drain: it first hands the leadership of the
// groups it leads to a live peer (handOverLeadership), so that the
// cluster does not wait out an election when it stops, then answers its
// queued waiters ShuttingDown and drops them from their queues: they were
// never granted. An acquire still on its way through Raft gets its real
// answer (a grant, T, or E unavailable), or ShuttingDown if it applies as
// queued; releases and keeps are answered as usual. Locks stay in the
// cluster.
func (n *Node) Shutdown() {
	n.handOverLeadership()
	var done []*pending
	n.regMu.Lock()
	n.shutting.Store(true)
	for _, p := range n.reg {
		if p.queued && n.finishLocked(p) {
			done = append(done, p)
		}
	}
	n.regMu.Unlock()
	for _, p := range done {
		p.group.cancel(p.key, p.id)
		p.w.Resolve(p.owner, engine.Result{Outcome: engine.ShuttingDown})
	}
}

// handOverLeadership asks for every group this node leads to pass to the
// peer heard from most recently, and waits until none is led here any
// more or handOverTimeout passed (a transfer Raft gives up leaves this
// node leader until it stops; its peers then elect after the election
// timeout, as after a crash).
//
// Under load the hand-over fails often without a pause first: dragonboat's
// target skips the campaign a TimeoutNow asks for while it has committed
// entries it has not applied, and its followers apply a moment after they
// learn of a commit, which under load is always. So the leader first
// holds the group's proposals (holdProposals) for handOverHold: the last
// proposals commit, the commit index reaches the followers with a
// heartbeat, and they apply it. The followers' requests wait in their
// batches meanwhile, and go to the new leader. Placement's hand-overs
// take the same steps (housekeeping.go).
func (n *Node) handOverLeadership() {
	holding := false
	for i, g := range n.groups {
		if n.Leader(i) == n.cfg.NodeID {
			n.holdProposals(g)
			holding = true
		}
	}
	if holding {
		time.Sleep(n.cfg.handOverHold())
	}
	deadline := time.Now().Add(n.handOverTimeout())
	for {
		asked := 0
		for i, g := range n.groups {
			if n.Leader(i) != n.cfg.NodeID {
				continue
			}
			if to := n.liveness.freshest(n.clock(), n.cfg.ForgetAfter); to != 0 {
				n.moveLeader(g, to)
				asked++
			}
		}
		if asked == 0 {
			return // nothing led here, or no live peer to take it
		}
		if time.Now().After(deadline) {
			for i, g := range n.groups {
				if n.Leader(i) == n.cfg.NodeID {
					n.resendProposals(g) // the followers' it dropped meanwhile
				}
			}
			return
		}
		time.Sleep(n.cfg.RTT)
	}
}

// handOverTimeout bounds a drain's hand-over: two election timeouts.
func (n *Node) handOverTimeout() time.Duration {
	return 2 * time.Duration(n.cfg.ElectionRTT) * n.cfg.RTT
}

func (n *Node) nextID() uint64 { return n.idBase.Add(1) | 1<<63 }

// runIDSpan bounds the request ids one run of a node issues.
const runIDSpan = 1 << 40

// ownRun reports whether id was issued by this run of the node
// (group.unclaimed).
func (n *Node) ownRun(id uint64) bool {
	v := id &^ (1 << 63)
	return v >= n.idFirst && v <= n.idBase.Load()
}
