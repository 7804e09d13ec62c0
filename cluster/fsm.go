package cluster

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/histogram"
)

// fsm is one group's dragonboat state machine: the replicated state
// (state.go) behind a mutex, since Lookup and SaveSnapshot run beside
// Update, and the node-local state derived from it on this replica — the
// expiry heap, per-node load counts — which is never snapshotted. Update
// applies a batch under the mutex and delivers its answers to the node
// after releasing it.
type fsm struct {
	g *group

	// mu guards state and the node-local fields below. Lock order: the
	// node's regMu before mu (node.go); Update releases mu before it
	// delivers answers, which take regMu.
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
	heap engine.DeadlineHeap[expiry]
	// waitEnds are the ends of the waits applied, on this node's clock:
	// the leader asks for a dated batch at each (clock.go).
	waitEnds engine.DeadlineHeap[struct{}]
	load     map[uint64]uint64 // acquires and releases applied per proposing node, for leader placement
	applied  uint64            // index of the last entry applied
	// nowAppliedAt is this node's clock when it last applied a dated
	// batch, for inspection (replicaNow).
	nowAppliedAt time.Duration
	// holds are the hold times of the leases that ended while this
	// replica's node led the group (as its expiry driver last saw):
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

// waitEnded pops the wait ends due at now and reports whether there was
// one; called with f.mu held.
func (f *fsm) waitEnded(now time.Duration) bool {
	ended := false
	for at, ok := f.waitEnds.Next(); ok && at <= now; at, ok = f.waitEnds.Next() {
		f.waitEnds.Pop()
		ended = true
	}
	f.waitEnds.Shrink()
	return ended
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

// SaveSnapshot writes the replicated state. IStateMachine snapshots block
// Update for their duration; the state is a few dozen bytes per key. A
// halted replica aborts it (dragonboat keeps its last snapshot and log):
// its state is no longer the group's as of its applied index.
func (f *fsm) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, stop <-chan struct{}) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.halted.Load() != nil {
		return sm.ErrSnapshotAborted
	}
	return f.state.save(w, stop)
}

// RecoverFromSnapshot replaces the state. Every held lock is handed to the
// expiry driver with its full lease from now on this replica: a restored
// replica may extend a lease, never shorten it. Grants and queue entries
// of this node's requests that the snapshot holds are handed to the node
// (answerRestored), since no Update will report them. A snapshot of a
// version or format this build does not read halts the replica; one it
// reads is the group's whole state, and a halted replica resumes from it.
func (f *fsm) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, stop <-chan struct{}) error {
	state, err := restore(r, stop)
	if err == nil && state.format > logFormatNewest {
		err = fmt.Errorf("%w with log format %d (this build reads %d to %d)", errUnknownSnapshot, state.format, logFormatBase, logFormatNewest)
	}
	if errors.Is(err, errUnknownSnapshot) {
		f.mu.Lock()
		f.halt(0, err)
		f.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	self := f.g.n.cfg.NodeID
	f.mu.Lock()
	if f.halted.Swap(nil) != nil {
		f.g.n.log.Warn().Uint64("group", f.g.shardID).Msg("halted replica resumed from a snapshot this build reads")
	}
	for k, l := range state.locks {
		f.out.leases = append(f.out.leases, expiry{key: k, token: l.Token, renewals: l.renewals, lease: seconds(l.lease)})
		if l.node == self {
			// Before its queue: a retried duplicate of the holder's own
			// request may wait behind it.
			f.out.answer(answerRestored, k, self, l.id, engine.Result{Outcome: engine.Granted, Token: l.Token})
		}
		for _, w := range l.queue {
			f.out.waits = append(f.out.waits, w.Deadline)
			if w.node == self {
				f.out.answer(answerRestored, k, self, w.id, engine.Result{Outcome: engine.Queued})
			}
		}
	}
	f.state = state
	f.g.logFormat.Store(state.format)
	// As if the snapshot's last dated batch applied now: a new leader
	// here carries over no time from before the restore.
	f.nowAppliedAt = f.clock()
	f.lastDated.Store(&appliedBatch{index: state.clock.dated, at: f.nowAppliedAt, term: state.clock.term, now: state.now})
	f.heap = f.heap[:0]
	f.takeLeases(f.clock())
	f.waitEnds = f.waitEnds[:0]
	f.takeWaits()
	f.restored.Add(1)
	f.mu.Unlock()
	f.deliver()
	return nil
}

func (f *fsm) Close() error { return nil }

// expiry is a lease end in a replica's expiry heap, due at an instant of
// this process's monotonic clock, valid while key still holds token and
// no KEEP renewed it since (renewals).
type expiry struct {
	key      string
	token    uint64
	renewals uint32
	lease    time.Duration // for entries not yet in the heap
}

// takeLoad returns and resets the per-node command counts since the last
// call: the busiest node other than self, and self's own count.
func (f *fsm) takeLoad(self uint64) (busiest loadShare, own uint64) {
	for node, n := range f.load {
		switch {
		case node == self:
			own = n
		case n > busiest.commands || n == busiest.commands && node < busiest.node:
			busiest = loadShare{node: node, commands: n}
		}
	}
	clear(f.load)
	return busiest, own
}

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

// valid reports whether e still names the key's current lease: its token
// and its latest renewal.
func (f *fsm) valid(e expiry) bool {
	l := f.state.locks[e.key]
	return l != nil && l.Token == e.token && l.renewals == e.renewals
}

// compactHeap drops stale heap entries when they outnumber live locks.
func (f *fsm) compactHeap() {
	if len(f.heap) > 64 && len(f.heap) > 2*len(f.state.locks) {
		f.heap.Retain(func(d engine.Deadline[expiry]) bool { return f.valid(d.Item) })
	}
}

// rebuild is run when this replica becomes the group's leader: the heap
// is rebuilt from the replicated lock table, keeping every deadline this
// replica already knew (never shorter) and giving a lock it has no entry
// for a full lease from now.
func (f *fsm) rebuild(now time.Duration) {
	known := make(map[string]time.Duration, len(f.heap))
	for _, d := range f.heap {
		if f.valid(d.Item) {
			known[d.Item.key] = max(known[d.Item.key], d.At)
		}
	}
	f.heap = f.heap[:0]
	for k, l := range f.state.locks {
		at, ok := known[k]
		if !ok {
			at = now + seconds(l.lease)
		}
		f.heap = append(f.heap, engine.Deadline[expiry]{At: at, Item: expiry{key: k, token: l.Token, renewals: l.renewals}})
	}
	f.heap.Init()
}

// due pops the valid entries due at now, re-arming each retry later in
// case the expire proposal is lost (a later token makes it stale).
func (f *fsm) due(now, retry time.Duration, out []expiry) []expiry {
	for at, ok := f.heap.Next(); ok && at <= now; at, ok = f.heap.Next() {
		e := f.heap.Pop().Item
		if !f.valid(e) {
			continue
		}
		out = append(out, e)
		f.heap.Push(now+retry, e)
	}
	return out
}
