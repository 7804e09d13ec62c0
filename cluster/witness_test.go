package cluster

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// witnessedReplica is node self's replica of a group at log format 2
// whose members are nodes 1, 2 and 3, read in every epoch.
func witnessedReplica(t *testing.T, self uint64) *replica {
	r := newReplica(t, self)
	r.f.state.format = logFormat2
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no peer links: the tests hand the answers in themselves
	r.n().ctx = ctx
	r.n().links.n = r.n()
	r.f.liveAfter = 0 // every epoch begins while this process runs
	r.f.g.members.Store(newMemberView(1<<62, []uint64{1, 2, 3}, 0, self))
	return r
}

func revokeUnwitnessedOf(node, token, term uint64, key string) func([]byte) []byte {
	return func(b []byte) []byte {
		return appendRevoke(b, cmdRevokeUnwitnessed, node, token, term, "t", []byte(key))
	}
}

func (r *replica) witness(epoch, upto uint64) claimVerdict {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.witnessed.witness(&r.f.state, epoch, upto)
}

func (r *replica) answerQuery(epoch uint64) (upto uint64, known bool) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.witnessed.answer(epoch)
}

func (r *replica) noteAnswer(member, epoch, upto uint64, known bool) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	r.f.noteAnswer(member, epoch, upto, known)
}

// silentPass runs node self's expiry step as the group's leader at term,
// with the previous leader silent for longer than an election timeout,
// and returns what it queued.
func (r *replica) silentPass(term, prevLeader uint64) map[byte]int {
	g := r.f.g
	g.wasLeader, g.leaderSeen, g.prevLeader = true, r.n().cfg.NodeID, prevLeader
	r.n().liveness.heard(prevLeader, 0)
	g.expiryStep(5*time.Second, leaderView{leader: r.n().cfg.NodeID, term: term}, r.n().cfg.NodeID)
	got := queued(r.t, g)
	g.take()
	return got
}

// The epoch leader's own grant waits for a witness in a witnessed epoch,
// and is delivered at once in an epoch begun before log format 2 (its
// followers may not know witness requests).
func TestOwnGrantNeedsAWitnessOnlyInAWitnessedEpoch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format uint32
		want   claimVerdict
	}{
		{"format 2: witness first", logFormat2, claimWitness},
		{"format 1: at once", 0, claimAccepted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := witnessedReplica(t, 1)
			r.f.state.format = tc.format
			r.apply(1, epoch(5, 1))
			r.apply(1, acquireBy(1, 100, "k", 0))
			if v := r.judge("k", 1, 100, r.index); v != tc.want {
				t.Fatalf("the leader's own grant judged %v, want %v", v, tc.want)
			}
			if v := r.judge("k", 1, 100, r.index); v != tc.want {
				t.Fatalf("judged again: %v, want %v", v, tc.want)
			}
		})
	}
}

// A witness request and a later leader's query about the same epoch, in
// both orders, on one member: a grant witnessed before the query is in
// its answer; a request after the query is refused, so the old leader
// never delivers a grant the new one may take back.
func TestWitnessAndQueryExcludeEachOther(t *testing.T) {
	t.Run("witness, then query", func(t *testing.T) {
		r := witnessedReplica(t, 2)
		r.apply(1, epoch(5, 1))
		if v := r.witness(5, 42); v != claimAccepted {
			t.Fatalf("witness refused: %v", v)
		}
		if v := r.witness(5, 40); v != claimAccepted {
			t.Fatalf("an older token's witness refused: %v", v)
		}
		upto, known := r.answerQuery(5)
		if !known || upto != 42 {
			t.Fatalf("answer %d known %v, want 42 known: every grant up to 42 may have been delivered", upto, known)
		}
		if v := r.witness(5, 43); v != claimRefused {
			t.Fatalf("a witness request after the query: %v, want refused", v)
		}
	})
	t.Run("query, then witness", func(t *testing.T) {
		r := witnessedReplica(t, 2)
		r.apply(1, epoch(5, 1))
		if upto, known := r.answerQuery(5); !known || upto != 0 {
			t.Fatalf("answer %d known %v before any witness, want none, known", upto, known)
		}
		if v := r.witness(5, 42); v != claimRefused {
			t.Fatalf("witnessed after the query: %v", v)
		}
		if v := r.witness(4, 40); v != claimRefused {
			t.Fatalf("witnessed an older epoch after the query: %v", v)
		}
		r.apply(2, epoch(6, 3))
		if v := r.witness(6, 50); v != claimAccepted {
			t.Fatalf("a later epoch refused: %v", v)
		}
	})
}

