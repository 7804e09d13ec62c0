package client

import (
	"math/rand/v2"
	"testing"
)

// TestPendingTableMatchesAMap drives the open-addressed table and a map
// with the same random inserts and removals of mostly consecutive owners,
// the pattern the client-wide counter produces.
func TestPendingTableMatchesAMap(t *testing.T) {
	const capacity = 64
	table := newPendingTable(capacity)
	model := map[uint64]*request{}
	rng := rand.New(rand.NewPCG(1, 2))
	var next uint64
	for step := range 200000 {
		if len(model) < capacity && (len(model) == 0 || rng.IntN(2) == 0) {
			next += 1 + uint64(rng.IntN(3))
			req := &request{owner: next}
			table.insert(next, req)
			model[next] = req
		} else {
			var victim uint64
			for owner := range model {
				victim = owner
				break
			}
			if got := table.remove(victim); got != model[victim] {
				t.Fatalf("step %d: remove(%d) returned the wrong request", step, victim)
			}
			delete(model, victim)
		}
		if table.count != len(model) {
			t.Fatalf("step %d: count %d, want %d", step, table.count, len(model))
		}
		// A wrong count lasts, so a check now and then catches it.
		if step%64 == 0 {
			if displaced := countDisplaced(&table); table.displaced != displaced {
				t.Fatalf("step %d: %d entries counted displaced, %d are", step, table.displaced, displaced)
			}
		}
		probe := next - uint64(rng.IntN(2*capacity))
		if got := table.get(probe); got != model[probe] {
			t.Fatalf("step %d: get(%d) = %v, want %v", step, probe, got, model[probe])
		}
	}
	for owner, req := range model {
		if table.get(owner) != req {
			t.Fatalf("owner %d lost", owner)
		}
	}
	if table.remove(next+1) != nil {
		t.Fatal("removed an absent owner")
	}
}

func countDisplaced(table *pendingTable) int {
	displaced := 0
	for i, slot := range table.slots {
		if slot.owner != 0 && uint64(i) != table.home(slot.owner) {
			displaced++
		}
	}
	return displaced
}
