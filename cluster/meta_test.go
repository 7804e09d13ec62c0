package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// A data dir keeps the node id and group count it was bootstrapped with.
func TestCheckMetaRefusesAnotherIdentity(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{NodeID: 1, DataDir: dir, Groups: 3, Logger: testLogger()}
	if err := checkMeta(&cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, metaFile)); err != nil {
		t.Fatal(err)
	}
	if err := checkMeta(&cfg); err != nil {
		t.Fatalf("restart with the same flags: %v", err)
	}
	for _, c := range []Config{
		{NodeID: 1, DataDir: dir, Groups: 16},
		{NodeID: 2, DataDir: dir, Groups: 3},
	} {
		c.Logger = testLogger()
		if err := checkMeta(&c); err == nil {
			t.Fatalf("node %d with %d groups on the dir of node 1 with 3 groups: no error", c.NodeID, c.Groups)
		}
	}
}

// Without --groups a new data dir gets DefaultGroups, and a restart keeps
// the count its dir was bootstrapped with, whatever the default is now.
func TestCheckMetaTakesTheDirsGroupCount(t *testing.T) {
	fresh := Config{NodeID: 1, DataDir: t.TempDir(), Logger: testLogger()}
	if err := checkMeta(&fresh); err != nil || fresh.Groups != DefaultGroups {
		t.Fatalf("new dir without --groups: %d groups, %v; want %d", fresh.Groups, err, DefaultGroups)
	}
	dir := t.TempDir()
	boot := Config{NodeID: 2, DataDir: dir, Groups: DefaultGroups + 2, Logger: testLogger()}
	if err := checkMeta(&boot); err != nil {
		t.Fatal(err)
	}
	restart := Config{NodeID: 2, DataDir: dir, Logger: testLogger()}
	if err := checkMeta(&restart); err != nil || restart.Groups != boot.Groups {
		t.Fatalf("restart without --groups: %d groups, %v; want the dir's %d", restart.Groups, err, boot.Groups)
	}
}

// A negative group count is refused with its flag's name, not taken as
// the default.
func TestNegativeGroupCountIsRefused(t *testing.T) {
	n, err := Start(Config{NodeID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}, DataDir: t.TempDir(), Groups: -1, Logger: testLogger()})
	if err == nil {
		n.Close()
		t.Fatal("--groups -1 started a node")
	}
	if !strings.Contains(err.Error(), "--groups -1") {
		t.Fatalf("--groups -1: %v, want an error naming the flag", err)
	}
}

// A node whose --groups differs from its peers' would place keys in other
// groups than they do; it must fail closed (unavailable), never grant a
// key the others hold.
func TestMismatchedGroupCountNeverDoubleGrants(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	tc.stop(3)
	tc.cfgs[2].Groups++
	tc.cfgs[2].DataDir = t.TempDir()
	odd := tc.restart(3)

	rec := newRecorder()
	if r := acquire(t, tc.node(1), rec, 1, "k", 10*time.Second, 0); r.Outcome != engine.Granted {
		t.Fatalf("acquire on node 1: %+v", r)
	}
	if r := acquire(t, odd, rec, 2, "k", 10*time.Second, 0); r.Outcome != engine.Unavailable {
		t.Fatalf("node 3 with %d groups against its peers' %d answered %+v, want Unavailable",
			tc.cfgs[2].Groups, tc.cfgs[0].Groups, r)
	}
}
