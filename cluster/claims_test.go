package cluster

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
	"github.com/rs/zerolog"
)

// replica is one node's replica of a group, applied by hand: the claim
// rules are judged on it as that node would, at the log index and on the
// replicated clock the script gives.
type replica struct {
	t     *testing.T
	f     *fsm
	index uint64
}

func newReplica(t *testing.T, self uint64) *replica {
	n := &Node{cfg: Config{NodeID: self, RTT: 100 * time.Millisecond, ElectionRTT: 4, HeartbeatRTT: 1,
		ForgetAfter: 800 * time.Millisecond, ProposeTimeout: 2 * time.Second, FixedLeaders: true},
		log: zerolog.Nop(), claiming: map[uint64]*pending{}}
	n.liveness.init(self, map[uint64]string{1: "a", 2: "b", 3: "c"})
	g := &group{n: n, maxKeys: 1 << 20, kick: make(chan struct{}, 1), forgotten: map[uint64]bool{}}
	g.buf = make([]byte, headerLen)
	g.newLeader.Store(new(make(chan struct{})))
	g.pastRunsForgotten.Store(true)
	f := newFSM(g, 1)
	f.clock = func() time.Duration { return 0 }
	g.fsm.Store(f)
	return &replica{t: t, f: f}
}

// apply applies one entry of commands at the replicated instant now (s).
func (r *replica) apply(now int64, cmds ...func([]byte) []byte) {
	b := make([]byte, headerLen)
	for _, c := range cmds {
		b = c(b)
	}
	putHeader(b, now*1e9, uint32(len(cmds)))
	r.index++
	if _, err := r.f.Update(sm.Entry{Index: r.index, Cmd: b}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *replica) lock(key string) *lockState {
	return r.f.state.locks[lockKey([]byte("t"), []byte(key))]
}

func (r *replica) judge(key string, node, id uint64, index uint64) claimVerdict {
	l := r.lock(key)
	token := uint64(0)
	if l != nil {
		token = l.Token
	}
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.judgeClaim(lockKey([]byte("t"), []byte(key)), node, id, token, index, false)
}

func (r *replica) takeUnclaimed(peer uint64) []expiry {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.takeUnclaimed(peer, nil)
}

func epoch(term, node uint64) func([]byte) []byte {
	return func(b []byte) []byte { return appendEpoch(b, term, node) }
}

func acquireBy(node, id uint64, key string, wait time.Duration) func([]byte) []byte {
	return func(b []byte) []byte { return appendAcquire(b, node, id, 30, int64(wait), 1<<20, "t", []byte(key)) }
}

func releaseOf(token uint64, key string) func([]byte) []byte {
	return func(b []byte) []byte { return appendRelease(b, 9, 0, token, "t", []byte(key)) }
}

func revokeOf(node, token, term uint64, key string) func([]byte) []byte {
	return func(b []byte) []byte { return appendRevoke(b, cmdRevoke, node, token, term, "t", []byte(key)) }
}

// The revoke command's rule, on every replica alike: it frees only the
// grant it names, made in the epoch it names while that epoch lasts; the
// lock then goes to the next waiter with a new token, and the revoked
// token is never issued again.
func TestRevokeFreesOnlyItsEpochsGrant(t *testing.T) {
	for _, tc := range []struct {
		name      string
		revoke    func(tok uint64) func([]byte) []byte
		newEpoch  bool // a later leader announced itself before the revoke
		wantFreed bool
	}{
		{"its own epoch's grant is taken back", func(tok uint64) func([]byte) []byte { return revokeOf(2, tok, 5, "k") }, false, true},
		{"another token: nothing", func(tok uint64) func([]byte) []byte { return revokeOf(2, tok+1, 5, "k") }, false, false},
		{"another node: nothing", func(tok uint64) func([]byte) []byte { return revokeOf(3, tok, 5, "k") }, false, false},
		{"another epoch than the grant's: nothing", func(tok uint64) func([]byte) []byte { return revokeOf(2, tok, 4, "k") }, false, false},
		{"the epoch ended: nothing", func(tok uint64) func([]byte) []byte { return revokeOf(2, tok, 5, "k") }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReplica(t, 7)
			r.apply(1, epoch(5, 1))
			r.apply(1, acquireBy(2, 100, "k", 0))           // node 2's grant, epoch 5
			r.apply(1, acquireBy(3, 200, "k", time.Minute)) // node 3 waits behind it
			granted := r.lock("k").Token
			if r.lock("k").epoch != 5 {
				t.Fatalf("grant epoch %d, want 5", r.lock("k").epoch)
			}
			if tc.newEpoch {
				r.apply(2, epoch(6, 3))
			}
			r.apply(2, tc.revoke(granted))
			l := r.lock("k")
			if freed := l.node == 3; freed != tc.wantFreed {
				t.Fatalf("lock held by node %d token %d after the revoke; want freed to the waiter: %v", l.node, l.Token, tc.wantFreed)
			}
			if tc.wantFreed && l.Token <= granted {
				t.Fatalf("the waiter got token %d, not above the revoked %d", l.Token, granted)
			}
		})
	}
}