// A member witnesses an epoch only once it applied the epoch's beginning
// (so a restart finds the epoch in its log), and a restarted member
// cannot tell what its earlier run witnessed: an epoch begun before its
// log's end at start is answered "cannot tell", never "none".
func TestWitnessWaitsForTheEpochAndForgetsNothingAcrossRestarts(t *testing.T) {
	r := witnessedReplica(t, 2)
	if v := r.witness(5, 42); v != claimNotYet {
		t.Fatalf("witnessed epoch 5 before applying it: %v, want not yet", v)
	}
	restarted := witnessedReplica(t, 2)
	restarted.f.liveAfter = 2 // its log held entries 1 and 2 when it started
	restarted.apply(1, epoch(5, 1))
	restarted.apply(1, acquireBy(3, 300, "x", 0))
	restarted.apply(2, epoch(6, 3)) // entry 3: begun while it runs
	if _, known := restarted.answerQuery(5); known {
		t.Fatal("a restarted member answered for an epoch its earlier run may have witnessed in")
	}
	if upto, known := restarted.answerQuery(6); !known || upto != 0 {
		t.Fatalf("epoch 6, begun since the start: %d known %v, want none, known", upto, known)
	}
}

// A member keeps the records of the two newest epochs it witnessed in; a
// query about one it dropped is answered "cannot tell", never "none".
func TestWitnessBookDroppedEpochIsUnknown(t *testing.T) {
	r := witnessedReplica(t, 2)
	for e := uint64(5); e <= 7; e++ {
		r.apply(int64(e), epoch(e, 1))
		if v := r.witness(e, 10*e); v != claimAccepted {
			t.Fatalf("epoch %d refused: %v", e, v)
		}
	}
	if _, known := r.answerQuery(5); known {
		t.Fatal("a dropped epoch's answer says it is known")
	}
	if upto, known := r.answerQuery(6); !known || upto != 60 {
		t.Fatalf("kept epoch 6: %d known %v", upto, known)
	}
	if v := r.witness(5, 51); v != claimRefused {
		t.Fatalf("a dropped epoch took a witness: %v", v)
	}
}

// unwitnessedScript: node 1 leads epoch 5 (witnessed) and grants itself
// keys a and b, node 3 key c; node 2 (this replica) witnessed a, and
// becomes leader of epoch 6; node 1 fell silent.
func unwitnessedScript(t *testing.T) (r *replica, a, b, c uint64) {
	r = witnessedReplica(t, 2)
	r.apply(1, epoch(5, 1))
	r.apply(1, acquireBy(1, 100, "a", 0), acquireBy(1, 101, "b", 0), acquireBy(3, 300, "c", 0))
	r.apply(1, acquireBy(3, 301, "b", time.Minute)) // node 3 waits for b
	a, b, c = r.lock("a").Token, r.lock("b").Token, r.lock("c").Token
	if v := r.witness(5, a); v != claimAccepted {
		t.Fatalf("witness refused: %v", v)
	}
	r.apply(2, epoch(6, 2))
	return r, a, b, c
}

// The new leader takes back the dead leader's own grants that no member
// witnessed, once every voting member but the dead one answered; the key
// goes to its waiter with a new token, and the witnessed grant and the
// other node's grant stay.
func TestNewLeaderRevokesTheDeadLeadersUnwitnessedGrants(t *testing.T) {
	r, a, b, c := unwitnessedScript(t)
	if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 0 {
		t.Fatalf("revoked before node 3 answered: %v", got)
	}
	r.noteAnswer(3, 6, 0, true) // an answer about another epoch
	if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 0 {
		t.Fatalf("revoked on an answer about another epoch: %v", got)
	}
	r.noteAnswer(3, 5, 0, true)
	if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 1 {
		t.Fatalf("queued %v, want one revoke (b)", got)
	}
	r.apply(3, revokeUnwitnessedOf(1, b, 5, "b"))
	if l := r.lock("b"); l.node != 3 || l.Token <= b {
		t.Fatalf("b after the revoke: node %d token %d, want node 3's waiter with a token above %d", l.node, l.Token, b)
	}
	if r.lock("a").Token != a || r.lock("c").Token != c {
		t.Fatal("a witnessed grant or another node's grant was taken back")
	}
	if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 0 {
		t.Fatalf("revoked again: %v", got)
	}
}

