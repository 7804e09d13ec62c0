package logdb

import (
	"testing"

	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockd/lockd/internal/histogram"
)

// recordingLogDB is an inner LogDB that keeps every SaveRaftState call's
// updates and answers ReadRaftState and GetSnapshot with fixed values.
type recordingLogDB struct {
	raftio.ILogDB // nil: a call of anything else panics the test
	saves         [][]pb.Update
	state         pb.State
	snapshot      pb.Snapshot
}

func (r *recordingLogDB) SaveRaftState(updates []pb.Update, worker uint64) error {
	r.saves = append(r.saves, append([]pb.Update(nil), updates...))
	return nil
}

func (r *recordingLogDB) ReadRaftState(shardID, replicaID, lastIndex uint64) (raftio.RaftState, error) {
	return raftio.RaftState{State: r.state, FirstIndex: 1, EntryCount: lastIndex}, nil
}

func (r *recordingLogDB) GetSnapshot(shardID, replicaID uint64) (pb.Snapshot, error) {
	return r.snapshot, nil
}

// TestCommitOnlyStateWaitsForTheNextDurableWrite: of a replica's updates,
// a change of the commit index alone reaches the inner LogDB (and its
// fsync) only with the next update that saves entries; a term or vote
// change, entries and a snapshot are written at once, and another
// replica's updates are not held by this one's.
func TestCommitOnlyStateWaitsForTheNextDurableWrite(t *testing.T) {
	inner := &recordingLogDB{}
	l := newCommitLazyLogDB(inner, new(histogram.Histogram))
	entry := func(i uint64) []pb.Entry { return []pb.Entry{{Index: i, Term: 2}} }
	save := func(ud ...pb.Update) {
		t.Helper()
		if err := l.SaveRaftState(ud, 1); err != nil {
			t.Fatal(err)
		}
	}

	save(pb.Update{ShardID: 1, ReplicaID: 1, State: pb.State{Term: 2, Vote: 3, Commit: 4}, EntriesToSave: entry(5)})
	save(pb.Update{ShardID: 1, ReplicaID: 1, State: pb.State{Term: 2, Vote: 3, Commit: 5}})
	if len(inner.saves) != 1 {
		t.Fatalf("a commit-only change was written: %d saves, want 1", len(inner.saves))
	}
	save(pb.Update{ShardID: 1, ReplicaID: 1}) // nothing to save at all
	if len(inner.saves) != 1 {
		t.Fatalf("an empty update was written: %d saves, want 1", len(inner.saves))
	}
	save(pb.Update{ShardID: 1, ReplicaID: 1, EntriesToSave: entry(6)},
		pb.Update{ShardID: 2, ReplicaID: 1, State: pb.State{Term: 1, Commit: 9}})
	if len(inner.saves) != 2 || len(inner.saves[1]) != 2 {
		t.Fatalf("saves %v, want the entries and the other replica's first state in one more save", inner.saves)
	}
	if got := inner.saves[1][0].State; got != (pb.State{Term: 2, Vote: 3, Commit: 5}) {
		t.Fatalf("the entries went out with state %v, want the held commit 5", got)
	}
	save(pb.Update{ShardID: 1, ReplicaID: 1, State: pb.State{Term: 3, Vote: 1, Commit: 5}})
	if len(inner.saves) != 3 {
		t.Fatalf("a term and vote change was not written at once: %d saves", len(inner.saves))
	}
	save(pb.Update{ShardID: 1, ReplicaID: 1, State: pb.State{Term: 3, Vote: 1, Commit: 6}})
	save(pb.Update{ShardID: 1, ReplicaID: 1, Snapshot: pb.Snapshot{Index: 6, Term: 3}})
	if len(inner.saves) != 4 || inner.saves[3][0].State.Commit != 6 {
		t.Fatalf("saves %v, want the snapshot written with the held commit 6", inner.saves)
	}
}

// TestReadRaftStateCommitCoversTheSnapshot: a saved commit index below the
// latest snapshot (its raise was held when the node stopped) is read back
// as the snapshot's index, which dragonboat requires on a restart; one
// above it is read back as saved.
func TestReadRaftStateCommitCoversTheSnapshot(t *testing.T) {
	inner := &recordingLogDB{state: pb.State{Term: 2, Commit: 40}, snapshot: pb.Snapshot{Index: 50, Term: 2}}
	l := newCommitLazyLogDB(inner, new(histogram.Histogram))
	rs, err := l.ReadRaftState(1, 1, 60)
	if err != nil {
		t.Fatal(err)
	}
	if rs.State.Commit != 50 || rs.State.Term != 2 {
		t.Fatalf("state %v, want commit 50 (the snapshot's index), term 2", rs.State)
	}
	inner.state.Commit = 55
	if rs, _ := l.ReadRaftState(1, 1, 60); rs.State.Commit != 55 {
		t.Fatalf("commit %d, want the saved 55", rs.State.Commit)
	}
}
