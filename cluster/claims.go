package cluster

// This file owns grant claims: a node hands a grant to its client only
// after the group's epoch leader has accepted its claim on it, and the
// epoch leader takes back (cmdRevoke) the grants of a silent node that
// were never claimed, so that a dead node's undelivered grants free their
// keys within a failure-detection interval instead of a lease.
//
// Why it is safe (docs/cluster.md, Undelivered grants, has the argument
// in full): every grant carries the epoch it was made in (cmdEpoch, the
// Raft term of the leader that announced itself), and a revoke applies
// only to a grant of the epoch it names while that epoch lasts. Only the
// epoch's leader proposes revokes for it, only for grants it has refused
// claims on from then, and it judges claims under the same lock. A grant
// of an earlier epoch is taken as claimed by every later leader (it may
// have been delivered), and no revoke of its epoch can apply any more.

import (
	"encoding/binary"
	"time"

	"github.com/lockd/lockd/engine"
)

// claimVerdict is an epoch leader's answer to a claim.
type claimVerdict uint8

const (
	claimAccepted  claimVerdict = iota + 1 // deliver: the grant will not be revoked
	claimRefused                           // never deliver: the grant is taken back or no longer current
	claimNotLeader                         // ask the group's leader (again, later)
	claimNotYet                            // this replica has not applied the grant or its own epoch yet
	claimWitness                           // the epoch leader's own grant: deliver once a member witnessed it (witness.go)
)

// claimBook is what an epoch leader knows of claims, node-local and kept
// under its fsm's lock: the grants of its epoch to other nodes' requests
// that no claim has reached yet, and those it took back.
type claimBook struct {
	epoch     uint64                       // the epoch the book is for; a new one clears it
	unclaimed map[uint64]map[string]uint64 // node → lock key → token
	revoking  map[string]uint64            // lock key → token taken back
	suspects  suspects                     // the previous epoch leader's own grants (witness.go)
}

// sync empties the book when the replica's epoch moved on.
func (b *claimBook) sync(s *replicated) {
	if b.epoch == s.epoch {
		return
	}
	b.epoch = s.epoch
	b.unclaimed = nil
	b.revoking = nil
	b.suspects = suspects{}
}

// noteGrants records, on the epoch's leader, the grants just applied to
// other nodes' requests: each waits for its node's claim.
func (b *claimBook) noteGrants(s *replicated, self uint64, answers []answer) {
	if s.epochLeader != self {
		return
	}
	b.sync(s)
	for _, a := range answers {
		if a.r.Outcome != engine.Granted || a.node == self || a.kind != answerDirect && a.kind != answerHandOff {
			continue
		}
		if b.unclaimed == nil {
			b.unclaimed = make(map[uint64]map[string]uint64)
		}
		m := b.unclaimed[a.node]
		if m == nil {
			m = make(map[string]uint64)
			b.unclaimed[a.node] = m
		}
		m[a.key] = a.r.Token
	}
}

// judgeClaim decides node's claim on the grant of token to its request id
// on key, made by the entry at index. Called with the fsm's lock held.
func (f *fsm) judgeClaim(key string, node, id, token, index uint64, raftLeader bool) claimVerdict {
	s := &f.state
	self := f.g.n.cfg.NodeID
	switch {
	case f.applied < index:
		return claimNotYet
	case s.epochLeader != self && raftLeader:
		return claimNotYet // its own epoch announcement is on its way
	case s.epochLeader != self:
		return claimNotLeader
	}
	l := s.locks[key]
	if l == nil || l.Token != token || l.node != node || l.id != id || l.Lapsed(s.now) {
		return claimRefused
	}
	f.book.sync(s)
	switch {
	case f.book.revoking[key] == token:
		return claimRefused
	case node == self && l.epoch == s.epoch && s.witnessing.covers(l):
		return claimWitness
	case node == self:
		return claimAccepted // of an earlier epoch, or of one without witnesses: never taken back
	case l.epoch != s.epoch:
		// An earlier epoch's grant counts as claimed; if it is one of the
		// previous leader's own, this leader is its witness now.
		delete(f.book.suspects.grants, token)
		return claimAccepted
	}
	if m := f.book.unclaimed[node]; m[key] == token {
		delete(m, key)
	}
	return claimAccepted
}