// A claim and the revoke of the same grant, in both orders, on the epoch
// leader (node 1): whichever it judges first wins, and the other loses.
func TestClaimAndRevokeExcludeEachOther(t *testing.T) {
	setup := func(t *testing.T) (*replica, uint64) {
		r := newReplica(t, 1)
		r.apply(1, epoch(5, 1))
		r.apply(1, acquireBy(2, 100, "k", 0))
		return r, r.index
	}
	t.Run("claimed first: never revoked", func(t *testing.T) {
		r, at := setup(t)
		if v := r.judge("k", 2, 100, at); v != claimAccepted {
			t.Fatalf("claim: %v, want accepted", v)
		}
		if taken := r.takeUnclaimed(2); len(taken) != 0 {
			t.Fatalf("a claimed grant was taken back: %+v", taken)
		}
	})
	t.Run("revoked first: the claim is refused", func(t *testing.T) {
		r, at := setup(t)
		taken := r.takeUnclaimed(2)
		if len(taken) != 1 || taken[0].token != r.lock("k").Token {
			t.Fatalf("taken %+v, want node 2's grant", taken)
		}
		if v := r.judge("k", 2, 100, at); v != claimRefused {
			t.Fatalf("claim after the revoke decision: %v, want refused", v)
		}
		// Node 2 was only slow: its later grants are claimed as usual.
		r.apply(2, revokeOf(2, taken[0].token, 5, "k"))
		r.apply(2, acquireBy(2, 101, "k", 0))
		if v := r.judge("k", 2, 101, r.index); v != claimAccepted {
			t.Fatalf("a later grant's claim: %v, want accepted", v)
		}
	})
	t.Run("a grant this replica has not applied yet is not judged", func(t *testing.T) {
		r, at := setup(t)
		if v := r.judge("k", 2, 100, at+1); v != claimNotYet {
			t.Fatalf("claim from a later entry: %v, want not yet", v)
		}
	})
	t.Run("a claim naming another request or token is refused", func(t *testing.T) {
		r, at := setup(t)
		if v := r.judge("k", 2, 999, at); v != claimRefused {
			t.Fatalf("claim for another request: %v, want refused", v)
		}
	})
}

