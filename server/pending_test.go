package server

import (
	"math/rand/v2"
	"testing"

	"github.com/lockd/lockd/engine"
)

// The pending table answers as a map would through random puts, removes
// and lookups (owners from a small range, so that probes collide and
// deletions shift), and gives its room back after a burst.
func TestPendingTableMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	table := newPendingTable()
	model := map[uint64]inFlight{}
	handles := []engine.Handle{new(engine.Wait), new(engine.Wait), asyncOp(opRelease), asyncOp(opKeep), reservedAcquire.h}
	for step := range 200_000 {
		owner := uint64(rng.IntN(300))
		if step%50_000 < 1000 {
			owner = rng.Uint64() // a burst of owners from everywhere
		}
		switch rng.IntN(3) {
		case 0:
			p := inFlight{h: handles[rng.IntN(len(handles))]}
			table.put(owner, p)
			model[owner] = p
		case 1:
			got, ok := table.remove(owner)
			want, wantOK := model[owner]
			delete(model, owner)
			if ok != wantOK || got != want {
				t.Fatalf("step %d: remove %d = %v %v, want %v %v", step, owner, got, ok, want, wantOK)
			}
		default:
			got, ok := table.get(owner)
			want, wantOK := model[owner]
			if ok != wantOK || got != want {
				t.Fatalf("step %d: get %d = %v %v, want %v %v", step, owner, got, ok, want, wantOK)
			}
		}
		if table.len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", step, table.len(), len(model))
		}
	}
	seen := 0
	table.each(func(owner uint64, p inFlight) {
		if model[owner] != p {
			t.Fatalf("each: %d = %v, want %v", owner, p, model[owner])
		}
		seen++
	})
	if seen != len(model) {
		t.Fatalf("each saw %d of %d", seen, len(model))
	}

	for i := range uint64(10_000) {
		table.put(1_000_000+i, reservedAcquire)
	}
	for i := range uint64(10_000) {
		table.remove(1_000_000 + i)
	}
	if len(table.slots) > 8*max(minPendingSlots, len(model)) {
		t.Fatalf("after a burst of 10 000: %d slots for %d entries", len(table.slots), len(model))
	}
}
