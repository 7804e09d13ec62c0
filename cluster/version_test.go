package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
	"github.com/prometheus/client_golang/prometheus"
)

const testBuild = "lockd v9.9.9-test"

// A replica that meets what its build cannot read — a command kind in the
// middle of a batch, a batch version, a log format above its newest —
// halts at that entry: nothing of it or after it applies (not even the
// commands before the unknown one in its batch), it refuses to snapshot,
// and it says which build met what.
func TestReplicaHaltsOnWhatItCannotRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  []byte
		says string
	}{
		{"unknown command kind mid-batch", logBatch(2e9, acquireCmd(1, 2, 0, 1<<20, "b"),
			func(b []byte) []byte { return appendText(append(b, 'Z'), "", nil) },
			acquireCmd(1, 3, 0, 1<<20, "c")), `command kind 'Z'`},
		{"unknown batch version", func() []byte {
			b := logBatch(2e9, acquireCmd(1, 2, 0, 1<<20, "b"))
			b[0] = batchVersion + 1
			return b
		}(), "batch version 2"},
		{"log format above this build's", logBatch(2e9, acquireCmd(1, 2, 0, 1<<20, "b"),
			func(b []byte) []byte { return appendFormat(b, logFormatNewest+1) }), "log format 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := detachedFSM()
			f.g.n.cfg.Build = testBuild
			f.g.shardID = 7
			if _, err := f.Update(sm.Entry{Index: 1, Cmd: logBatch(1e9, acquireCmd(1, 1, 0, 1<<20, "a"))}); err != nil {
				t.Fatal(err)
			}
			before := stateOf(f)
			if _, err := f.Update(sm.Entry{Index: 2, Cmd: tc.bad}); err != nil {
				t.Fatalf("Update returned %v: dragonboat would stop the process", err)
			}
			if _, err := f.Update(sm.Entry{Index: 3, Cmd: logBatch(3e9, acquireCmd(1, 4, 0, 1<<20, "d"))}); err != nil {
				t.Fatal(err)
			}
			why := f.halted.Load()
			if why == nil {
				t.Fatal("the replica did not halt")
			}
			for _, want := range []string{"group 7", "log entry 2", tc.says, testBuild} {
				if !strings.Contains(*why, want) {
					t.Errorf("halt reason %q does not say %q", *why, want)
				}
			}
			if got := stateOf(f); !reflect.DeepEqual(got, before) {
				t.Errorf("state moved past the entry it cannot read:\n got %+v\nwant %+v", got, before)
			}
			if f.applied != 1 {
				t.Errorf("applied index %d, want 1 (the last entry it read)", f.applied)
			}
			if f.tokenOf(lockKey([]byte("t"), []byte("a"))) != 1 {
				t.Error("the lock granted before the halt is gone")
			}
			if err := f.SaveSnapshot(&bytes.Buffer{}, nil, nil); !errors.Is(err, sm.ErrSnapshotAborted) {
				t.Errorf("SaveSnapshot of a halted replica: %v, want ErrSnapshotAborted", err)
			}
			if !f.g.halted() {
				t.Error("the group does not report its replica halted")
			}
		})
	}
}

