package client

// deadlineHeap orders a session's requests by their operation deadline, so
// that one timer per session, armed for the earliest, ends every call on
// time: a caller then waits on its answer alone, and no call arms a runtime
// timer of its own. Each request knows its index, so an answered request
// leaves the heap at once instead of lingering until its deadline.
type deadlineHeap []*request

// notInHeap is the heapIndex of a request that is in no session's heap.
const notInHeap = -1

func (h *deadlineHeap) push(req *request) {
	req.heapIndex = len(*h)
	*h = append(*h, req)
	h.up(req.heapIndex)
}

// remove takes req out of the heap if it is in it.
func (h *deadlineHeap) remove(req *request) {
	if req.heapIndex == notInHeap {
		return
	}
	old := *h
	i, last := req.heapIndex, len(old)-1
	if i != last {
		old.swap(i, last)
	}
	old[last] = nil
	*h = old[:last]
	req.heapIndex = notInHeap
	if i != last {
		h.down(i)
		h.up(i)
	}
}

// earliest is the request whose deadline comes first, nil when empty.
func (h deadlineHeap) earliest() *request {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}

func (h deadlineHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex, h[j].heapIndex = i, j
}

func (h deadlineHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].deadline.Before(h[p].deadline) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h deadlineHeap) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if r := c + 1; r < len(h) && h[r].deadline.Before(h[c].deadline) {
			c = r
		}
		if !h[c].deadline.Before(h[i].deadline) {
			return
		}
		h.swap(i, c)
		i = c
	}
}