// Whatever a member witnessed, by its answer or by this replica's own
// record, is kept; a member that cannot tell keeps them all.
func TestWitnessedOrUnknownGrantsStay(t *testing.T) {
	t.Run("another member witnessed b", func(t *testing.T) {
		r, _, b, _ := unwitnessedScript(t)
		r.noteAnswer(3, 5, b, true)
		if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 0 {
			t.Fatalf("queued %v, want nothing: a and b were witnessed", got)
		}
	})
	t.Run("a member cannot tell", func(t *testing.T) {
		r, _, _, _ := unwitnessedScript(t)
		r.noteAnswer(3, 5, 0, false)
		r.noteAnswer(3, 5, 0, true) // a later answer does not bring them back
		if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 0 {
			t.Fatalf("queued %v, want nothing", got)
		}
	})
	t.Run("the membership changed since the epoch began", func(t *testing.T) {
		r, _, _, _ := unwitnessedScript(t)
		r.f.g.members.Store(newMemberView(1<<62, []uint64{1, 2, 3}, r.index, r.n().cfg.NodeID))
		r.noteAnswer(3, 5, 0, true)
		if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 0 {
			t.Fatalf("queued %v, want nothing: a member that left may have witnessed", got)
		}
	})
}

// The old leader, alive after all, claims its grant with the new leader,
// in both orders against the revoke: a claim judged first makes the new
// leader its witness (no revoke); one judged after the grant was taken
// is refused.
func TestOldLeadersClaimAndUnwitnessedRevokeExcludeEachOther(t *testing.T) {
	t.Run("claim first", func(t *testing.T) {
		r, _, _, _ := unwitnessedScript(t)
		if v := r.judge("b", 1, 101, r.index); v != claimAccepted {
			t.Fatalf("claim judged %v, want accepted", v)
		}
		r.noteAnswer(3, 5, 0, true)
		if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 0 {
			t.Fatalf("queued %v after accepting the claim", got)
		}
	})
	t.Run("revoke first", func(t *testing.T) {
		r, _, _, _ := unwitnessedScript(t)
		r.noteAnswer(3, 5, 0, true)
		if got := r.silentPass(6, 1); got[cmdRevokeUnwitnessed] != 1 {
			t.Fatalf("queued %v, want b's revoke", got)
		}
		if v := r.judge("b", 1, 101, r.index); v != claimRefused {
			t.Fatalf("claim after the revoke judged %v, want refused", v)
		}
	})
}

// The unwitnessed revoke's rule, on every replica alike: only the grant
// it names, of the node and epoch it names, and only once that epoch has
// ended (a revoke of the current epoch's grants is cmdRevoke's).
func TestRevokeUnwitnessedAppliesOnlyAfterItsEpoch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		newEpoch  bool
		node      uint64
		term      uint64
		wantFreed bool
	}{
		{"the ended epoch's leader's grant", true, 1, 5, true},
		{"the epoch still lasts: nothing", false, 1, 5, false},
		{"another node: nothing", true, 3, 5, false},
		{"another epoch: nothing", true, 1, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReplica(t, 7)
			r.apply(1, epoch(5, 1))
			r.apply(1, acquireBy(1, 100, "k", 0))
			r.apply(1, acquireBy(3, 200, "k", time.Minute))
			granted := r.lock("k").Token
			if tc.newEpoch {
				r.apply(2, epoch(6, 2))
			}
			r.apply(2, revokeUnwitnessedOf(tc.node, granted, tc.term, "k"))
			if freed := r.lock("k").node == 3; freed != tc.wantFreed {
				t.Fatalf("freed %v, want %v", freed, tc.wantFreed)
			}
		})
	}
}

