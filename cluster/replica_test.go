package cluster

import (
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/rs/zerolog"
)

// replica is one node's replica of a group, applied by hand: the rules
// are judged on it as that node would, at the log index and on the
// replicated clock the script gives.
type replica struct {
	t     *testing.T
	f     *fsm
	index uint64
	clock time.Duration // the node's monotonic clock (Config.Clock)
}

func newReplica(t *testing.T, self uint64) *replica {
	r := &replica{t: t}
	n := &Node{cfg: Config{NodeID: self, RTT: 100 * time.Millisecond, ElectionRTT: 4, HeartbeatRTT: 1,
		ForgetAfter: 800 * time.Millisecond, ProposeTimeout: 2 * time.Second, AttemptTimeout: 800 * time.Millisecond,
		FixedLeaders: true, Clock: func() time.Duration { return r.clock }},
		log: zerolog.Nop()}
	n.liveness.init(self, map[uint64]string{1: "a", 2: "b", 3: "c"})
	n.idBase.Store(1000)
	n.idFirst = 1001
	g := &group{n: n, maxKeys: 1 << 20, proposer: proposer{kick: make(chan struct{}, 1)}}
	g.house.forgotten = map[uint64]bool{}
	g.buf = make([]byte, datedHeaderLen)
	g.newLeader.Store(new(make(chan struct{})))
	g.house.pastRunsForgotten.Store(true)
	r.f = newFSM(g, 1)
	g.fsm.Store(r.f)
	return r
}

func (r *replica) n() *Node { return r.f.g.n }

// apply applies one entry of commands at the replicated instant now (s).
func (r *replica) apply(now int64, cmds ...func([]byte) []byte) {
	b := make([]byte, headerLen)
	for _, c := range cmds {
		b = c(b)
	}
	putHeader(b, now*1e9, uint32(len(cmds)))
	r.applyEntry(b)
}

// applyEntry applies one entry as it is.
func (r *replica) applyEntry(b []byte) {
	r.index++
	if _, err := r.f.Update(sm.Entry{Index: r.index, Cmd: b}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *replica) lock(key string) *lockState {
	return r.f.state.locks[lockKey([]byte("t"), []byte(key))]
}

func acquireBy(node, id uint64, key string, wait time.Duration) func([]byte) []byte {
	return func(b []byte) []byte { return appendAcquire(b, node, id, 30, int64(wait), 1<<20, 0, "t", []byte(key)) }
}

func releaseOf(token uint64, key string) func([]byte) []byte {
	return func(b []byte) []byte { return appendRelease(b, 9, 0, token, "t", []byte(key)) }
}
