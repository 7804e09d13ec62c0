package cluster

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/cluster/placement"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/histogram"
)

// fsm is one group's dragonboat state machine: the replicated state
// (state.go) behind a mutex, since Lookup and SaveSnapshot run beside
// Update, and the node-local state derived from it on this replica — the
// lease deadlines (leases.go), per-node load counts — which is never
// snapshotted. Update applies a batch under the mutex and delivers its
// answers to this node's requests after releasing it (group.deliver).
type fsm struct {
	g *group

	// mu guards state and the node-local fields below. It is taken
	// before the group's orphanQueue.mu and never with the node's regMu
	// (package comment): Update releases it before it delivers answers.
	mu    sync.Mutex
	state replicated

	restored atomic.Int64 // snapshots recovered, for tests
	// appliedIndex is applied, and lastDated the last dated batch
	// applied, for the proposer's stamps (clock.go).
	appliedIndex atomic.Uint64
	lastDated    atomic.Pointer[appliedBatch]
	// halted is why this replica stopped applying its group (version.go,
	// halt); nil while it applies.
	halted atomic.Pointer[string]
	// keysRefused counts the acquires this replica applied that the keys
	// gate refused.
	keysRefused atomic.Uint64

	// node-local, under mu:
	heap engine.DeadlineHeap[leaseRef]
	// waitEnds are the ends of the waits applied, on this node's clock:
	// the leader asks for a dated batch at each (clock.go).
	waitEnds engine.DeadlineHeap[struct{}]
	load     map[uint64]uint64 // acquires and releases applied per proposing node, for leader placement
	applied  uint64            // index of the last entry applied
	// nowAppliedAt is this node's clock when it last applied a dated
	// batch, for inspection (replicaNow).
	nowAppliedAt time.Duration
	// holds are the hold times of the leases that ended while this
	// replica's node led the group (as its housekeeping last saw):
	// about one node counts each, as the group saw it.
	holdTimes histogram.Histogram

	// clock stamps the leases applied (the node's clock; tests pass
	// their own).
	clock func() time.Duration

	// used by Update and RecoverFromSnapshot only, which dragonboat calls
	// one at a time:
	cmd command // decode scratch
	out applied
}

func newFSM(g *group, firstToken uint64) *fsm {
	f := &fsm{g: g, state: newReplicated(firstToken), load: make(map[uint64]uint64), clock: g.n.clock}
	f.lastDated.Store(&appliedBatch{})
	g.logFormat.Store(f.state.format)
	return f
}

// Update applies one batch. A batch whose header is malformed is skipped;
// one with a malformed command applies the commands before it. Neither
// can come from this code. A batch holding what this build cannot read
// (unreadable) halts the replica before it applies any of it (version.go,
// halt), and a halted replica applies nothing more. Update never fails,
// since a failed Update stops the process.
func (f *fsm) Update(e sm.Entry) (sm.Result, error) {
	if hold := f.g.n.cfg.beforeUpdate; hold != nil {
		hold()
	}
	f.mu.Lock()
	if f.halted.Load() != nil {
		f.mu.Unlock()
		return sm.Result{}, nil
	}
	if err := unreadable(e.Cmd); err != nil {
		f.halt(e.Index, err)
		f.mu.Unlock()
		return sm.Result{}, nil
	}
	f.applied = e.Index
	f.appliedIndex.Store(e.Index)
	st, count, b, err := readHeader(e.Cmd)
	if err != nil {
		f.mu.Unlock()
		return sm.Result{}, nil
	}
	f.state.date(st, e.Index, &f.out)
	for range count {
		if b, err = readCommand(b, &f.cmd); err != nil {
			break
		}
		if k := f.cmd.kind; k == cmdAcquire || k == cmdAcquireBy || k == cmdRelease || k == cmdKeep {
			f.load[f.cmd.node]++
		}
		f.state.apply(&f.cmd, &f.out)
	}
	f.state.endBatch()
	f.g.logFormat.Store(f.state.format)
	if len(f.out.leases) > 0 {
		f.takeLeases(f.clock())
	}
	if f.state.batch.dated {
		f.nowAppliedAt = f.clock()
		f.lastDated.Store(&appliedBatch{index: e.Index, at: f.nowAppliedAt, term: f.state.clock.term, now: f.state.now})
	}
	f.takeWaits()
	f.observeHolds()
	stampWanted := len(f.state.clock.pending) > 0 && f.g.leading.Load()
	f.mu.Unlock()
	if stampWanted {
		// Starts wait for a batch this leader dates: ask for one now,
		// so that they are dated about one commit late.
		f.g.needStamp.Store(true)
		f.g.propose()
	}
	f.g.appliedOwn(e.Cmd)
	f.g.n.anchor.NoteApplied()
	f.deliver()
	return sm.Result{Value: uint64(count)}, nil
}