// The leader changes between the grant and its claim. The new leader
// (node 3) takes the old epoch's grants as claimed and never revokes
// them; the old leader (node 1) stops judging once it applied the new
// epoch; a revoke the old leader proposed that applies after the new
// epoch changes nothing.
func TestLeaderChangeBetweenGrantAndClaim(t *testing.T) {
	oldLeader, newLeader := newReplica(t, 1), newReplica(t, 3)
	for _, r := range []*replica{oldLeader, newLeader} {
		r.apply(1, epoch(5, 1))
		r.apply(1, acquireBy(2, 100, "k", 0))
	}
	token := newLeader.lock("k").Token
	if taken := oldLeader.takeUnclaimed(2); len(taken) != 1 {
		t.Fatalf("old leader took %+v", taken)
	}
	for _, r := range []*replica{oldLeader, newLeader} {
		r.apply(2, epoch(6, 3))
		r.apply(2, revokeOf(2, token, 5, "k")) // the old leader's, committed late
	}
	if l := newLeader.lock("k"); l == nil || l.Token != token {
		t.Fatalf("a revoke of the ended epoch freed the lock: %+v", l)
	}
	if v := oldLeader.judge("k", 2, 100, 2); v != claimNotLeader {
		t.Fatalf("old leader judged after the new epoch: %v, want not leader", v)
	}
	if v := newLeader.judge("k", 2, 100, 2); v != claimAccepted {
		t.Fatalf("new leader on the old epoch's grant: %v, want accepted", v)
	}
	if taken := newLeader.takeUnclaimed(2); len(taken) != 0 {
		t.Fatalf("new leader took back an earlier epoch's grant: %+v", taken)
	}
	// Its own epoch's grants are its to judge and take back.
	newLeader.apply(3, releaseOf(token, "k"), acquireBy(2, 101, "k", 0))
	if taken := newLeader.takeUnclaimed(2); len(taken) != 1 || taken[0].token != newLeader.lock("k").Token {
		t.Fatalf("new leader took %+v of its own epoch's grants", taken)
	}
}

// A raft leader whose epoch announcement has not applied yet parks
// claims instead of refusing them.
func TestNewLeaderParksClaimsUntilItsEpochApplies(t *testing.T) {
	r := newReplica(t, 3)
	r.apply(1, epoch(5, 1))
	r.apply(1, acquireBy(2, 100, "k", 0))
	r.f.mu.Lock()
	v := r.f.judgeClaim(lockKey([]byte("t"), []byte("k")), 2, 100, r.lock("k").Token, r.index, true)
	r.f.mu.Unlock()
	if v != claimNotYet {
		t.Fatalf("leader before its epoch applied: %v, want not yet", v)
	}
}

// Snapshots keep the epochs: a replica restored from one judges and
// revokes as the one that wrote it.
func TestSnapshotKeepsEpochs(t *testing.T) {
	r := newReplica(t, 1)
	r.apply(1, epoch(5, 1))
	r.apply(1, acquireBy(2, 100, "k", 0))
	restored := newReplica(t, 1)
	var snap bytes.Buffer
	if err := r.f.SaveSnapshot(&snap, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := restored.f.RecoverFromSnapshot(&snap, nil, nil); err != nil {
		t.Fatal(err)
	}
	if s := restored.f.state; s.epoch != 5 || s.epochLeader != 1 || restored.lock("k").epoch != 5 {
		t.Fatalf("restored epoch %d leader %d lock epoch %d", s.epoch, s.epochLeader, restored.lock("k").epoch)
	}
	if got := restored.lock("k").Token; got != r.lock("k").Token {
		t.Fatalf("restored token %d", got)
	}
}

func (r *replica) n() *Node { return r.f.g.n }

// A grant the group takes back before its node delivered it is answered
// E unavailable (a definitive non-acquisition) and released by the node
// too, never handed to the client: here the grant and its revoke apply in
// one entry, so the revoke reaches the node while the grant waits for its
// claim.
func TestRevokedGrantIsAnsweredUnavailableAndReleased(t *testing.T) {
	n, g, f := localNode()
	rec := newRecorder()
	n.inflight.Admit()
	p := &pending{id: n.nextID(), w: rec, owner: 1, start: n.clock(), deadline: n.clock() + time.Minute, group: g, key: lockKey([]byte("t"), []byte("k"))}
	n.register(p)
	token := f.state.tokens.Last + 1
	b := make([]byte, headerLen)
	b = appendAcquire(b, 1, p.id, 30, 0, 1<<20, "t", []byte("k"))
	b = appendRevoke(b, cmdRevoke, 1, token, f.state.epoch, "t", []byte("k"))
	putHeader(b, 1, 2)
	if _, err := f.Update(sm.Entry{Index: 1, Cmd: b}); err != nil {
		t.Fatal(err)
	}
	if r := rec.wait(t, 1, time.Second); r.Outcome != engine.Unavailable {
		t.Fatalf("a revoked grant was answered %+v, want Unavailable", r)
	}
	g.mu.Lock()
	orphans := g.orphans
	g.mu.Unlock()
	if len(orphans) != 1 || orphans[0].token != token {
		t.Fatalf("orphan releases %+v, want the revoked token %d", orphans, token)
	}
	if f.state.locks[lockKey([]byte("t"), []byte("k"))] != nil {
		t.Fatal("the revoked lock is still held")
	}
}

// loopbackPair is the two ends of one TCP connection on 127.0.0.1: the
// accepted one (where a node reads a peer's claims) and the dialed one.
func loopbackPair(t *testing.T) (accepted, dialed net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { accepted.Close(); dialed.Close() })
	return accepted, dialed
}

