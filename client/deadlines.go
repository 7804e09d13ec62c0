package client

// deadlineQueue orders a session's requests by their operation deadline,
// so that one timer per session, armed for the earliest, ends every call on
// time: a caller then waits on its answer alone, and no call arms a runtime
// timer of its own.
//
// Most deadlines arrive in order — every call without an earlier context
// deadline has IODeadline or its wait from its start — so those go to the
// back of a list, in O(1), and leave it in O(1) when answered; only a
// deadline earlier than the list's last one goes to a heap beside it. The
// earliest request is the earlier of the list's front and the heap's top.
type deadlineQueue struct {
	front, back *request
	early       deadlineHeap
}

// push adds req, which is in no queue.
func (q *deadlineQueue) push(req *request) {
	if q.back != nil && req.deadline.Before(q.back.deadline) {
		q.early.push(req)
		return
	}
	req.listed = true
	req.prev = q.back
	if q.back != nil {
		q.back.next = req
	} else {
		q.front = req
	}
	q.back = req
}

// remove takes req out of the queue if it is in it.
func (q *deadlineQueue) remove(req *request) {
	if !req.listed {
		q.early.remove(req)
		return
	}
	if req.prev != nil {
		req.prev.next = req.next
	} else {
		q.front = req.next
	}
	if req.next != nil {
		req.next.prev = req.prev
	} else {
		q.back = req.prev
	}
	req.prev, req.next, req.listed = nil, nil, false
}

// earliest is the request whose deadline comes first, nil when empty.
func (q *deadlineQueue) earliest() *request {
	top := q.early.earliest()
	if top == nil || (q.front != nil && !top.deadline.Before(q.front.deadline)) {
		return q.front
	}
	return top
}

// reset empties the queue.
func (q *deadlineQueue) reset() {
	for req := q.front; req != nil; {
		next := req.next
		req.prev, req.next, req.listed = nil, nil, false
		req = next
	}
	q.front, q.back = nil, nil
	for _, req := range q.early {
		req.heapIndex = notInHeap
	}
	clear(q.early)
	q.early = q.early[:0]
}

// deadlineHeap holds the requests whose deadline came out of order. Each
// request knows its index, so an answered request leaves the heap at once
// instead of lingering until its deadline.
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