// A replica restored from a snapshot judges its epoch's own grants as the
// others do: whether the epoch is witnessed travels in the snapshot.
func TestSnapshotKeepsWhetherTheEpochIsWitnessed(t *testing.T) {
	r := witnessedReplica(t, 2)
	r.apply(1, epoch(5, 1))
	if !r.f.state.witnessing.on {
		t.Fatal("an epoch begun at format 2 is not witnessed")
	}
	var b bytes.Buffer
	if err := r.f.state.save(&b, nil); err != nil {
		t.Fatal(err)
	}
	s, err := restore(&b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.witnessing != r.f.state.witnessing || s.format != logFormat2 || s.epoch != 5 {
		t.Fatalf("restored witnessing %v format %d epoch %d, want %v 2 5", s.witnessing, s.format, s.epoch, r.f.state.witnessing)
	}
}

// A group whose format rises to 2 during an epoch witnesses the epoch
// leader's own grants from the next one on: those made before were
// delivered without a witness, and the next leader does not suspect them.
func TestFormatRaisedDuringAnEpochWitnessesTheGrantsAfterIt(t *testing.T) {
	r := witnessedReplica(t, 1)
	r.f.state.format = 0 // format 1
	r.apply(1, epoch(5, 1))
	r.apply(1, acquireBy(1, 100, "before", 0))
	r.apply(2, func(b []byte) []byte { return appendFormat(b, logFormat2) })
	r.apply(3, acquireBy(1, 101, "after", 0))
	if v := r.judge("before", 1, 100, r.index); v != claimAccepted {
		t.Fatalf("a grant from before the raise judged %v, want accepted at once", v)
	}
	if v := r.judge("after", 1, 101, r.index); v != claimWitness {
		t.Fatalf("a grant from after the raise judged %v, want a witness first", v)
	}

	next := witnessedReplica(t, 2)
	next.f.state.format = 0
	next.apply(1, epoch(5, 1))
	next.apply(1, acquireBy(1, 100, "before", 0))
	next.apply(2, func(b []byte) []byte { return appendFormat(b, logFormat2) })
	next.apply(3, acquireBy(1, 101, "after", 0))
	next.apply(4, epoch(6, 2))
	after := next.lock("after").Token
	if got := next.f.book.suspects.grants; len(got) != 1 || got[after] == "" {
		t.Fatalf("suspects %v, want only the grant made after the raise (token %d)", got, after)
	}
}

// The epoch leader delivers its own grants up to the token a witness
// names, and no later one; a refusal up to a token answers those grants
// E unavailable and releases them.
func TestWitnessVerdictSettlesTheOwnGrantsUpToItsToken(t *testing.T) {
	r := witnessedReplica(t, 1)
	n := r.n()
	n.reg, n.wakeReg = map[uint64]*pending{}, make(chan struct{}, 1)
	n.inflight = engine.NewAdmissionGate(100)
	n.idBase.Store(1000)
	rec := newRecorder()
	r.apply(1, epoch(5, 1))
	var ids [3]uint64
	for i := range ids {
		n.inflight.Admit()
		p := &pending{id: n.nextID(), w: rec, owner: uint64(i + 1), start: n.clock(), deadline: n.clock() + time.Minute,
			group: r.f.g, key: lockKey([]byte("t"), []byte("k"+strconv.Itoa(i)))}
		n.register(p)
		ids[i] = p.id
	}
	r.apply(1, acquireBy(1, ids[0], "k0", 0), acquireBy(1, ids[1], "k1", 0), acquireBy(1, ids[2], "k2", 0))
	if len(n.claiming) != 3 {
		t.Fatalf("%d own grants wait for a witness, want 3", len(n.claiming))
	}
	tokens := [3]uint64{r.lock("k0").Token, r.lock("k1").Token, r.lock("k2").Token}

	n.onPeerFrame(appendWitness(nil, r.f.g.shardID, 4, tokens[2], claimAccepted), nil)
	if len(n.claiming) != 3 {
		t.Fatal("a witness of another epoch delivered a grant")
	}
	n.onPeerFrame(appendWitness(nil, r.f.g.shardID, 5, tokens[1], claimAccepted), nil)
	for i, owner := range []uint64{1, 2} {
		if got := rec.wait(t, owner, time.Second); got.Outcome != engine.Granted || got.Token != tokens[i] {
			t.Fatalf("owner %d answered %+v, want its grant (token %d)", owner, got, tokens[i])
		}
	}
	if len(n.claiming) != 1 {
		t.Fatalf("%d own grants still wait, want the one above the witnessed token", len(n.claiming))
	}
	n.onPeerFrame(appendWitness(nil, r.f.g.shardID, 5, tokens[2], claimRefused), nil)
	if got := rec.wait(t, 3, time.Second); got.Outcome != engine.Unavailable {
		t.Fatalf("a refused grant answered %+v, want Unavailable", got)
	}
	if o := r.f.g.orphans; len(o) != 1 || o[0].token != tokens[2] {
		t.Fatalf("releases %+v, want the refused grant's token %d", o, tokens[2])
	}
}

// An epoch leader asks one member to witness its own grant, the one it
// heard from last; when that member is dead, the grant is still
// delivered: the request is asked again of every member.
func TestOwnGrantIsDeliveredWhenItsFirstWitnessIsDead(t *testing.T) {
	if testing.Short() {
		t.Skip("3 NodeHosts skipped in -short mode")
	}
	tc := newTestCluster(t, 3, func(c *Config) { c.Groups = 1 })
	leader := tc.leaderOf("w")
	l := tc.node(leader)
	waitUntil(t, 15*time.Second, "the group's format to rise to 2", func() bool { return l.LogFormat(0) == logFormat2 })
	rec := newRecorder()
	if r := acquire(t, l, rec, 1, "w", 30*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("leader's own grant with every member up: %+v", r)
	}
	var followers []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != leader {
			followers = append(followers, id)
		}
	}
	first := l.liveness.latest(followers)
	tc.stop(first)
	// The dead member stays the one heard from last, as in the instant
	// after a kill.
	l.liveness.heard(first, l.clock()+time.Hour)
	if r := acquire(t, l, rec, 2, "w2", 30*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("leader's own grant with its first witness (node %d) dead: %+v", first, r)
	}
}