// A group writes snapshot version 5 until its format is 2, then version
// 6 with the format in it; a snapshot of a version or format this build
// does not read halts the replica instead of failing (which stops the
// process) or being skipped, and a readable one resumes it.
func TestSnapshotVersionFollowsFormat(t *testing.T) {
	f := detachedFSM()
	f.g.n.cfg.Build = testBuild
	f.Update(sm.Entry{Index: 1, Cmd: logBatch(1e9, acquireCmd(1, 1, 0, 1<<20, "a"))})
	var v5 bytes.Buffer
	if err := f.SaveSnapshot(&v5, nil, nil); err != nil || v5.Bytes()[0] != 5 {
		t.Fatalf("format 1: snapshot version %d (%v), want 5", v5.Bytes()[0], err)
	}
	f.Update(sm.Entry{Index: 2, Cmd: logBatch(1e9, func(b []byte) []byte { return appendFormat(b, logFormat2) })})
	if f.format() != logFormat2 {
		t.Fatalf("format %d after cmdFormat 2", f.format())
	}
	var v6 bytes.Buffer
	if err := f.SaveSnapshot(&v6, nil, nil); err != nil || v6.Bytes()[0] != 6 {
		t.Fatalf("format 2: snapshot version %d (%v), want 6", v6.Bytes()[0], err)
	}
	g := detachedFSM()
	if err := g.RecoverFromSnapshot(bytes.NewReader(v6.Bytes()), nil, nil); err != nil || g.format() != logFormat2 || g.tokenOf(lockKey([]byte("t"), []byte("a"))) != 1 {
		t.Fatalf("restore of version 6: %v, format %d", err, g.format())
	}

	newer := bytes.Clone(v6.Bytes())
	newer[0] = snapshotVersion + 1
	formatAbove := bytes.Clone(v6.Bytes())
	binary.BigEndian.PutUint32(formatAbove[1+8+8+8+1+8+16:], logFormatNewest+1)
	for _, tc := range []struct {
		name string
		snap []byte
		says string
	}{{"newer version", newer, "snapshot version 7"}, {"newer format", formatAbove, "log format 3"}} {
		h := detachedFSM()
		h.g.n.cfg.Build = testBuild
		if err := h.RecoverFromSnapshot(bytes.NewReader(tc.snap), nil, nil); err != nil {
			t.Fatalf("%s: RecoverFromSnapshot returned %v: dragonboat would stop the process", tc.name, err)
		}
		why := h.halted.Load()
		if why == nil || !strings.Contains(*why, tc.says) || !strings.Contains(*why, "a snapshot") || !strings.Contains(*why, testBuild) {
			t.Fatalf("%s: halt reason %v, want it to name the snapshot, %q and the build", tc.name, why, tc.says)
		}
		if h.tokenOf(lockKey([]byte("t"), []byte("a"))) != 0 {
			t.Errorf("%s: the unreadable snapshot's locks were taken in", tc.name)
		}
		if err := h.RecoverFromSnapshot(bytes.NewReader(v6.Bytes()), nil, nil); err != nil || h.halted.Load() != nil {
			t.Errorf("%s: a readable snapshot after it: %v, halted %v", tc.name, err, h.halted.Load())
		}
	}
}

