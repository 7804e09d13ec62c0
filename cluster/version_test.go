package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/loopback"
	"github.com/prometheus/client_golang/prometheus"
)

const testBuild = "lockd v9.9.9-test"

// A replica that meets what its build cannot read — a command kind in the
// middle of a batch, a batch version, a log format above its newest, the
// batches and the revokes of the unreleased formats before logFormatBase
// — halts at that entry: nothing of it or after it applies (not even the
// commands before the unknown one in its batch), it refuses to snapshot,
// and it says which build met what.
func TestReplicaHaltsOnWhatItCannotRead(t *testing.T) {
	withVersion := func(v byte) []byte {
		b := logBatch(2e9, acquireCmd(1, 2, 0, 1<<20, "b"))
		b[0] = v
		return b
	}
	// oldKind is a command of the formats before logFormatBase: its kind
	// and 24 bytes of fields (cmdRevoke and cmdRevokeUnwitnessed took back
	// a grant by node, token and epoch).
	oldKind := func(kind byte) func([]byte) []byte {
		return func(b []byte) []byte {
			return appendText(append(append(b, kind), make([]byte, 24)...), "t", []byte("a"))
		}
	}
	for _, tc := range []struct {
		name string
		bad  []byte
		says string
	}{
		{"unknown command kind mid-batch", logBatch(2e9, acquireCmd(1, 2, 0, 1<<20, "b"),
			func(b []byte) []byte { return appendText(append(b, 'Z'), "", nil) },
			acquireCmd(1, 3, 0, 1<<20, "c")), `command kind 'Z'`},
		{"unknown batch version", withVersion(batchVersion + 1), fmt.Sprintf("batch version %d", batchVersion+1)},
		{"a batch of the formats before the base", withVersion(1), "batch version 1"},
		{"log format above this build's", logBatch(2e9, acquireCmd(1, 2, 0, 1<<20, "b"),
			func(b []byte) []byte { return appendFormat(b, logFormatNewest+1) }), fmt.Sprintf("log format %d", logFormatNewest+1)},
		{"a revoke of the formats before the base", logBatch(2e9, oldKind('V')), `command kind 'V'`},
		{"an unwitnessed revoke of the formats before the base", logBatch(2e9, oldKind('W')), `command kind 'W'`},
		{"an epoch of the formats before the base", logBatch(2e9, oldKind('P')), `command kind 'P'`},
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

// A group writes snapshot version 7, which restores exactly; a snapshot
// of a version or format this build does not read — a newer one, or one
// of the unreleased formats before logFormatBase — halts the replica
// instead of failing (which stops the process) or being skipped, and a
// readable one resumes it.
func TestSnapshotVersions(t *testing.T) {
	f := detachedFSM()
	f.g.n.cfg.Build = testBuild
	f.Update(sm.Entry{Index: 1, Cmd: logBatch(1e9, acquireCmd(1, 1, 0, 1<<20, "a"))})
	var v7 bytes.Buffer
	if err := f.SaveSnapshot(&v7, nil, nil); err != nil || v7.Bytes()[0] != 7 {
		t.Fatalf("snapshot version %d (%v), want 7", v7.Bytes()[0], err)
	}
	g := detachedFSM()
	if err := g.RecoverFromSnapshot(bytes.NewReader(v7.Bytes()), nil, nil); err != nil || g.format() != logFormatBase ||
		!reflect.DeepEqual(stateOf(g), stateOf(f)) {
		t.Fatalf("restore of version 7: %v, format %d, state %+v, want %+v", err, g.format(), stateOf(g), stateOf(f))
	}
	// Format 4: version 8, with the requesters and the tombstones.
	raised := detachedFSM()
	raised.Update(sm.Entry{Index: 1, Cmd: logBatch(1e9, func(b []byte) []byte { return appendFormat(b, logFormat4) },
		func(b []byte) []byte { return appendAcquire(b, 1, 1, 30, 0, 1<<20, 7, "t", []byte("a")) },
		func(b []byte) []byte {
			return appendAcquire(b, 1, 2, 30, int64(time.Minute), 1<<20, 8, "t", []byte("a"))
		},
		func(b []byte) []byte { return appendAbandon(b, 1, 3, 9, "t", []byte("b")) })})
	var v8 bytes.Buffer
	if err := raised.SaveSnapshot(&v8, nil, nil); err != nil || v8.Bytes()[0] != 8 {
		t.Fatalf("format 4: snapshot version %d (%v), want 8", v8.Bytes()[0], err)
	}
	g8 := detachedFSM()
	if err := g8.RecoverFromSnapshot(bytes.NewReader(v8.Bytes()), nil, nil); err != nil || !reflect.DeepEqual(stateOf(g8), stateOf(raised)) ||
		g8.state.locks[lockKey([]byte("t"), []byte("a"))].requester != 7 || g8.state.tombstones.Len() != 1 {
		t.Fatalf("restore of version 8: %v, state %+v, want %+v", err, stateOf(g8), stateOf(raised))
	}

	withVersion := func(v byte) []byte {
		b := bytes.Clone(v7.Bytes())
		b[0] = v
		return b
	}
	formatAbove := bytes.Clone(v7.Bytes())
	binary.BigEndian.PutUint32(formatAbove[1+8+8+8+1+8:], logFormatNewest+1)
	for _, tc := range []struct {
		name string
		snap []byte
		says string
	}{
		{"newer version", withVersion(snapshotVersion + 1), fmt.Sprintf("snapshot version %d", snapshotVersion+1)},
		{"the version of format 2", withVersion(6), "snapshot version 6"},
		{"the version of format 1", withVersion(5), "snapshot version 5"},
		{"newer format", formatAbove, fmt.Sprintf("log format %d", logFormatNewest+1)},
	} {
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
		if err := h.RecoverFromSnapshot(bytes.NewReader(v7.Bytes()), nil, nil); err != nil || h.halted.Load() != nil {
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
// newer one: not while a member is down (it states nothing, as a node
// of an older build does), and as soon as it is back. A node serves §6a
// (ServesAbandon) only once every group rose. After the raise the
// replicas snapshot in the newest version.
func TestFormatRisesWhenEveryMemberReadsIt(t *testing.T) {
	// Passes 3 s apart: member 3 stops before the first, which could
	// raise the formats.
	tc := newTestCluster(t, 3, func(c *Config) { c.Groups = 2; c.StatementInterval = 3 * time.Second })
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
		if f1, f2 := n1.LogFormat(i), n2.LogFormat(i); f1 != logFormat3 || f2 != logFormat3 {
			t.Fatalf("group %d rose to format %d/%d with member 3 down", i+1, f1, f2)
		}
	}
	if n1.ServesAbandon() || n2.ServesAbandon() {
		t.Fatal("§6a served while the groups are at format 3")
	}
	n3 := tc.restart(3)
	for _, n := range []*Node{n1, n2, n3} {
		for i := range 2 {
			waitUntil(t, 15*time.Second, "the format to rise on every replica", func() bool { return n.LogFormat(i) == logFormatNewest })
		}
		if !n.ServesAbandon() {
			t.Errorf("node %d does not serve §6a with every group at format %d", n.ID(), logFormatNewest)
		}
	}
	var snap bytes.Buffer
	f := n3.groups[0].fsm.Load()
	if err := f.SaveSnapshot(&snap, nil, nil); err != nil || snap.Bytes()[0] != snapshotVersion {
		t.Errorf("snapshot after the raise: version %d (%v), want %d", snap.Bytes()[0], err, snapshotVersion)
	}
}

// A node that states no format is not added to a group whose format is above the base, with an error
// that says why; a node of this build is.
func TestAddMemberRefusesAnOlderFormat(t *testing.T) {
	tc := newTestCluster(t, 1, func(c *Config) { c.Groups = 2 })
	n := tc.node(1)
	for i := range 2 {
		waitUntil(t, 10*time.Second, "a one-node group's format to rise", func() bool { return n.LogFormat(i) == logFormatNewest })
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
	if !errors.Is(err, ErrMemberFormat) || !strings.Contains(err.Error(), fmt.Sprintf("log format %d", logFormatNewest)) || !strings.Contains(err.Error(), "stated none") {
		t.Fatalf("AddMember of a silent node: %v, want ErrMemberFormat naming the formats", err)
	}
	m, err := n.Members(ctx)
	if err != nil || len(m.Members) != 1 {
		t.Fatalf("members after the refusal: %+v (%v)", m.Members, err)
	}

	ls := loopback.Listeners(t, 1)
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
