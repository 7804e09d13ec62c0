package cluster

import (
	"bytes"
	"testing"

	"github.com/valyala/bytebufferpool"
)

// newIdleGroup is a group with no node behind it, for the proposer's
// buffer handling alone.
func newIdleGroup() *group {
	return &group{slots: make(chan struct{}, proposalsInFlight), freed: make(chan struct{}, 1), buf: make([]byte, headerLen, 4096)}
}

// gather queues n acquires of key as the event loops do and takes them as
// a proposal, holding a slot for it.
func (g *group) gather(n int, key string) *bytebufferpool.ByteBuffer {
	g.mu.Lock()
	for i := range n {
		g.buf = appendAcquire(g.buf, 1, uint64(i+1), 30, 0, 1000, "default", []byte(key))
		g.count++
	}
	g.mu.Unlock()
	g.slots <- struct{}{}
	return g.take()
}

// A proposal's bytes stay as taken while its slot is held — watch and
// send propose them again after a drop or a leader change — however many
// proposals are taken and ended meanwhile; only done gives them back.
func TestProposalBufferLivesUntilItsSlotIsFreed(t *testing.T) {
	g := newIdleGroup()
	first := g.gather(8, "first")
	want := bytes.Clone(first.B)
	if got := binaryCount(first.B); got != 8 {
		t.Fatalf("the proposal counts %d commands, want 8", got)
	}
	for range 100 {
		next := g.gather(8, "other")
		if bytes.Contains(next.B, []byte("first")) || binaryCount(next.B) != 8 {
			t.Fatal("a later batch carries commands of the first")
		}
		g.done(next)
		if !bytes.Equal(first.B, want) {
			t.Fatal("the first proposal's bytes changed while its slot was held")
		}
	}
	g.done(first)
	if len(g.slots) != 0 {
		t.Fatalf("%d slots still held", len(g.slots))
	}
}

// BenchmarkProposalBatches measures the node's side of one proposal
// without Raft: 32 acquires gathered, taken as a stamped batch, and the
// batch's end (done), whose buffer the next batch gathers in.
func BenchmarkProposalBatches(b *testing.B) {
	g := newIdleGroup()
	b.ReportAllocs()
	for b.Loop() {
		g.done(g.gather(32, "bench/key"))
	}
}
