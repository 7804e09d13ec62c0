package cluster

// This file owns witnesses: from log format 2 on, an epoch's leader hands
// a grant to its own request only once another voting member of the
// group has witnessed it, and the next epoch's leader takes back
// (cmdRevokeUnwitnessed) the grants of a dead epoch leader that no member
// witnessed. A leader's kill -9 then frees the keys its last batches
// granted — committed, but never written to a client — within a failure-
// detection interval instead of a lease.
//
// Why it is safe (docs/cluster.md, Undelivered grants, has the argument
// in full): a member witnesses a grant of epoch e only while it has not
// closed e, and it closes e when it answers a later leader's query about
// e, under the one lock (the fsm's) that orders both. The later leader
// revokes only the grants that no member witnessed, by the answers of
// every voting member but the dead leader, and only when no membership
// change applied since epoch e began (a member that left could have
// witnessed). So a grant the dead leader may have delivered has a witness
// whose answer names it, and is never revoked; and a grant revoked was
// refused by every member still able to witness it, so it is never
// delivered after.

import (
	"encoding/binary"
	"maps"
	"slices"
	"time"

	"github.com/lni/dragonboat/v4"
)

// witnessBook is what this replica witnessed of its group's epoch
// leaders' own grants: for the two newest epochs it witnessed in, the
// newest token up to which it let the epoch's leader deliver. Tokens grow
// with the log (one counter per group), so one number per epoch records
// every grant witnessed. Node-local, under the fsm's lock.
type witnessBook struct {
	// closed: epochs up to this take no more witnesses (a later leader
	// asked about them, or they are older than the two kept).
	closed uint64
	// knownFrom is the first epoch this process saw begin: what an
	// earlier run of the node witnessed of an epoch before it was lost
	// with that run, so a query about it cannot be answered.
	knownFrom uint64
	// lost is the newest epoch whose record was dropped to keep two: a
	// query about it or an older one cannot be answered.
	lost uint64
	kept [2]witnessedEpoch
}

type witnessedEpoch struct {
	epoch uint64
	upto  uint64 // the newest token witnessed: every grant up to it may be delivered
}

// witness lets epoch's leader deliver its own grants up to token, unless
// the epoch is closed; not before this replica applied the epoch's
// beginning, so that a restarted node finds the epoch in the log it
// restarts with (see knownFrom). The grants need not be applied here yet.
func (b *witnessBook) witness(s *replicated, epoch, token uint64) claimVerdict {
	switch {
	case epoch <= b.closed:
		return claimRefused
	case s.epoch < epoch:
		return claimNotYet
	}
	e := b.slot(epoch)
	if e == nil {
		return claimRefused
	}
	e.upto = max(e.upto, token)
	return claimAccepted
}

// slot is epoch's record, made in place of the older kept one (which
// closes it); nil when epoch is older than both.
func (b *witnessBook) slot(epoch uint64) *witnessedEpoch {
	older := 0
	for i := range b.kept {
		if b.kept[i].epoch == epoch {
			return &b.kept[i]
		}
		if b.kept[i].epoch < b.kept[older].epoch {
			older = i
		}
	}
	if epoch < b.kept[older].epoch {
		b.closed = max(b.closed, epoch)
		return nil
	}
	dropped := b.kept[older]
	b.closed = max(b.closed, dropped.epoch)
	if dropped.upto > 0 {
		b.lost = max(b.lost, dropped.epoch)
	}
	b.kept[older] = witnessedEpoch{epoch: epoch}
	return &b.kept[older]
}

// answer closes epoch and returns the newest token witnessed in it (0 for
// none); known is false when its record was dropped.
func (b *witnessBook) answer(epoch uint64) (upto uint64, known bool) {
	b.closed = max(b.closed, epoch)
	for _, e := range b.kept {
		if e.epoch == epoch {
			return e.upto, epoch >= b.knownFrom
		}
	}
	return 0, epoch > b.lost && epoch >= b.knownFrom
}

// witnessLiveAfter tells the replica the last entry index of the log its
// process started with.
func (f *fsm) witnessLiveAfter(last uint64) {
	f.mu.Lock()
	f.liveAfter = last
	f.mu.Unlock()
}