// takeLeases gives the grants and renewals just applied their deadline,
// now + lease on this replica's clock, read after the apply, so that no
// replica ends a lease before the client's own bound (send instant +
// waited + lease). The housekeeping loop is not woken: a lease lasts at
// least a second, so it ends after the loop's next pass
// (housekeepingInterval),
// and a wake-up per batch would cost a context switch per commit on every
// node.
func (f *fsm) takeLeases(now time.Duration) {
	for _, e := range f.out.leases {
		f.heap.Push(now+e.lease, e)
	}
	clear(f.out.leases)
	f.out.leases = f.out.leases[:0]
}

// takeWaits times the ends of the waits just applied on this replica's
// clock, where the group's time stands as this node projects it (its
// time at the last dated batch, plus this node's time since).
func (f *fsm) takeWaits() {
	for _, deadline := range f.out.waits {
		f.waitEnds.Push(f.nowAppliedAt+deadline-f.state.now, struct{}{})
	}
	f.out.waits = f.out.waits[:0]
}

// observeHolds records the hold times of the leases the batch ended, on
// the group's leader only; called with the lock held.
func (f *fsm) observeHolds() {
	if f.g.leading.Load() {
		for _, d := range f.out.holds {
			f.holdTimes.Observe(d)
		}
	}
	f.out.holds = f.out.holds[:0]
}

// deliver hands the answers of what was just applied to the node,
// outside the state machine's lock.
func (f *fsm) deliver() {
	for _, a := range f.out.answers {
		if a.kind == answerDirect && a.r.Outcome == engine.Busy {
			f.keysRefused.Add(1)
		}
		f.g.deliver(a)
	}
	clear(f.out.answers)
	f.out.answers = f.out.answers[:0]
}

// Lookup answers a lock key (tenant 0x00 key) with its current token as
// of the last command applied, 0 when free; used by tests and tools.
func (f *fsm) Lookup(q any) (any, error) {
	k, ok := q.(string)
	if !ok {
		return nil, errors.New("cluster: lookup wants a lock key")
	}
	return f.tokenOf(k), nil
}

// tokenOf is the current token of a lock key as of the last command
// applied, 0 when free.
func (f *fsm) tokenOf(k string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.state.locks[k]; l != nil {
		return l.Token
	}
	return 0
}

func (f *fsm) Close() error { return nil }

// halted reports whether g's replica on this node halted: the node
// answers g's requests E unavailable.
func (g *group) halted() bool {
	f := g.fsm.Load()
	return f != nil && f.halted.Load() != nil
}

// holds reports whether this replica holds a lock on key.
func (f *fsm) holds(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.locks[key] != nil
}

// tenantKeys is the number of tenant's keys in this replica.
func (f *fsm) tenantKeys(tenant string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.tenantKeys[tenant]
}

// renewalsOf is the renewals of key's lock as this replica has applied
// them, when token is its current token; 0 otherwise (a KEEP proposed on
// that view, if stale, is proposed again once this replica catches up).
func (f *fsm) renewalsOf(key string, token uint64) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.state.locks[key]; l != nil && l.Token == token {
		return l.renewals
	}
	return 0
}

// deliver routes one answer of g's state machine, given after Update
// released the state machine's lock; only the node that owns the request
// acts on it.
func (g *group) deliver(a answer) {
	n := g.n
	if a.node != n.cfg.NodeID || a.id == 0 {
		return
	}
	switch a.kind {
	case answerDirect, answerHandOff, answerRestored:
		g.answer(a)
	case answerStaleKeep:
		g.staleKeep(a)
	case answerForgotten:
		if a.id == n.idFirst {
			g.house.pastRunsForgotten.Store(true)
		}
	}
}

