package cluster

import (
	"errors"
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

// A data dir written by the builds before the first release (their meta
// file names no log format: formats 1 and 2, with grant claims and
// witnesses) is refused at start, with an error naming the dir and what
// to do, and nothing in it is touched; a new dir records the base format.
func TestStartRefusesADataDirOfTheUnreleasedFormats(t *testing.T) {
	dir := t.TempDir()
	old := []byte(`{"node_id":1,"groups":3}`)
	if err := os.WriteFile(filepath.Join(dir, metaFile), old, 0o640); err != nil {
		t.Fatal(err)
	}
	n, err := Start(Config{NodeID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}, DataDir: dir, Logger: testLogger()})
	if err == nil {
		n.Close()
		t.Fatal("a data dir of the unreleased formats started a node")
	}
	for _, want := range []string{dir, "before v0.1.0", "move the data dir aside", "--join"} {
		if !errors.Is(err, ErrOldDataDir) || !strings.Contains(err.Error(), want) {
			t.Errorf("start on an old data dir: %v; want ErrOldDataDir saying %q", err, want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if b, _ := os.ReadFile(filepath.Join(dir, metaFile)); len(entries) != 1 || string(b) != string(old) {
		t.Fatalf("the refused dir was touched: %d entries, meta %s", len(entries), b)
	}

	fresh := Config{NodeID: 1, DataDir: t.TempDir(), Logger: testLogger()}
	if err := checkMeta(&fresh); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(fresh.DataDir, metaFile)); !strings.Contains(string(b), `"log_format":3`) {
		t.Fatalf("a new dir's meta %s does not record log format 3", b)
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

// A propose timeout that would let a node propose an abandoned acquire
// again after its tombstone could end is refused by name.
func TestProposeTimeoutBoundedByTheTombstoneLife(t *testing.T) {
	cfg := Config{NodeID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}, DataDir: t.TempDir(), ProposeTimeout: engine.TombstoneLife / 2, Logger: testLogger()}
	if err := cfg.applyDefaults(); err == nil || !strings.Contains(err.Error(), "propose timeout 2m30s") {
		t.Fatalf("propose timeout of half a tombstone's life: %v, want it refused by name", err)
	}
	cfg.ProposeTimeout = time.Minute
	if err := cfg.applyDefaults(); err != nil {
		t.Fatalf("propose timeout of a minute: %v", err)
	}
}