// suspects are, on a new epoch's leader, the grants the previous epoch's
// leader made to its own requests and still held when this epoch began:
// each is taken back unless a member witnessed it. Node-local, in the
// claim book.
type suspects struct {
	epoch, leader uint64
	// since is the entry index at which epoch began on this replica.
	since    uint64
	grants   map[uint64]string // token → lock key
	answered map[uint64]bool   // members whose answer came, this node included
	askedAt  time.Duration     // when the others were last asked
}

// witnessRule says which of an epoch's grants to its leader's own
// requests wait for a witness: none while off; once on, those made after
// the group's instant after — the epoch's beginning, or the raise of the
// group's format to 2 during it (the grants before were delivered
// without one). Replicated, so that the epoch's leader and the next
// judge every grant alike.
type witnessRule struct {
	on    bool
	after time.Duration
}

func (w witnessRule) covers(l *lockState) bool { return w.on && l.granted > w.after }

// epochBegan runs in Update when the batch at index moved the group to a
// new epoch; prev is the epoch before it, its leader and its witnessing.
// On the new epoch's leader it gathers the previous leader's own grants
// that waited for a witness as suspects. Called with the fsm's lock held.
func (f *fsm) epochBegan(prevEpoch, prevLeader uint64, prev witnessRule, index uint64) {
	since := f.epochIndex
	f.epochIndex = index
	if index > f.liveAfter {
		f.witnessed.knownFrom = min(f.witnessed.knownFrom, f.state.epoch)
	}
	s := &f.state
	self := f.g.n.cfg.NodeID
	if s.epochLeader != self || !prev.on || prevLeader == 0 || prevLeader == self || since == 0 {
		return
	}
	f.book.sync(s)
	sus := suspects{epoch: prevEpoch, leader: prevLeader, since: since, grants: make(map[uint64]string), answered: make(map[uint64]bool)}
	for k, l := range s.locks {
		if l.epoch == prevEpoch && l.node == prevLeader && prev.covers(l) && !l.Lapsed(s.now) {
			sus.grants[l.Token] = k
		}
	}
	if len(sus.grants) > 0 {
		f.book.suspects = sus
	}
}

// memberView is one reading of a group's voting members on this replica.
type memberView struct {
	epoch     uint64 // the group's epoch on this replica before the reading
	voters    []uint64
	others    []uint64 // voters but this node: those it asks to witness
	changedAt uint64   // the entry index of the last membership change applied
}

func newMemberView(epoch uint64, voters []uint64, changedAt, self uint64) *memberView {
	others := slices.DeleteFunc(slices.Clone(voters), func(id uint64) bool { return id == self })
	return &memberView{epoch: epoch, voters: voters, others: others, changedAt: changedAt}
}

// refreshMembers reads every group's voting members as this replica has
// applied them, each after reading its epoch: the view of an epoch's
// leader then holds every membership change applied before its epoch
// began. The expiry driver runs it on every pass, holding no lock of
// this node's (dragonboat's NodeHost lock is taken).
func (n *Node) refreshMembers() {
	epochs := make(map[uint64]uint64, len(n.groups))
	for _, g := range n.groups {
		if f := g.fsm.Load(); f != nil {
			f.mu.Lock()
			epochs[g.shardID] = f.state.epoch
			f.mu.Unlock()
		}
	}
	info := n.nh.GetNodeHostInfo(dragonboat.NodeHostInfoOption{SkipLogInfo: true})
	if info == nil {
		return
	}
	for _, si := range info.ShardInfoList {
		if g := n.groupByShard(si.ShardID); g != nil && !si.Pending {
			g.members.Store(newMemberView(epochs[si.ShardID], slices.Sorted(maps.Keys(si.Replicas)), si.ConfigChangeIndex, n.cfg.NodeID))
		}
	}
}

// memberView is g's voting members as last read, if read since this
// replica's epoch began.
func (g *group) memberView(epoch uint64) *memberView {
	if v := g.members.Load(); v != nil && v.epoch >= epoch {
		return v
	}
	return nil
}

// witnesses are the members g's epoch leader asks to witness its own
// grants: the voters but itself (shared, read-only); ok is false until
// the members were read in this epoch.
func (g *group) witnesses(epoch uint64) (ids []uint64, ok bool) {
	v := g.memberView(epoch)
	if v == nil {
		return nil, false
	}
	return v.others, true
}

