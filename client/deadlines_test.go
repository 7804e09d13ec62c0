package client

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestDeadlineQueueMatchesASortedModel drives the queue with random
// pushes — mostly in deadline order, some earlier, as calls with a short
// context deadline among others — and removals, and checks its earliest
// against a model.
func TestDeadlineQueueMatchesASortedModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	base := time.Unix(1000, 0)
	var q deadlineQueue
	var model []*request
	now := base
	for step := range 20000 {
		if len(model) < 64 && (len(model) == 0 || rng.IntN(2) == 0) {
			now = now.Add(time.Duration(rng.IntN(10)) * time.Millisecond)
			deadline := now.Add(5 * time.Second)
			if rng.IntN(8) == 0 {
				deadline = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
			}
			req := &request{deadline: deadline, heapIndex: notInHeap}
			q.push(req)
			model = append(model, req)
		} else {
			i := rng.IntN(len(model))
			q.remove(model[i])
			if req := model[i]; req.listed || req.prev != nil || req.next != nil || req.heapIndex != notInHeap {
				t.Fatalf("step %d: a removed request is still linked", step)
			}
			model = slices.Delete(model, i, i+1)
		}
		if len(model) == 0 {
			if q.earliest() != nil {
				t.Fatalf("step %d: empty queue has an earliest", step)
			}
			continue
		}
		least := slices.MinFunc(model, func(a, b *request) int { return a.deadline.Compare(b.deadline) })
		if !q.earliest().deadline.Equal(least.deadline) {
			t.Fatalf("step %d: earliest %v, want %v", step, q.earliest().deadline, least.deadline)
		}
	}
	q.reset()
	for _, req := range model {
		if req.listed || req.prev != nil || req.next != nil || req.heapIndex != notInHeap {
			t.Fatal("reset left a request linked")
		}
	}
	if q.earliest() != nil {
		t.Fatal("reset left an earliest")
	}
}
