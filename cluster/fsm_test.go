package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/histogram"
)

// detachedFSM is a state machine whose node is none of the proposers, so
// its hooks deliver nothing.
func detachedFSM() *fsm { return detachedFSMWithKeys(1 << 20) }

// detachedFSMWithKeys is a replica whose node was started with maxKeys as
// its share of --max-keys.
func detachedFSMWithKeys(maxKeys int) *fsm {
	g := &group{n: &Node{cfg: Config{NodeID: 99}}, maxKeys: maxKeys}
	f := newFSM(g, 1)
	f.clock = func() time.Duration { return 100 }
	g.fsm.Store(f)
	return f
}

type fsmState struct {
	Locks      map[string]lockState
	Now        time.Duration
	Tokens     engine.TokenCounter
	KeysClosed bool
	Queued     int
	Format     uint32
	Tombstones []tenantTombstone
}

type tenantTombstone struct {
	Tenant string
	engine.Tombstone
}

func stateOf(f *fsm) fsmState {
	s := &f.state
	st := fsmState{Locks: map[string]lockState{}, Now: s.now, Tokens: s.tokens, KeysClosed: s.keysClosed, Queued: s.queued, Format: s.format}
	for tenant, ts := range s.tombstones.All() {
		st.Tombstones = append(st.Tombstones, tenantTombstone{tenant, ts})
	}
	for k, l := range s.locks {
		c := *l
		if len(c.queue) == 0 {
			c.queue = nil
		}
		st.Locks[k] = c
	}
	return st
}

// randomBatches makes proposals as several nodes would: acquires with and
// without waits and with and without requesters, releases and keeps of
// current and stale tokens, lease ends of current and stale renewals,
// cancels and abandons of earlier acquires, in a group at log format 4.
func randomBatches(seed uint64, n int) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	now := int64(1_000_000_000)
	out := [][]byte{logBatch(now, func(b []byte) []byte { return appendFormat(b, logFormat4) })}
	var tok uint64
	type request struct {
		node, id  uint64
		requester engine.Requester
		key       []byte
	}
	var acquires []request
	for range n {
		b := make([]byte, headerLen)
		count := uint32(1 + rng.IntN(8))
		for range count {
			key := []byte(fmt.Sprintf("k%d", rng.IntN(5)))
			switch rng.IntN(6) {
			case 0, 1:
				var wait int64
				if rng.IntN(2) == 0 {
					wait = int64(rng.IntN(3_000_000_000))
				}
				r := request{node: uint64(1 + rng.IntN(3)), id: rng.Uint64() | 1, key: key}
				if rng.IntN(3) != 0 {
					r.requester = engine.Requester(1 + rng.Uint64N(1<<40))
				}
				acquires = append(acquires, r)
				b = appendAcquire(b, r.node, r.id, uint16(1+rng.IntN(30)), wait, 1<<20, r.requester, "t", key)
			case 2:
				tok += uint64(rng.IntN(3))
				b = appendRelease(b, uint64(1+rng.IntN(3)), rng.Uint64(), tok, "t", key)
			case 3:
				b = appendKeep(b, uint64(1+rng.IntN(3)), rng.Uint64(), uint64(rng.IntN(int(tok)+2)), uint32(rng.IntN(3)), uint16(1+rng.IntN(30)), "t", key)
			case 4:
				if rng.IntN(20) == 0 { // a node's waiters dropped, some ids kept
					first := rng.Uint64() >> 1
					b = appendForget(b, uint64(1+rng.IntN(3)), first, first+rng.Uint64()>>1)
					break
				}
				if rng.IntN(3) == 0 && len(acquires) > 0 { // a connection closed
					r := acquires[len(acquires)-1-rng.IntN(min(len(acquires), 8))]
					b = appendCancel(b, r.node, r.id, "t", r.key)
					break
				}
				if rng.IntN(2) == 0 && len(acquires) > 0 { // abandoned, perhaps before its acquire applies again
					r := acquires[len(acquires)-1-rng.IntN(min(len(acquires), 8))]
					b = appendAbandon(b, uint64(1+rng.IntN(3)), rng.Uint64(), r.requester, "t", r.key)
					if rng.IntN(2) == 0 {
						b = appendAcquire(b, r.node, r.id, 30, 0, 1<<20, r.requester, "t", r.key)
						count++
					}
					break
				}
				fallthrough
			default:
				b = appendLeaseEnd(b, "t", key)
			}
		}
		// Proposers' clocks disagree a little: the state machine keeps the max.
		now += int64(rng.IntN(200_000_000)) - 50_000_000
		putHeader(b, now, count)
		out = append(out, b)
	}
	return out
}

