package server

import (
	"math"
	"sync"
	"time"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

// The responses of a connection: appended to its loop's batch, written
// by flush once per pass.

func (ss *session) appendResult(op opKind, owner uint64, r engine.Result) {
	ss.batch.buf = ss.srv.metrics.encodeResult(ss.batch.buf, op, owner, r)
	ss.batch.frames++
}

// appendAcquireResult is appendResult for an ACQUIRE of the key named
// origin: a grant's A is where the origins table learns the address it
// went to.
func (ss *session) appendAcquireResult(owner, origin uint64, r engine.Result) {
	ss.appendResult(opAcquire, owner, r)
	if r.Outcome == engine.Granted {
		ss.srv.origins.record(origin, r.Token, ss.remote)
	}
}

func (ss *session) appendOwnerOnly(op opKind, respOp byte, owner uint64) {
	ss.batch.buf = codec.AppendOwnerOnly(ss.batch.buf, respOp, owner)
	ss.batch.frames++
	ss.srv.metrics.countResult(op, resultOf(respOp))
}

func (ss *session) appendError(owner uint64, reason codec.Reason) {
	ss.batch.buf = codec.AppendError(ss.batch.buf, owner, reason)
	ss.batch.frames++
	ss.srv.metrics.errors[reason].Add(1)
}

// batch collects responses for one write. An event loop serves one
// connection at a time and every pass ends with a flush, so one batch per
// loop serves all its connections: an idle connection costs no buffer.
// A TLS connection has its own loop, so its own batch.
//
// A batch also takes the answers resolved during its loop's pass. A RELEASE read by
// one connection grants the head waiter, whose connection is most often
// served by the same loop; waking that connection through gnet would cost
// an eventfd write and one more turn of the loop per grant. While a pass
// runs, a resolved session of the loop is listed here instead, and the
// pass delivers its answers itself before it ends (endPass).
type batch struct {
	buf    []byte
	frames int

	// arrived is the clock instant the loop's pass began: the arrival of
	// the frames it reads. answers are the acquire answers in buf, whose
	// latency is observed, with one clock reading, when buf is written;
	// latency is the stripe of the histograms this loop writes.
	arrived int64
	answers []acquireAnswer
	latency *latencyStripe

	mu     sync.Mutex
	inPass bool
	ready  []*session // resolved during the pass, to deliver before it ends
	spare  []*session // ready's other slice, swapped in by endPass
}

// beginPass marks the loop as serving a pass; loop only.
func (b *batch) beginPass() {
	b.mu.Lock()
	b.inPass = true
	b.mu.Unlock()
}

// enlist lists ss for delivery by its loop's running pass and reports
// whether one was running to take it; any goroutine.
func (b *batch) enlist(ss *session) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.inPass {
		return false
	}
	b.ready = append(b.ready, ss)
	return true
}

// endPass delivers the answers of every session resolved during the pass,
// those resolved while it delivers included, then ends the pass; loop
// only, after the pass's own flush.
func (b *batch) endPass() {
	for {
		b.mu.Lock()
		if len(b.ready) == 0 {
			b.inPass = false
			b.mu.Unlock()
			return
		}
		ready := b.ready
		b.ready = b.spare[:0]
		b.mu.Unlock()
		for i, ss := range ready {
			ss.deliverEnlisted()
			ready[i] = nil
		}
		b.spare = ready[:0]
	}
}

// deliverEnlisted writes what callbacks resolved for ss, from its loop's
// pass over another connection. A session that must close gets a wake
// instead: only its own pass can close its connection.
func (ss *session) deliverEnlisted() {
	if ss.gone {
		return // close abandoned its outbox
	}
	// The pass's clock reading is of when it began; a callback may have
	// resolved this after the clock moved on, and a queued acquire's
	// arrival is estimated back from now by its age (arrivalOf).
	ss.batch.arrived = int64(ss.srv.clock.Now())
	ss.deliverResolutions(false)
	ss.flush()
	if ss.drainedIdle() {
		ss.wake()
	}
}

// flush writes the batch. Its bytes are dropped when the connection is
// gone: the batch is shared with the loop's other connections.
func (ss *session) flush() {
	if len(ss.batch.buf) > 0 && !ss.gone {
		if len(ss.batch.answers) > 0 {
			// Read before the write: once written, the answer is the
			// client's, and so is the next move of a test's fake clock.
			ss.batch.observeAnswers(ss.srv.clock.Now())
		}
		ss.writing = true
		ss.tr.write(ss.batch.buf)
		ss.writing = false
		ss.srv.metrics.writes.Add(1)
	}
	ss.batch.answers = ss.batch.answers[:0]
	ss.batch.buf = ss.batch.buf[:0]
	ss.batch.frames = 0
}

// waitedMs truncates: a client adds waited_ms to its send instant to bound
// the lease's end, so rounding down keeps that bound conservative.
func waitedMs(d time.Duration) uint32 {
	ms := d.Milliseconds()
	if ms > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(ms)
}