// FuzzPeerFrame feeds arbitrary bodies of the peer messages a node
// answers without asking its NodeHost — claim verdicts, witness requests
// and their verdicts, queries and their answers, format statements,
// send-again — to the leader of a witnessed epoch whose own grant waits
// for a witness. Whatever arrives, nothing panics, and the grant is
// either still waiting or answered as a grant or a definite refusal.
// (Claims are judged after a look at the NodeHost's leader, which these
// unit replicas do not have: the process tests send those.)
func FuzzPeerFrame(f *testing.F) {
	f.Add(appendWitness(nil, 1, 5, 3, 0))
	f.Add(appendWitness(nil, 1, 5, 3, claimAccepted))
	f.Add(appendWitness(nil, 1, 5, 2, claimRefused))
	f.Add(appendVerdict(nil, 1, 1<<63|1001, 3, claimAccepted))
	f.Add(appendWitnessQuery(nil, 1, 5))
	f.Add(appendWitnessAnswer(nil, 1, 5, 3, 3, true))
	f.Add(appendStatement(nil, 2, logFormat2))
	f.Add([]byte{peerSendAgain, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 0 && body[0] == peerClaims {
			return
		}
		r := witnessedReplica(t, 1)
		n := r.n()
		r.f.g.shardID = 1
		n.groups = []*group{r.f.g}
		n.reg, n.wakeReg = map[uint64]*pending{}, make(chan struct{}, 1)
		n.inflight = engine.NewAdmissionGate(100)
		n.idBase.Store(1000)
		rec := newRecorder()
		r.apply(1, epoch(5, 1))
		n.inflight.Admit()
		p := &pending{id: n.nextID(), w: rec, owner: 1, start: n.clock(), deadline: n.clock() + time.Minute,
			group: r.f.g, key: lockKey([]byte("t"), []byte("k"))}
		n.register(p)
		r.apply(1, acquireBy(1, p.id, "k", 0))
		n.onPeerFrame(body, nobodySink{})
		n.onPeerFrame(body, nil)
		if len(n.claiming) == 1 {
			return
		}
		if got := rec.wait(t, 1, time.Second); got.Outcome != engine.Granted && got.Outcome != engine.Unavailable {
			t.Fatalf("the waiting grant was answered %+v", got)
		}
	})
}