// takeUnclaimed moves peer's unclaimed grants of this replica's epoch,
// still current, to the revoked, and returns them: the leader proposes
// their revokes and refuses claims on them from now on. Called with the
// fsm's lock held.
func (f *fsm) takeUnclaimed(peer uint64, out []expiry) []expiry {
	s := &f.state
	if s.epochLeader != f.g.n.cfg.NodeID {
		return out
	}
	f.book.sync(s)
	for k, token := range f.book.unclaimed[peer] {
		if l := s.locks[k]; l != nil && l.Token == token && l.node == peer && l.epoch == s.epoch {
			if f.book.revoking == nil {
				f.book.revoking = make(map[string]uint64)
			}
			f.book.revoking[k] = token
			out = append(out, expiry{key: k, token: token})
		}
	}
	delete(f.book.unclaimed, peer)
	if len(f.book.revoking) > 64 && len(f.book.revoking) > 2*len(s.locks) {
		for k, token := range f.book.revoking {
			if l := s.locks[k]; l == nil || l.Token != token {
				delete(f.book.revoking, k)
			}
		}
	}
	return out
}

// revokeUnclaimed queues in g's batch the revokes of peer's unclaimed
// grants; the expiry driver runs it while g's leader takes peer for dead.
// It reports whether it queued any.
func (g *group) revokeUnclaimed(peer uint64) bool {
	f := g.fsm.Load()
	f.mu.Lock()
	taken := f.takeUnclaimed(peer, nil)
	epoch := f.state.epoch
	f.mu.Unlock()
	if len(taken) == 0 {
		return false
	}
	g.n.log.Info().Uint64("group", g.shardID).Uint64("peer", peer).Int("grants", len(taken)).
		Msg("taking back grants a silent node never claimed")
	g.n.stats.revokes.Add(uint64(len(taken)))
	for _, e := range taken {
		tenant, key := splitLockKey(e.key)
		g.queue(func(b []byte) []byte { return appendRevoke(b, cmdRevoke, peer, e.token, epoch, tenant, key) })
	}
	return true
}

// grantClaim is a grant to one of this node's requests, held back until
// the group's epoch leader accepts the claim on it.
type grantClaim struct {
	g       *group
	key     string
	r       engine.Result
	index   uint64        // the entry that made the grant
	askedOf uint64        // the leader last asked (this node: its witnesses), 0 for none
	askedAt time.Duration // when
	// witnessEpoch is the epoch whose members were asked to witness this
	// node's own grant, 0 for none (witness.go).
	witnessEpoch uint64
}

// holdForClaimLocked holds the grant r to the live request p until its
// claim is settled. Called with regMu held.
func (n *Node) holdForClaimLocked(p *pending, g *group, key string, r engine.Result, index uint64) {
	p.claim = &grantClaim{g: g, key: key, r: r, index: index}
	n.claiming[p.id] = p
	n.toAsk = append(n.toAsk, p)
}

// dropClaimLocked releases the grant a retiring request p held for its
// claim: it was never delivered. Called with regMu held, from
// finishLocked.
func (n *Node) dropClaimLocked(p *pending) {
	c := p.claim
	p.claim = nil
	delete(n.claiming, p.id)
	c.g.orphan(c.key, c.r.Token)
}