// Two replicas applying the same log end in the same state, and a
// snapshot restores it exactly.
func TestFSMDeterministicAndSnapshot(t *testing.T) {
	batches := randomBatches(7, 2000)
	a, b := detachedFSM(), detachedFSM()
	for i, cmd := range batches {
		for _, f := range []*fsm{a, b} {
			if _, err := f.Update(sm.Entry{Index: uint64(i + 1), Cmd: cmd}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A lock renewed at the end, so that the snapshot carries renewals.
	renewedKey := []byte("renewed")
	now := int64(a.state.now)
	applyOne(t, a, now, func(b []byte) []byte { return appendAcquire(b, 1, 1, 30, 0, 1<<20, 0, "t", renewedKey) })
	applyOne(t, b, now, func(b []byte) []byte { return appendAcquire(b, 1, 1, 30, 0, 1<<20, 0, "t", renewedKey) })
	token := a.state.locks[lockKey([]byte("t"), renewedKey)].Token
	for _, f := range []*fsm{a, b} {
		applyOne(t, f, now, func(b []byte) []byte { return appendKeep(b, 1, 2, token, 0, 30, "t", renewedKey) })
	}
	if !reflect.DeepEqual(stateOf(a), stateOf(b)) {
		t.Fatal("replicas diverged")
	}
	if a.state.tokens.Last == 0 || len(a.state.locks) == 0 {
		t.Fatalf("the workload did nothing: %+v", stateOf(a))
	}
	renewed := 0
	for _, l := range a.state.locks {
		if l.renewals > 0 {
			renewed++
		}
	}
	if renewed == 0 {
		t.Fatal("no lock in the final state was renewed: the snapshot check does not cover renewals")
	}
	tagged := 0
	for _, l := range a.state.locks {
		if l.requester != 0 {
			tagged++
		}
	}
	if tagged == 0 || a.state.tombstones.Len() == 0 {
		t.Fatalf("%d locks with a requester, %d tombstones: the snapshot check does not cover §6a", tagged, a.state.tombstones.Len())
	}
	var buf bytes.Buffer
	if err := a.SaveSnapshot(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	c := detachedFSM()
	if err := c.RecoverFromSnapshot(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stateOf(a), stateOf(c)) {
		t.Fatalf("snapshot restore differs:\n%+v\n%+v", stateOf(a), stateOf(c))
	}
	if len(c.heap) != len(c.state.locks) {
		t.Fatalf("restored locks not handed to the lease heap: %d of %d", len(c.heap), len(c.state.locks))
	}
	// Continuing after the restore stays in step.
	for i, cmd := range randomBatches(8, 200) {
		for _, f := range []*fsm{a, c} {
			if _, err := f.Update(sm.Entry{Index: uint64(3000 + i), Cmd: cmd}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !reflect.DeepEqual(stateOf(a), stateOf(c)) {
		t.Fatal("restored replica diverged afterwards")
	}
}

// Malformed proposals are skipped, not fatal.
func TestFSMSkipsMalformed(t *testing.T) {
	f := detachedFSM()
	for _, cmd := range [][]byte{nil, {9}, {batchVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 'Z'}} {
		if _, err := f.Update(sm.Entry{Cmd: cmd}); err != nil {
			t.Fatal(err)
		}
	}
}

// A cancel decodes to what was encoded; one cut short is malformed, and a
// kind this build does not know is unknown (which is how an older build
// sees a cancel).
func TestCancelCommandDecodes(t *testing.T) {
	b := appendCancel(nil, 3, 1<<63|42, "tenant", []byte("key"))
	var c command
	rest, err := readCommand(b, &c)
	if err != nil || len(rest) != 0 {
		t.Fatalf("readCommand: %v, %d bytes left", err, len(rest))
	}
	if c.kind != cmdCancel || c.node != 3 || c.id != 1<<63|42 || string(c.tenant) != "tenant" || string(c.key) != "key" {
		t.Fatalf("decoded %+v", c)
	}
	for cut := 1; cut < len(b); cut++ {
		if _, err := readCommand(b[:cut], &c); err != errBadBatch {
			t.Fatalf("cancel cut to %d bytes: %v, want errBadBatch", cut, err)
		}
	}
	unknown := append([]byte{'Z'}, b[1:]...)
	if _, err := readCommand(unknown, &c); !errors.Is(err, errUnknownCommand) {
		t.Fatalf("unknown kind: %v, want errUnknownCommand", err)
	}
}

// The deadline heap: entries validated against the current token; a
// leader's rebuild keeps known deadlines and never shortens them.
func TestExpiryHeapValidatedByToken(t *testing.T) {
	f := detachedFSM()
	b := make([]byte, headerLen)
	b = appendAcquire(b, 1, 1, 10, 0, 1<<20, 0, "t", []byte("a"))
	b = appendAcquire(b, 1, 2, 20, 0, 1<<20, 0, "t", []byte("b"))
	putHeader(b, 1, 2)
	f.Update(sm.Entry{Cmd: b})
	if len(f.heap) != 2 || f.heap[0].At != 100+10e9 {
		t.Fatalf("heap %+v", f.heap)
	}
	// Release a; its entry goes stale and is never reported due.
	b = make([]byte, headerLen)
	b = appendRelease(b, 1, 0, f.state.locks[lockKey([]byte("t"), []byte("a"))].Token, "t", []byte("a"))
	putHeader(b, 2, 1)
	f.Update(sm.Entry{Cmd: b})
	if due := f.due(100+15e9, 5e8, nil); len(due) != 0 {
		t.Fatalf("stale entry reported due: %+v", due)
	}
	f.rebuild(100 + 15e9)
	if len(f.heap) != 1 || f.heap[0].At != 100+20e9 {
		t.Fatalf("rebuild changed a known deadline: %+v", f.heap)
	}
	due := f.due(100+20e9, 5e8, nil)
	if len(due) != 1 || due[0].key != lockKey([]byte("t"), []byte("b")) {
		t.Fatalf("due: %+v", due)
	}
	// Re-armed for a retry in case the expire proposal is lost.
	if len(f.heap) != 1 || f.heap[0].At != 100+20e9+5e8 {
		t.Fatalf("not re-armed: %+v", f.heap)
	}
	// An unknown lock (e.g. after a restore) gets a full lease from now.
	g := detachedFSM()
	g.state.locks["x"] = &lockState{Lease: engine.Lease{Token: 5, End: 3e9}, leaseSeconds: 3}
	g.rebuild(1000)
	if g.heap[0].At != 1000+3e9 {
		t.Fatalf("%+v", g.heap)
	}
}

// The node's Stats read the replicated keys gate: closed at 90 % of the
// limit the commands carry, its refusals counted, open again below 75 %.
func TestStatsReadTheKeysGate(t *testing.T) {
	f := detachedFSMWithKeys(10)
	n := f.g.n
	n.groups = []*group{f.g}
	n.cfg.MaxKeys = 10
	n.inflight, n.waiters = engine.NewAdmissionGate(100), engine.NewAdmissionGate(100)
	var tokens []uint64
	for i := range 10 {
		key := []byte(fmt.Sprint("k", i))
		applyOne(t, f, 1, func(b []byte) []byte { return appendAcquire(b, 1, uint64(i+1), 30, 0, 10, 0, "t", key) })
		if l := f.state.locks[lockKey([]byte("t"), key)]; l != nil {
			tokens = append(tokens, l.Token)
		}
	}
	st := n.Stats().KeysGate
	if len(tokens) != 9 || st.Open || st.Count != 9 || st.Refused != 1 || st.Limit != 10 {
		t.Fatalf("after 10 acquires on a limit of 10: %d granted, gate %+v; want 9 granted, closed, 1 refused", len(tokens), st)
	}
	for i, token := range tokens[:3] {
		key := []byte(fmt.Sprint("k", i))
		applyOne(t, f, 1, func(b []byte) []byte { return appendRelease(b, 1, 0, token, "t", key) })
	}
	if st := n.Stats().KeysGate; !st.Open || st.Count != 6 {
		t.Fatalf("after releasing to 6 keys: gate %+v, want open", st)
	}
	applyOne(t, f, 1, func(b []byte) []byte { return appendAcquire(b, 1, 99, 30, 0, 10, 0, "t", []byte("again")) })
	if st := n.Stats().KeysGate; !st.Open || st.Count != 7 {
		t.Fatalf("after releasing to 6 keys and one more acquire: gate %+v, want open with 7 keys", st)
	}
}

// Hold times are measured on the group's clock, from the grant to the
// release, or to the lease's end for a lease that ran out (the holder had
// all of it, KEEPs included), and counted by the group leader's replica
// only, so that the nodes' /metrics sum to one count per lease.
func TestHoldTimesOnTheGroupsClock(t *testing.T) {
	leader, follower := newReplica(t, 1), newReplica(t, 2)
	leader.f.g.leading.Store(true)
	for _, r := range []*replica{leader, follower} {
		r.apply(1, acquireBy(3, 100, "released", 0))
		r.apply(4, releaseOf(r.lock("released").Token, "released"))
		r.apply(10, acquireBy(3, 101, "expired", 0))
		r.apply(50, acquireBy(3, 102, "expired", 0)) // its 30 s lease ended at 40: settled, then granted again
	}
	var got, none histogram.Snapshot
	leader.f.holdTimes.AddTo(&got)
	follower.f.holdTimes.AddTo(&none)
	if got.Count() != 2 || got.Sum != 3*time.Second+30*time.Second {
		t.Fatalf("leader's hold times: %d, sum %v; want 2 summing to 33s (3 s held, 30 s expired)", got.Count(), got.Sum)
	}
	if none.Count() != 0 {
		t.Fatalf("a follower counted %d hold times", none.Count())
	}
}