// answer resolves request a.id with its outcome: a grant at once (an
// immediate one waited nothing; a handoff's waited_ms is bounded by
// deliverable), a queue entry by arming the request's wait.
func (g *group) answer(a answer) {
	n, r := g.n, a.r
	n.regMu.Lock()
	p := n.reg[a.id]
	switch {
	case p == nil && a.kind == answerRestored && r.Outcome == engine.Granted:
		// Learnt from a snapshot (this node fell behind its group): the
		// request may have been answered with this very grant before, so
		// the lock is left to its lease.
		n.regMu.Unlock()
		return
	case p == nil:
		n.regMu.Unlock()
		g.unclaimed(a.key, a.id, r)
		return
	case r.Outcome == engine.Queued:
		g.queuedLocked(p, a.key)
		return
	case r.Outcome == engine.Granted && a.kind == answerHandOff:
		r = n.deliverable(p, r)
	case r.Outcome == engine.Granted:
		r.Waited = 0 // the lease starts at apply, after receipt
	}
	n.finishLocked(p)
	n.regMu.Unlock()
	p.w.Resolve(p.owner, r)
}

// unclaimed is the rule for an outcome no registered request waits for
// (answered already: unavailable, timed out or cancelled; a duplicate of
// a retried proposal, which may apply after its request's cancel or
// beside its first grant): a grant to a request of this run is released
// and a queue entry of it cancelled. A grant to an earlier run's request
// may have been delivered before the restart: its lease bounds it.
func (g *group) unclaimed(key string, id uint64, r engine.Result) {
	if !g.n.ownRun(id) {
		return
	}
	switch r.Outcome {
	case engine.Granted:
		g.orphan(key, r.Token)
	case engine.Queued:
		g.cancel(key, id)
	}
}

// queuedLocked arms the wait of p, which its group queued, unless the
// node is draining (it would wait for nobody) or its waiters gate is
// full; called with regMu held, which it releases.
func (g *group) queuedLocked(p *pending, key string) {
	n := g.n
	if p.queued { // a retried proposal applied twice; its grant will be released
		n.regMu.Unlock()
		return
	}
	refusal := engine.Result{Outcome: engine.ShuttingDown}
	if !n.shutting.Load() {
		if n.admitWaiter(p.quota) {
			p.queued = true
			p.deadline = p.start + p.wait
			n.timers.Push(p.deadline, p)
			n.regMu.Unlock()
			n.wakeTimers()
			return
		}
		refusal.Outcome = engine.Busy
	}
	n.finishLocked(p)
	n.regMu.Unlock()
	g.cancel(key, p.id)
	p.w.Resolve(p.owner, refusal)
}

// staleKeep is called by g's state machine for a KEEP that named an older
// renewal than the lock's current one. If its request still waits on this
// node, the KEEP was proposed from a lagging view (this replica has now
// applied everything before it): it is proposed again, naming the current
// renewal. Otherwise it was a duplicate of one already answered. It runs
// on dragonboat's apply goroutine, so it only queues.
func (g *group) staleKeep(a answer) {
	n := g.n
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

// deliverable is a grant as the client gets it: waited_ms no more than
// this node's own elapsed time since receipt. The replicated waited_ms
// (counted from the first dated time after the receipt) is what keeps
// the client's validity bound within the lease on every replica; this
// cap only keeps it from exceeding what the client itself could see.
func (n *Node) deliverable(p *pending, r engine.Result) engine.Result {
	r.Waited = max(0, min(r.Waited, n.clock()-p.start))
	return r
}

// takeLoad returns and resets the per-node command counts since the last
// call: the busiest node other than self, and self's own count.
func (f *fsm) takeLoad(self uint64) (busiest placement.Load, own uint64) {
	for node, n := range f.load {
		switch {
		case node == self:
			own = n
		case n > busiest.Commands || n == busiest.Commands && node < busiest.Node:
			busiest = placement.Load{Node: node, Commands: n}
		}
	}
	clear(f.load)
	return busiest, own
}