// askClaims settles or sends the claims held since the last call, or with
// all every claim not settled yet (the expiry driver's pass, and after a
// leader change): judged here when this node leads the group's epoch,
// sent to the group's leader otherwise, and again after claimRetry
// without a verdict (the leader may have died with it, or the link
// dropped it). Claims that find no leader ready wait for the next call.
func (n *Node) askClaims(all bool) {
	now := n.clock()
	retry := n.claimRetry()
	var settled []settledClaim
	claims := map[uint64][]byte{} // claims to leaders
	var asks []witnessAsk
	readMembers := false
	n.regMu.Lock()
	held := n.toAsk
	n.toAsk = n.askSpare[:0]
	if all {
		held = held[:0]
		for _, p := range n.claiming {
			held = append(held, p)
		}
	}
	for _, p := range held {
		c := p.claim
		if c == nil {
			continue // settled or retired since it was queued
		}
		f := c.g.fsm.Load()
		f.mu.Lock()
		v := claimNotLeader
		if f.state.epochLeader == n.cfg.NodeID {
			v = f.judgeClaim(c.key, n.cfg.NodeID, p.id, c.r.Token, c.index, true)
		}
		epoch := f.state.epoch
		f.mu.Unlock()
		if v == claimWitness {
			witnesses, ok := c.g.witnesses(epoch)
			switch {
			case !ok: // the members are read on the expiry driver's next pass
				n.toAsk = append(n.toAsk, p)
				readMembers = true
			case len(witnesses) == 0: // a group of one: nobody could take it back
				settled = append(settled, n.settleLocked(p, claimAccepted))
			case c.askedOf != n.cfg.NodeID || now-c.askedAt >= retry:
				// One witness is enough: the first request goes to the
				// member heard from last, the likeliest to answer soonest;
				// a retry goes to all (that one may be dead).
				only := uint64(0)
				if c.askedOf != n.cfg.NodeID {
					only = n.liveness.latest(witnesses)
				}
				c.askedOf, c.askedAt, c.witnessEpoch = n.cfg.NodeID, now, epoch
				for _, w := range witnesses {
					if only == 0 || w == only {
						asks = askWitness(asks, w, c.g.shardID, epoch, c.r.Token)
					}
				}
			}
			continue
		}
		if v == claimAccepted || v == claimRefused {
			settled = append(settled, n.settleLocked(p, v))
			continue
		}
		leader := n.Leader(c.g.idx)
		switch {
		case leader == 0 || leader == n.cfg.NodeID:
			// An election, or this node leads and its epoch is not applied
			// yet: asked again after the next apply or leader change.
			n.toAsk = append(n.toAsk, p)
		case c.askedOf != leader || now-c.askedAt >= retry:
			c.askedOf, c.askedAt = leader, now
			claims[leader] = appendClaim(claims[leader], c.g.shardID, p.id, n.cfg.NodeID, c.r.Token, c.index, c.key)
		}
	}
	clear(held)
	n.askSpare = held[:0]
	n.regMu.Unlock()
	for leader, b := range claims {
		n.links.send(leader, b)
	}
	n.sendWitnessAsks(asks)
	n.finishSettled(settled)
	if readMembers {
		n.expiryDue()
	}
}

// witnessAsk is one request to a member to witness this node's own
// grants of a group's epoch, up to the newest token among them.
type witnessAsk struct{ member, shard, epoch, upto uint64 }

// askWitness adds the grant of token to asks.
func askWitness(asks []witnessAsk, member, shard, epoch, token uint64) []witnessAsk {
	for i := range asks {
		if a := &asks[i]; a.member == member && a.shard == shard && a.epoch == epoch {
			a.upto = max(a.upto, token)
			return asks
		}
	}
	return append(asks, witnessAsk{member, shard, epoch, token})
}

// sendWitnessAsks sends asks, one message per member.
func (n *Node) sendWitnessAsks(asks []witnessAsk) {
	for len(asks) > 0 {
		member := asks[0].member
		var b []byte
		rest := asks[:0]
		for _, a := range asks {
			if a.member == member {
				b = appendWitness(b, a.shard, a.epoch, a.upto, 0)
			} else {
				rest = append(rest, a)
			}
		}
		n.links.send(member, b)
		asks = rest
	}
}

// claimRetry is how long a claim waits for a verdict before it is asked
// again.
func (n *Node) claimRetry() time.Duration { return 2 * n.cfg.RTT }

// settledClaim is a claim's outcome, carried out outside regMu.
type settledClaim struct {
	p       *pending
	c       *grantClaim
	verdict claimVerdict
}

// settleLocked retires the live request p whose claim was judged v.
// Called with regMu held.
func (n *Node) settleLocked(p *pending, v claimVerdict) settledClaim {
	c := p.claim
	p.claim = nil
	delete(n.claiming, p.id)
	n.finishLocked(p)
	return settledClaim{p: p, c: c, verdict: v}
}

// finishSettled answers the requests of settled claims: the grant when
// accepted; E unavailable when refused, a definitive non-acquisition,
// since the grant is taken back (and released from here too, in case the
// revoke's proposal is lost).
func (n *Node) finishSettled(settled []settledClaim) {
	for _, s := range settled {
		if s.verdict == claimAccepted {
			s.p.w.Resolve(s.p.owner, n.deliverable(s.p, s.c.r))
			continue
		}
		s.c.g.orphan(s.c.key, s.c.r.Token)
		n.stats.unavailable.Add(1)
		s.p.w.Resolve(s.p.owner, engine.Result{Outcome: engine.Unavailable})
	}
}

// deliverable is a grant as the client gets it: waited_ms no more than
// this node's own elapsed time since receipt, so the client's validity
// bound never ends after the lease on any replica.
func (n *Node) deliverable(p *pending, r engine.Result) engine.Result {
	r.Waited = max(0, min(r.Waited, n.clock()-p.start))
	return r
}