// A node whose replica halted answers the group's requests E unavailable
// at once, reports it in lockd_replica_halted and its membership answer,
// and the group's log format metric reads as its replica applied it.
func TestHaltedReplicaServesNothing(t *testing.T) {
	tc := newTestCluster(t, 1, func(c *Config) { c.Groups = 1; c.Build = testBuild })
	n := tc.node(1)
	rec := newRecorder()
	if r := acquire(t, n, rec, 1, "k", 30*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("acquire before the halt: %v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g := n.groups[0]
	bad := logBatch(time.Now().UnixNano(), func(b []byte) []byte { return appendText(append(b, 'Z'), "", nil) })
	if _, err := n.nh.SyncPropose(ctx, n.nh.GetNoOPSession(g.shardID), bad); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "the replica to halt", g.halted)
	if r := acquire(t, n, rec, 2, "other", 30*time.Second, 0); r.Outcome != engine.Unavailable {
		t.Errorf("acquire on a halted group: %v, want Unavailable", r)
	}
	if r := release(t, n, rec, 3, "k", 1); r.Outcome != engine.Unavailable {
		t.Errorf("release on a halted group: %v, want Unavailable", r)
	}
	m, err := n.Members(ctx)
	if err != nil || len(m.Halted) != 1 || !strings.Contains(m.Halted[0], "command kind 'Z'") || !strings.Contains(m.Halted[0], testBuild) {
		t.Errorf("membership's halted: %q (%v)", m.Halted, err)
	}
	if got := gaugeOf(t, n, "lockd_replica_halted"); got != 1 {
		t.Errorf("lockd_replica_halted = %v, want 1", got)
	}
}

// gaugeOf is the value of the node's gauge name for group 1.
func gaugeOf(t *testing.T, n *Node, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(n)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == "1" {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{group=\"1\"}", name)
	return 0
}

// A group's format rises only once every member stated it reads the
// newer one: not while a member is down (it states nothing, as a build of
// format 1 does), and as soon as it is back. After the raise the replicas
// snapshot in version 6.
func TestFormatRisesWhenEveryMemberReadsIt(t *testing.T) {
	tc := newTestCluster(t, 3, func(c *Config) { c.Groups = 2 })
	tc.stop(3)
	n1, n2 := tc.node(1), tc.node(2)
	// Two passes of each live node's loop after both stated to each
	// other: a pass that could raise a format has run on the leaders.
	waitUntil(t, 10*time.Second, "nodes 1 and 2 to hear each other's statements", func() bool {
		return n1.formats.of(2, n1.clock()) == logFormatNewest && n2.formats.of(1, n2.clock()) == logFormatNewest
	})
	p1, p2 := n1.formats.passes.Load(), n2.formats.passes.Load()
	waitUntil(t, 10*time.Second, "two more format passes", func() bool {
		return n1.formats.passes.Load() >= p1+2 && n2.formats.passes.Load() >= p2+2
	})
	for i := range 2 {
		if f1, f2 := n1.LogFormat(i), n2.LogFormat(i); f1 != logFormat1 || f2 != logFormat1 {
			t.Fatalf("group %d rose to format %d/%d with member 3 down", i+1, f1, f2)
		}
	}
	n3 := tc.restart(3)
	for _, n := range []*Node{n1, n2, n3} {
		for i := range 2 {
			waitUntil(t, 15*time.Second, "the format to rise on every replica", func() bool { return n.LogFormat(i) == logFormat2 })
		}
	}
	var snap bytes.Buffer
	f := n3.groups[0].fsm.Load()
	if err := f.SaveSnapshot(&snap, nil, nil); err != nil || snap.Bytes()[0] != snapshotVersion {
		t.Errorf("snapshot after the raise: version %d (%v), want %d", snap.Bytes()[0], err, snapshotVersion)
	}
}

// A node that states no format (a build of format 1 does not answer the
// statement) is not added to a group whose format is 2, with an error
// that says why; a node of this build is.
func TestAddMemberRefusesAnOlderFormat(t *testing.T) {
	tc := newTestCluster(t, 1, func(c *Config) { c.Groups = 2 })
	n := tc.node(1)
	for i := range 2 {
		waitUntil(t, 10*time.Second, "a one-node group's format to rise", func() bool { return n.LogFormat(i) == logFormat2 })
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // reads nothing, answers nothing: a format-1 peer's silence
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = n.AddMember(ctx, 2, silent.Addr().String())
	if !errors.Is(err, ErrMemberFormat) || !strings.Contains(err.Error(), "log format 2") || !strings.Contains(err.Error(), "format 1 only") {
		t.Fatalf("AddMember of a silent node: %v, want ErrMemberFormat naming the formats", err)
	}
	m, err := n.Members(ctx)
	if err != nil || len(m.Members) != 1 {
		t.Fatalf("members after the refusal: %+v (%v)", m.Members, err)
	}

	ls := raftListeners(t, 1)
	cfg := tc.cfgs[0]
	cfg.NodeID, cfg.Join, cfg.RaftListener, cfg.DataDir = 2, true, ls[0], t.TempDir()
	cfg.RaftAddr = ls[0].Addr().String()
	cfg.Peers = map[uint64]string{2: cfg.RaftAddr}
	joiner, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer joiner.Close()
	if err := n.AddMember(ctx, 2, cfg.RaftAddr); err != nil {
		t.Fatalf("AddMember of a node of this build: %v", err)
	}
}

// The readability check walks every batch once more before it applies:
// BenchmarkBatchReadable is that walk alone, BenchmarkBatchUpdate the
// whole Update with it, on the same 64-command batch of acquires and
// releases (their ratio is the check's share of an apply).
func BenchmarkBatchReadable(b *testing.B) {
	batch := benchBatch()
	for b.Loop() {
		if unreadable(batch) != nil {
			b.Fatal("unreadable")
		}
	}
}

func BenchmarkBatchUpdate(b *testing.B) {
	batch := benchBatch()
	f := detachedFSM()
	i := uint64(0)
	for b.Loop() {
		i++
		if _, err := f.Update(sm.Entry{Index: i, Cmd: batch}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchBatch is 32 acquires and their 32 releases (of tokens a fresh
// group issues, so each Update grants and frees 32 keys).
func benchBatch() []byte {
	var cmds []func([]byte) []byte
	for k := range 32 {
		cmds = append(cmds, acquireCmd(1, uint64(k+1), 0, 1<<20, strconv.Itoa(k)))
	}
	for k := range 32 {
		cmds = append(cmds, releaseCmd(uint64(k+1), strconv.Itoa(k)))
	}
	return logBatch(1e9, cmds...)
}