// revokeUnwitnessed, run by g's leader while peer stays silent, asks the
// members about peer's epoch's suspects, and once every voting member but
// peer has answered, queues the revokes of those no member witnessed. It
// reports whether it queued any.
func (g *group) revokeUnwitnessed(peer uint64, now time.Duration) bool {
	n := g.n
	self := n.cfg.NodeID
	f := g.fsm.Load()
	f.mu.Lock()
	sus := &f.book.suspects
	view := g.memberView(f.state.epoch)
	if sus.leader != peer || len(sus.grants) == 0 || f.state.epochLeader != self || view == nil {
		f.mu.Unlock()
		return false
	}
	if view.changedAt > sus.since {
		n.log.Info().Uint64("group", g.shardID).Uint64("peer", peer).Int("grants", len(sus.grants)).
			Msg("the membership changed since the dead leader's epoch began: its own grants are left to their leases")
		*sus = suspects{}
		f.mu.Unlock()
		return false
	}
	if !sus.answered[self] {
		upto, known := f.witnessed.answer(sus.epoch)
		f.noteAnswer(self, sus.epoch, upto, known)
	}
	var missing []uint64
	for _, id := range view.voters {
		if id != peer && !sus.answered[id] {
			missing = append(missing, id)
		}
	}
	var taken []expiry
	epoch := sus.epoch
	switch {
	case len(sus.grants) == 0:
	case len(missing) == 0:
		taken = f.takeSuspects()
	case now-sus.askedAt >= n.claimRetry():
		sus.askedAt = now
	default:
		missing = nil
	}
	f.mu.Unlock()
	if len(taken) == 0 {
		for _, id := range missing {
			n.links.send(id, appendWitnessQuery(nil, g.shardID, epoch))
		}
		return false
	}
	n.log.Info().Uint64("group", g.shardID).Uint64("peer", peer).Int("grants", len(taken)).
		Msg("taking back grants a dead leader made to itself that no member witnessed")
	n.stats.revokes.Add(uint64(len(taken)))
	for _, e := range taken {
		tenant, key := splitLockKey(e.key)
		g.queue(func(b []byte) []byte {
			return appendRevoke(b, cmdRevokeUnwitnessed, peer, e.token, epoch, tenant, key)
		})
	}
	return true
}

// noteAnswer takes member's answer about epoch's witnesses into the
// suspects: a grant witnessed (its token up to upto) is kept; a member
// that cannot tell keeps them all (left to their leases). Called with the
// fsm's lock held.
func (f *fsm) noteAnswer(member, epoch, upto uint64, known bool) {
	sus := &f.book.suspects
	if sus.epoch != epoch || len(sus.grants) == 0 {
		return
	}
	if !known {
		f.g.n.log.Info().Uint64("group", f.g.shardID).Uint64("member", member).
			Msg("a member cannot tell which grants of the dead leader it witnessed: they are left to their leases")
		*sus = suspects{}
		return
	}
	maps.DeleteFunc(sus.grants, func(token uint64, _ string) bool { return token <= upto })
	sus.answered[member] = true
}

// takeSuspects moves the suspects still current to the revoked, and
// returns them: claims on them are refused from now on. Called with the
// fsm's lock held.
func (f *fsm) takeSuspects() []expiry {
	s := &f.state
	sus := &f.book.suspects
	var out []expiry
	for token, k := range sus.grants {
		if l := s.locks[k]; l != nil && l.Token == token && l.node == sus.leader && l.epoch == sus.epoch {
			if f.book.revoking == nil {
				f.book.revoking = make(map[string]uint64)
			}
			f.book.revoking[k] = token
			out = append(out, expiry{key: k, token: token})
		}
	}
	*sus = suspects{}
	return out
}

// Witness messages, inside a transport frame of kind 'L' (with claims
// and verdicts, claims.go):
//
//	witness requests: 'w' | count × (shard u64 | epoch u64 | upto u64): let the epoch's leader deliver its own grants up to token upto
//	their verdicts:   'x' | count × (shard u64 | epoch u64 | upto u64 | verdict u8): accepted = witnessed
//	queries:          'q' | count × (shard u64 | epoch u64): close epoch, say what you witnessed in it
//	answers:          'r' | count × (shard u64 | epoch u64 | from u64 | known u8 | upto u64)
const (
	witnessLen         = 8 + 8 + 8
	queryLen           = 8 + 8
	answerLen          = 8 + 8 + 8 + 1 + 8
	peerWitness        = 'w'
	peerWitnessVerdict = 'x'
	peerQueries        = 'q'
	peerAnswers        = 'r'
)