// onVerdicts settles the claims an epoch leader answered.
func (n *Node) onVerdicts(b []byte) {
	var settled []settledClaim
	again := false
	n.regMu.Lock()
	for len(b) >= verdictLen {
		id, token, v := binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:]), claimVerdict(b[24])
		b = b[verdictLen:]
		p := n.claiming[id]
		if p == nil || p.claim.r.Token != token {
			continue // settled already, or its request retired
		}
		switch v {
		case claimAccepted, claimRefused:
			settled = append(settled, n.settleLocked(p, v))
		default:
			p.claim.askedOf, again = 0, true
		}
	}
	n.regMu.Unlock()
	n.finishSettled(settled)
	if again {
		n.expiryDue() // its pass asks again, of the leader it then knows
	}
}

// revoked settles the claim of this node's request id on token as
// refused: the group took the grant back (this node was taken for dead).
func (g *group) revoked(node, id, token uint64) {
	n := g.n
	if node != n.cfg.NodeID {
		return
	}
	var settled []settledClaim
	n.regMu.Lock()
	if p := n.claiming[id]; p != nil && p.claim.r.Token == token {
		settled = append(settled, n.settleLocked(p, claimRefused))
	}
	n.regMu.Unlock()
	n.finishSettled(settled)
}

// verdictSink answers a peer's claims on the connection they came by.
// Claims and witness requests from a peer that is gone are not judged,
// only dropped (peerGone): a dead node's grants stay unclaimed, to be
// taken back, and a live node whose connection broke asks again.
type verdictSink interface {
	sendVerdicts(b []byte)
	peerGone() bool
}

// onClaims judges the claims a peer sent, as its group's leader, and
// answers each with a verdict through sink: at once, or once this replica
// has applied what it still lacks (judgeParked).
func (n *Node) onClaims(b []byte, sink verdictSink) {
	if sink.peerGone() {
		return
	}
	var out []byte
	for {
		shard, c, rest, ok := readClaim(b)
		if !ok {
			break
		}
		b = rest
		c.sink = sink
		v := claimNotLeader // ask the leader again, later
		// A peer claims its own grants.
		if g := n.groupByShard(shard); g != nil && c.node != n.cfg.NodeID {
			v = g.judge(c)
		}
		if v != claimNotYet {
			out = appendVerdict(out, shard, c.id, c.token, v)
		}
	}
	if len(out) > 0 {
		sink.sendVerdicts(out)
	}
}

// parkedClaim is a peer's claim, or its witness request (epoch set, and
// token the newest it covers; witness.go), that this replica could not
// judge yet.
type parkedClaim struct {
	key                    string
	node, id, token, index uint64
	epoch                  uint64
	sink                   verdictSink
	at                     time.Duration // when it was first parked
}

// judge judges c as g's leader, or witnesses it, parking it while this
// replica is behind.
func (g *group) judge(c parkedClaim) claimVerdict {
	f := g.fsm.Load()
	if f == nil {
		return claimNotLeader
	}
	var v claimVerdict
	if c.epoch != 0 {
		f.mu.Lock()
		v = f.witnessed.witness(&f.state, c.epoch, c.token)
	} else {
		leader := g.n.Leader(g.idx) == g.n.cfg.NodeID
		f.mu.Lock()
		v = f.judgeClaim(c.key, c.node, c.id, c.token, c.index, leader)
	}
	f.mu.Unlock()
	if v == claimNotYet {
		if c.at == 0 {
			c.at = g.n.clock()
		}
		g.mu.Lock()
		g.parked = append(g.parked, c)
		g.mu.Unlock()
		g.n.parkedClaims.Add(1)
	}
	return v
}

// appliedClaims runs after every apply: parked peer claims are judged
// again, and this node's newly held grants settled or asked for.
func (g *group) appliedClaims() {
	n := g.n
	if n.parkedClaims.Load() > 0 {
		g.judgeParked(false)
	}
	n.regMu.Lock()
	ask := len(n.toAsk) > 0
	n.regMu.Unlock()
	if ask {
		n.askClaims(false)
	}
}

