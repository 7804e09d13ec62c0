// Package placement is the leader placement policy of lockd's cluster
// mode ("follow the load"): one group's decision, on the node that leads
// it, of when to hand the leadership to which node. It is deterministic,
// driven by the instants and load counts its caller passes in, and knows
// nothing of Raft, sockets or the lock rules.
//
// A request proposed on a follower costs a forward to the group's leader and, before it can be answered, a
// wait for the leader's commit notice: about twice the latency of the
// same request on the leader, and more messages per proposal. Clients
// often favour one node (one load balancer target, one region), so a
// group's leader moves to the node that proposes most of its commands.
//
// Only the current leader decides, from what its own state machine
// applied (every command names its proposing node), so two nodes never
// pull one group in different directions. It asks for a transfer when one
// other node proposed at least MinCommands commands in each of
// strikesNeeded consecutive windows and more than loadRatio times
// the leader's own; balanced or shifting load never qualifies.
//
// Idle groups gather. Every group costs heartbeats and their answers
// whether or not it is used, and one Raft batch per peer and tick carries
// the heartbeats of all the groups a node leads; with the leaders spread
// over three nodes an idle cluster sends three times the messages it
// needs (docs/cluster.md, Performance, has the idle CPU). So a
// group that holds no lock and saw no command for idleWindows
// windows in a row hands its leadership to group 0's leader, under the
// same pause and back-off as a move toward load. Holding no lock, it has
// no lease whose deadline a new leader would re-stamp and nobody waiting.
//
// A hand-over decided is asked for later, not at once (Schedule): a
// dragonboat node that has committed entries it has not applied refuses
// the hand-over's TimeoutNow (it counts them as a possible membership
// change), and under traffic a follower nearly always has some, so the
// caller first stops the group's proposals and asks once the target has
// caught up (the cluster package's hand-over hold).
//
// A transfer is asked at most once per Cooldown per group, and
// that pause doubles (up to Cooldown << MaxBackoff)
// each time the leader finds itself still leader when it would ask again:
// Raft gives a hand-over up after an election timeout when it did not
// complete (under load dragonboat does so now and then), and while one is
// pending the leader drops every proposal, so unfulfilled requests must
// stay rare.
package placement

import "time"

const (
	Window        = time.Second
	MinCommands   = 16
	loadRatio     = 2
	strikesNeeded = 2
	Cooldown      = 5 * time.Second
	MaxBackoff    = 5 // doublings: 160 s
	idleWindows   = 5
)

// Load is how many commands one node proposed to a group in a
// window.
type Load struct {
	Node     uint64
	Commands uint64
}

// Policy is one group's placement decision on one node, driven
// by the housekeeping step's clock; deterministic, no I/O.
type Policy struct {
	windowEnd time.Duration
	candidate uint64 // the node that qualified in the last strikes windows
	strikes   int
	idle      int           // windows in a row without a command
	nextTry   time.Duration // no transfer asked before this instant
	unmet     int           // transfers asked while this node stayed leader

	handOverTo uint64        // decided, not yet asked for
	handOverAt time.Duration // when to ask for it
	// askedAt is when the last hand-over was asked for, while it may
	// still be pending (0: none is).
	askedAt time.Duration
}

// Asked records that a hand-over was asked for at now.
func (p *Policy) Asked(now time.Duration) { p.askedAt = now }

// GivenUp reports, once, that the hand-over asked for has ended without a
// new leader: this node still leads after pending (the longest Raft keeps
// a hand-over pending). A node no longer leader forgets it (the hand-over
// happened). Otherwise wait is how long until it can tell (0: no
// hand-over is pending).
func (p *Policy) GivenUp(now time.Duration, leader bool, pending time.Duration) (up bool, wait time.Duration) {
	switch {
	case p.askedAt == 0:
		return false, 0
	case !leader:
		p.askedAt = 0
		return false, 0
	case now < p.askedAt+pending:
		return false, p.askedAt + pending - now
	}
	p.askedAt = 0
	return true, 0
}

// Observe is called when a window ended (due reports it): busiest is the
// window's busiest other node and own this node's commands, gather the
// node an idle group gathers on, 0 when it must stay (it holds a lock, or
// this node is group 0's leader). It returns the node to hand the
// leadership to, or 0.
func (p *Policy) Observe(now time.Duration, leader bool, busiest Load, own, gather uint64) uint64 {
	if !leader {
		p.strikes, p.idle, p.unmet = 0, 0, 0 // a hand-over done, or leadership lost
		return 0
	}
	if busiest.Commands == 0 && own == 0 && gather != 0 {
		p.strikes = 0
		if p.idle++; p.idle < idleWindows {
			return 0
		}
		return p.ask(now, gather)
	}
	p.idle = 0
	if busiest.Commands < MinCommands || busiest.Commands <= loadRatio*own {
		p.strikes = 0
		return 0
	}
	if busiest.Node != p.candidate {
		p.candidate, p.strikes = busiest.Node, 0
	}
	if p.strikes++; p.strikes < strikesNeeded {
		return 0
	}
	return p.ask(now, busiest.Node)
}

// ask returns to unless a transfer was asked too recently.
func (p *Policy) ask(now time.Duration, to uint64) uint64 {
	if now < p.nextTry {
		return 0
	}
	p.strikes, p.idle = 0, 0
	p.nextTry = now + Cooldown<<min(p.unmet, MaxBackoff)
	p.unmet++
	return to
}

// Due reports whether a window ended at now, starting the next one.
func (p *Policy) Due(now time.Duration) bool {
	if now < p.windowEnd {
		return false
	}
	p.windowEnd = now + Window
	return true
}

// Schedule records a hand-over to node to, to be asked for at at.
func (p *Policy) Schedule(to uint64, at time.Duration) {
	p.handOverTo, p.handOverAt = to, at
}

// HandOver returns the node to ask the leadership to pass to now, or 0
// and how long until a scheduled hand-over is due (0: none is). A node
// that is no longer leader drops its scheduled hand-over.
func (p *Policy) HandOver(now time.Duration, leader bool) (to uint64, wait time.Duration) {
	switch {
	case p.handOverTo == 0:
		return 0, 0
	case !leader:
		p.handOverTo = 0
		return 0, 0
	case now < p.handOverAt:
		return 0, p.handOverAt - now
	}
	to, p.handOverTo = p.handOverTo, 0
	return to, 0
}