// appendWitness appends a witness request, or with v its verdict.
func appendWitness(b []byte, shard, epoch, upto uint64, v claimVerdict) []byte {
	if len(b) == 0 {
		b = append(b, peerWitness)
		if v != 0 {
			b[0] = peerWitnessVerdict
		}
	}
	b = binary.BigEndian.AppendUint64(b, shard)
	b = binary.BigEndian.AppendUint64(b, epoch)
	b = binary.BigEndian.AppendUint64(b, upto)
	if v != 0 {
		b = append(b, byte(v))
	}
	return b
}

// onWitnessRequests witnesses what epoch leaders ask, and answers each
// request through sink: at once, or once this replica has applied the
// epoch's beginning (judgeParked).
func (n *Node) onWitnessRequests(b []byte, sink verdictSink) {
	if sink.peerGone() {
		return
	}
	var out []byte
	for ; len(b) >= witnessLen; b = b[witnessLen:] {
		shard := binary.BigEndian.Uint64(b)
		c := parkedClaim{epoch: binary.BigEndian.Uint64(b[8:]), token: binary.BigEndian.Uint64(b[16:]), sink: sink}
		v := claimRefused // nothing to witness here
		if g := n.groupByShard(shard); g != nil && c.epoch != 0 {
			v = g.judge(c)
		}
		if v != claimNotYet {
			out = appendWitness(out, shard, c.epoch, c.token, v)
		}
	}
	if len(out) > 0 {
		sink.sendVerdicts(out)
	}
}

// onWitnessVerdicts settles this node's own grants that a member
// witnessed, or refused to: every grant of the epoch up to the token
// named.
func (n *Node) onWitnessVerdicts(b []byte) {
	var settled []settledClaim
	n.regMu.Lock()
	for ; len(b) >= witnessLen+1; b = b[witnessLen+1:] {
		shard, epoch, upto := binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])
		v := claimVerdict(b[witnessLen])
		if epoch == 0 || v != claimAccepted && v != claimRefused {
			continue
		}
		for _, p := range n.claiming {
			if c := p.claim; c.witnessEpoch == epoch && c.r.Token <= upto && c.g.shardID == shard {
				settled = append(settled, n.settleLocked(p, v))
			}
		}
	}
	n.regMu.Unlock()
	n.finishSettled(settled)
}

func appendWitnessQuery(b []byte, shard, epoch uint64) []byte {
	if len(b) == 0 {
		b = append(b, peerQueries)
	}
	b = binary.BigEndian.AppendUint64(b, shard)
	return binary.BigEndian.AppendUint64(b, epoch)
}

func appendWitnessAnswer(b []byte, shard, epoch, from, upto uint64, known bool) []byte {
	if len(b) == 0 {
		b = append(b, peerAnswers)
	}
	b = binary.BigEndian.AppendUint64(b, shard)
	b = binary.BigEndian.AppendUint64(b, epoch)
	b = binary.BigEndian.AppendUint64(b, from)
	if known {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return binary.BigEndian.AppendUint64(b, upto)
}

// onWitnessQueries closes the epochs a later leader asks about and
// answers what this replica witnessed in them.
func (n *Node) onWitnessQueries(b []byte, sink verdictSink) {
	var out []byte
	for ; len(b) >= queryLen; b = b[queryLen:] {
		shard, epoch := binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
		g := n.groupByShard(shard)
		if g == nil {
			continue
		}
		f := g.fsm.Load()
		if f == nil {
			continue
		}
		f.mu.Lock()
		upto, known := f.witnessed.answer(epoch)
		f.mu.Unlock()
		out = appendWitnessAnswer(out, shard, epoch, n.cfg.NodeID, upto, known)
	}
	if len(out) > 0 {
		sink.sendVerdicts(out)
	}
}

// onWitnessAnswers takes members' answers into the suspects, and wakes
// the expiry driver to revoke once the last one came.
func (n *Node) onWitnessAnswers(b []byte) {
	for ; len(b) >= answerLen; b = b[answerLen:] {
		shard, epoch, from := binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])
		known, upto := b[24] == 1, binary.BigEndian.Uint64(b[25:])
		if g := n.groupByShard(shard); g != nil {
			if f := g.fsm.Load(); f != nil {
				f.mu.Lock()
				f.noteAnswer(from, epoch, upto, known)
				f.mu.Unlock()
			}
		}
	}
	n.expiryDue()
}