// judgeParked judges g's parked claims again; with expire, those parked
// for longer than the propose timeout are answered "not leader", so that
// a replica that stopped leading does not keep them.
func (g *group) judgeParked(expire bool) {
	n := g.n
	g.mu.Lock()
	parked := g.parked
	g.parked = nil
	g.mu.Unlock()
	if len(parked) == 0 {
		return
	}
	n.parkedClaims.Add(-int64(len(parked)))
	now := n.clock()
	verdicts, witnessed := map[verdictSink][]byte{}, map[verdictSink][]byte{}
	gone := map[verdictSink]bool{}
	for _, c := range parked {
		peerGone, seen := gone[c.sink]
		if !seen {
			peerGone = c.sink.peerGone()
			gone[c.sink] = peerGone
		}
		if peerGone {
			continue
		}
		expired := expire && now-c.at > n.cfg.ProposeTimeout
		v := claimNotLeader
		if !expired {
			if v = g.judge(c); v == claimNotYet {
				continue // parked again
			}
		}
		switch {
		case c.epoch == 0:
			verdicts[c.sink] = appendVerdict(verdicts[c.sink], g.shardID, c.id, c.token, v)
		case !expired: // an expired witness request is dropped: its epoch leader asks every member again
			witnessed[c.sink] = appendWitness(witnessed[c.sink], g.shardID, c.epoch, c.token, v)
		}
	}
	for _, answers := range []map[verdictSink][]byte{verdicts, witnessed} {
		for sink, b := range answers {
			sink.sendVerdicts(b)
		}
	}
}

// groupByShard is the group of a Raft shard id, nil if none.
func (n *Node) groupByShard(shard uint64) *group {
	for _, g := range n.groups {
		if g.shardID == shard {
			return g
		}
	}
	return nil
}

// Claim and verdict encodings, inside a transport frame of kind 'L':
//
//	claims:   'c' | count × (shard u64 | id u64 | node u64 | token u64 | index u64 | key len u16 | key)
//	verdicts: 'v' | count × (shard u64 | id u64 | token u64 | verdict u8)
//
// A claim's index is that of the entry that made the grant.
const (
	claimFixedLen = 8 + 8 + 8 + 8 + 8 + 2
	verdictLen    = 8 + 8 + 8 + 1
	peerClaims    = 'c'
	peerVerdicts  = 'v'
)

// appendClaim appends a claim to b.
func appendClaim(b []byte, shard, id, node, token, index uint64, key string) []byte {
	if len(b) == 0 {
		b = append(b, peerClaims)
	}
	b = binary.BigEndian.AppendUint64(b, shard)
	b = binary.BigEndian.AppendUint64(b, id)
	b = binary.BigEndian.AppendUint64(b, node)
	b = binary.BigEndian.AppendUint64(b, token)
	b = binary.BigEndian.AppendUint64(b, index)
	b = binary.BigEndian.AppendUint16(b, uint16(len(key)))
	return append(b, key...)
}

// readClaim decodes the first claim of b; ok is false when b holds no
// whole one.
func readClaim(b []byte) (shard uint64, c parkedClaim, rest []byte, ok bool) {
	if len(b) < claimFixedLen {
		return 0, c, nil, false
	}
	klen := int(binary.BigEndian.Uint16(b[40:]))
	if len(b) < claimFixedLen+klen {
		return 0, c, nil, false
	}
	c = parkedClaim{key: string(b[claimFixedLen : claimFixedLen+klen]),
		id: binary.BigEndian.Uint64(b[8:]), node: binary.BigEndian.Uint64(b[16:]), token: binary.BigEndian.Uint64(b[24:]),
		index: binary.BigEndian.Uint64(b[32:])}
	return binary.BigEndian.Uint64(b), c, b[claimFixedLen+klen:], true
}

func appendVerdict(b []byte, shard, id, token uint64, v claimVerdict) []byte {
	if len(b) == 0 {
		b = append(b, peerVerdicts)
	}
	b = binary.BigEndian.AppendUint64(b, shard)
	b = binary.BigEndian.AppendUint64(b, id)
	b = binary.BigEndian.AppendUint64(b, token)
	return append(b, byte(v))
}

// onPeerFrame dispatches a frame of kind 'L' from a peer: claims to
// judge and witness requests and queries (witness.go), answered through
// sink, or the answers to this node's.
func (n *Node) onPeerFrame(body []byte, sink verdictSink) {
	if len(body) == 0 {
		return
	}
	switch kind, b := body[0], body[1:]; {
	case kind == peerVerdicts:
		n.onVerdicts(b)
	case kind == peerWitnessVerdict:
		n.onWitnessVerdicts(b)
	case kind == peerAnswers:
		n.onWitnessAnswers(b)
	case kind == peerFormat:
		n.onStatement(b, sink)
	case sink == nil: // a request on this node's own link: it answers nobody
	case kind == peerClaims:
		n.onClaims(b, sink)
	case kind == peerWitness:
		n.onWitnessRequests(b, sink)
	case kind == peerQueries:
		n.onWitnessQueries(b, sink)
	case kind == peerSendAgain:
		n.onSendAgain(b)
	}
}
