// Package logdb owns a cluster node's Raft log store: dragonboat's Pebble
// LogDB behind a wrapper that leaves a Raft state change of the commit
// index alone unsaved until the next write that must be durable anyway
// (commitLazyLogDB). It knows nothing of locks, groups or the transport;
// the cluster package plugs it into a NodeHost through Factory.
package logdb

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	_ "unsafe" // go:linkname, for dragonboat's Pebble LogDB constructor

	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockd/lockd/internal/histogram"
)

// newPebbleLogDB is dragonboat's default LogDB, the one a NodeHost makes
// when it is given no factory. dragonboat exports no constructor for it
// (it lives in an internal package), and a wrapper needs it as its inner
// store: the only other LogDBs dragonboat offers (plugin/tan, plugin/tee)
// keep another on-disk format, and tan is slower here
// (docs/cluster.md, Raft log).
//
//go:linkname newPebbleLogDB github.com/lni/dragonboat/v4/internal/logdb.NewDefaultLogDB
func newPebbleLogDB(config.NodeHostConfig, config.LogDBCallback, []string, []string) (raftio.ILogDB, error)

// pebbleLogDBName is the name dragonboat records in a NodeHost dir for its
// default LogDB: the wrapper keeps it, so data dirs made with or without
// the wrapper open alike (the bytes on disk are the same).
const pebbleLogDBName = "sharded-pebble"

// Factory makes the NodeHost's LogDB (NodeHostConfig's
// Expert.LogDBFactory).
type Factory struct {
	Saves *histogram.Histogram // the durable writes' latency, for /metrics
}

func (Factory) Name() string { return pebbleLogDBName }

func (f Factory) Create(nhc config.NodeHostConfig, cb config.LogDBCallback, dirs, walDirs []string) (raftio.ILogDB, error) {
	inner, err := newPebbleLogDB(nhc, cb, dirs, walDirs)
	if err != nil {
		return nil, err
	}
	// The NodeHost runs this check on its default LogDB only, which it
	// recognises by type; the wrapper hides the type, so it runs it.
	if c, ok := inner.(interface{ SelfCheckFailed() (bool, error) }); ok {
		failed, err := c.SelfCheckFailed()
		if err == nil && failed {
			err = fmt.Errorf("cluster: the Raft log in %v fails dragonboat's self check", dirs)
		}
		if err != nil {
			inner.Close()
			return nil, err
		}
	}
	return newCommitLazyLogDB(inner, f.Saves), nil
}

// raftReplica names one replica of one Raft group in a LogDB.
type raftReplica struct{ shardID, replicaID uint64 }

// commitLazyLogDB saves every Raft update as the inner LogDB does, with one
// exception: an update whose only durable content is a new commit index
// (no entries, no snapshot, term and vote as last written) is not written
// at once. Pebble commits every write with an fsync, and that update comes
// once per commit on every replica (the leader learns the commit from the
// acknowledgements, a follower from the next message), so writing it
// doubles the fsyncs per commit, and the step worker that waits on it is the one the
// next proposal needs. The held state goes out with the replica's next
// write of entries, a snapshot or a term or vote, which is durable anyway.
//
// Raft needs the commit index on disk for nothing: a replica that restarts
// with an older one learns the commit again from the leader, and what was
// committed stays so because its entries are durable on a quorum (etcd's
// raft does not sync a commit-only change either). The one rule a restart
// checks is that the commit index is not below the latest snapshot's index,
// which ReadRaftState restores: a snapshot only holds applied, so
// committed, entries.
type commitLazyLogDB struct {
	raftio.ILogDB

	mu      sync.Mutex
	written map[raftReplica]pb.State // the state last handed to the inner LogDB
	held    map[raftReplica]pb.State // newer than written in its commit index only
	// kept is each step worker's scratch for the updates passed on;
	// dragonboat never calls SaveRaftState twice at once for one worker.
	kept map[uint64][]pb.Update
	// saves is the latency of the writes passed on, each one Pebble
	// commit with its fsync.
	saves *histogram.Histogram
}

func newCommitLazyLogDB(inner raftio.ILogDB, saves *histogram.Histogram) *commitLazyLogDB {
	return &commitLazyLogDB{ILogDB: inner, saves: saves, written: make(map[raftReplica]pb.State),
		held: make(map[raftReplica]pb.State), kept: make(map[uint64][]pb.Update)}
}

// SaveRaftState is raftio.ILogDB's; worker is the calling step worker.
func (l *commitLazyLogDB) SaveRaftState(updates []pb.Update, worker uint64) error {
	l.mu.Lock()
	kept := l.kept[worker][:0]
	for _, ud := range updates {
		r := raftReplica{ud.ShardID, ud.ReplicaID}
		durable := len(ud.EntriesToSave) > 0 || !pb.IsEmptySnapshot(ud.Snapshot)
		newState := !pb.IsEmptyState(ud.State)
		if !durable && !newState {
			continue // nothing the inner LogDB would write
		}
		if !durable {
			if last, ok := l.written[r]; ok && last.Term == ud.State.Term && last.Vote == ud.State.Vote {
				l.held[r] = ud.State
				continue
			}
		}
		if held, ok := l.held[r]; ok {
			if !newState {
				ud.State = held // the replica's current state: nothing newer came
			}
			delete(l.held, r)
		}
		if !pb.IsEmptyState(ud.State) {
			l.written[r] = ud.State
		}
		kept = append(kept, ud)
	}
	l.kept[worker] = kept
	l.mu.Unlock()
	if len(kept) == 0 {
		return nil
	}
	// The step worker calling this has just handed the replicate messages
	// of these entries to the transport's senders, whose goroutines it
	// readied on its own processor. Pebble's commit readies its WAL
	// flusher after them and waits; the flusher then holds the processor
	// in fdatasync with the senders queued behind it, and the entries
	// reach the followers only after the leader's own sync has started
	// (docs/cluster.md, Raft log). Yielding lets the senders write
	// first.
	runtime.Gosched()
	start := time.Now()
	err := l.ILogDB.SaveRaftState(kept, worker)
	l.saves.Observe(time.Since(start))
	clear(kept) // the scratch must not pin the entries until the next call
	return err
}

// ReadRaftState is raftio.ILogDB's: the saved state, its commit index
// raised to the latest snapshot's index where a held commit had not been
// written before that snapshot was.
func (l *commitLazyLogDB) ReadRaftState(shardID, replicaID, lastIndex uint64) (raftio.RaftState, error) {
	rs, err := l.ILogDB.ReadRaftState(shardID, replicaID, lastIndex)
	if err != nil {
		return rs, err
	}
	ss, err := l.ILogDB.GetSnapshot(shardID, replicaID)
	if err != nil {
		return rs, err
	}
	if ss.Index > rs.State.Commit {
		rs.State.Commit = ss.Index
	}
	return rs, nil
}

// RemoveNodeData is raftio.ILogDB's; it forgets the replica's states too.
func (l *commitLazyLogDB) RemoveNodeData(shardID, replicaID uint64) error {
	l.mu.Lock()
	r := raftReplica{shardID, replicaID}
	delete(l.written, r)
	delete(l.held, r)
	l.mu.Unlock()
	return l.ILogDB.RemoveNodeData(shardID, replicaID)
}