// A node killed just after it sent a claim or a witness request is read
// after its death: what it asked on a connection it closed is neither
// accepted nor witnessed (a grant accepted then would be delivered by
// nobody and held for its lease), and a peer whose connection is open is
// answered as before.
func TestClaimsOfAPeerGoneAreNotJudged(t *testing.T) {
	t.Run("claim", func(t *testing.T) {
		r := newReplica(t, 1)
		r.n().groups = []*group{r.f.g}
		r.apply(1, epoch(5, 1))
		r.apply(1, acquireBy(2, 200, "k", 0))
		token := r.lock("k").Token
		served, peer := loopbackPair(t)
		peer.Close()
		sink := &servedSink{conn: served}
		waitUntil(t, 5*time.Second, "the closed connection to be seen as gone", sink.peerGone)
		r.n().onPeerFrame(appendClaim(nil, r.f.g.shardID, 200, 2, token, r.index, lockKey([]byte("t"), []byte("k"))), sink)
		if got := r.takeUnclaimed(2); len(got) != 1 || got[0].token != token {
			t.Fatalf("unclaimed grants of node 2: %+v, want its grant (token %d) still unclaimed, to be taken back", got, token)
		}
	})
	t.Run("witness request", func(t *testing.T) {
		for _, gone := range []bool{true, false} {
			r := witnessedReplica(t, 2)
			r.n().groups = []*group{r.f.g}
			r.apply(1, epoch(5, 1))
			served, peer := loopbackPair(t)
			sink := &servedSink{conn: served}
			if gone {
				peer.Close()
				waitUntil(t, 5*time.Second, "the closed connection to be seen as gone", sink.peerGone)
			} else if sink.peerGone() {
				t.Fatal("an open connection is taken for gone")
			}
			r.n().onPeerFrame(appendWitness(nil, r.f.g.shardID, 5, 42, 0), sink)
			upto, _ := r.answerQuery(5)
			if wantUpto := map[bool]uint64{true: 0, false: 42}[gone]; upto != wantUpto {
				t.Fatalf("peer gone %v: witnessed up to %d, want %d", gone, upto, wantUpto)
			}
			if gone {
				continue
			}
			_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			kind, body, err := readFrame(bufio.NewReader(peer), nil)
			if err != nil || kind != frameLockd || !bytes.Equal(body, appendWitness(nil, r.f.g.shardID, 5, 42, claimAccepted)) {
				t.Fatalf("answer %q %x %v, want the witness verdict", kind, body, err)
			}
		}
	})
}
