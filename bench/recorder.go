package bench

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// timelineStep is the resolution at which answers are counted over time:
// fine enough to time the reopening of an admission gate.
const timelineStep = 10 * time.Millisecond

// recorder collects a run's answers. Latencies go to histograms kept per
// shard, so that concurrent callers rarely meet on a lock, and per series
// (a phase and stream of the admission workload; series 0 otherwise); the
// shards are merged at the end. Counters for the progress line and the
// timeline are atomic.
type recorder struct {
	start  time.Time
	series int
	// fromSend keeps a second set of histograms, from the instant each
	// request was actually sent: in open loop that differs from the
	// scheduled instant by the time the request queued in the generator.
	fromSend bool
	shards   []recorderShard

	totals   [numOutcomes]atomic.Uint64
	cycles   atomic.Uint64
	drops    atomic.Uint64
	timeline [][numOutcomes]atomic.Uint64

	firstErrOnce sync.Once
	firstErr     error
}

// Which instant a latency counts from.
const (
	sinceScheduled = iota
	sinceSent
	latencyClocks
)

type recorderShard struct {
	mu    sync.Mutex
	hists [latencyClocks][][numOutcomes]*Histogram // [clock][series][outcome], made on first use
	_     [64]byte                                 // keeps neighbouring shards off one cache line
}

// newRecorder records series series from start; span bounds the timeline,
// and answers after it count in its last step.
func newRecorder(start time.Time, series int, span time.Duration, fromSend bool) *recorder {
	r := &recorder{
		start:    start,
		series:   series,
		fromSend: fromSend,
		shards:   make([]recorderShard, 4*runtime.GOMAXPROCS(0)),
		timeline: make([][numOutcomes]atomic.Uint64, span/timelineStep+1),
	}
	for i := range r.shards {
		for c := range latencyClocks {
			r.shards[i].hists[c] = make([][numOutcomes]*Histogram, series)
		}
	}
	return r
}

// record counts one answer that came at done: its outcome and its latency
// from the scheduled instant (and, with fromSend, from the send). worker
// picks the shard; err is kept if it is the first of a Failed outcome.
func (r *recorder) record(worker, series int, out Outcome, scheduled, sent, done time.Time, err error) {
	sh := &r.shards[worker%len(r.shards)]
	sh.mu.Lock()
	sh.add(sinceScheduled, series, out, done.Sub(scheduled))
	if r.fromSend {
		sh.add(sinceSent, series, out, done.Sub(sent))
	}
	sh.mu.Unlock()

	r.totals[out].Add(1)
	step := min(int(done.Sub(r.start)/timelineStep), len(r.timeline)-1)
	r.timeline[max(step, 0)][out].Add(1)
	if out == Failed && err != nil {
		r.firstErrOnce.Do(func() { r.firstErr = err })
	}
}

// add records into one histogram; sh.mu is held.
func (sh *recorderShard) add(clock, series int, out Outcome, latency time.Duration) {
	h := sh.hists[clock][series][out]
	if h == nil {
		h = new(Histogram)
		sh.hists[clock][series][out] = h
	}
	h.Record(latency)
}

// merged returns, per outcome, the histogram of latencies since clock for
// the given series, merged over every shard; an outcome never seen has an
// empty histogram.
func (r *recorder) merged(clock int, series ...int) [numOutcomes]*Histogram {
	var out [numOutcomes]*Histogram
	for o := range out {
		out[o] = new(Histogram)
	}
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for _, s := range series {
			for o, h := range sh.hists[clock][s] {
				if h != nil {
					out[o].Merge(h)
				}
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// allSeries lists every series, for merged.
func (r *recorder) allSeries() []int {
	all := make([]int, r.series)
	for i := range all {
		all[i] = i
	}
	return all
}

// counts returns the timeline as plain numbers, in steps of timelineStep.
func (r *recorder) counts() [][numOutcomes]uint64 {
	out := make([][numOutcomes]uint64, len(r.timeline))
	for i := range r.timeline {
		for o := range out[i] {
			out[i][o] = r.timeline[i][o].Load()
		}
	}
	return out
}
