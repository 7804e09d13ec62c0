package cluster

// This file owns read-only inspection of the replicated lock table, as
// this node's replica of each group has applied it: it may lag the
// group's leader by the entries not yet applied here. It proposes
// nothing and holds one group's state lock at a time.

import (
	"strings"
	"time"

	"github.com/lockd/lockd/engine"
)

var _ engine.Inspector = (*Node)(nil)

// InspectLock shows key of tenant in its group's replicated state.
func (n *Node) InspectLock(tenant string, key []byte) engine.LockInfo {
	f := n.groups[groupOf(tenant, key, len(n.groups))].fsm.Load()
	if f == nil {
		return engine.LockInfo{Key: string(key)}
	}
	k := lockKey([]byte(tenant), key)
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.state.locks[k]; l != nil {
		return l.info(string(key), f.replicaNow())
	}
	return engine.LockInfo{Key: string(key)}
}

// ListLocks shows, sorted by key, at most limit keys of tenant that start
// with prefix, gathered group by group.
func (n *Node) ListLocks(tenant string, prefix []byte, limit int) []engine.LockInfo {
	smallest := engine.NewSmallestLocks(limit)
	start := lockKey([]byte(tenant), prefix)
	for _, g := range n.groups {
		f := g.fsm.Load()
		if f == nil {
			continue
		}
		f.mu.Lock()
		now := f.replicaNow()
		for k, l := range f.state.locks {
			if !strings.HasPrefix(k, start) {
				continue
			}
			key := k[len(tenant)+1:]
			if !smallest.Wants(key) {
				continue
			}
			if info := l.info(key, now); info.Held || info.Waiters > 0 {
				smallest.Add(info) // a lapsed, unclaimed key is free, as if absent
			}
		}
		f.mu.Unlock()
	}
	return smallest.Sorted()
}

// replicaNow is the instant inspection judges leases at, on the group's
// clock: its time as last applied here, plus this node's monotonic time
// since. The caller holds f.mu.
func (f *fsm) replicaNow() time.Duration {
	return f.state.now + f.clock() - f.nowAppliedAt
}

// info is l, the lock of key, at now. The hold time is on the same clock
// as the lease left, counted from the group's clock at the grant.
func (l *lockState) info(key string, now time.Duration) engine.LockInfo {
	info := engine.LockInfo{Key: key, Waiters: len(l.queue)}
	if l.HeldAt(now) {
		info.Held, info.Token, info.LeaseRemaining = true, l.Token, l.End-now
		info.HeldFor, info.GrantNode = max(now-l.grantedAt, 0), l.node
		if l.origin != 0 {
			info.LeaseRemaining = seconds(l.leaseSeconds) // not dated yet: all of it (clock.go)
		}
	}
	return info
}
