package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/client"
)

// The timeouts workload against lockd through the client: 16 waiting
// callers holding one hot key 200 ms each queue 3.2 s deep, so most of
// their 1 s waits run out, while the probes share the client.
func TestTimeoutsWorkloadThroughTheClient(t *testing.T) {
	res := runChecked(t, Config{Workload: Timeouts, Callers: 16, Hold: 200 * time.Millisecond, Rate: 500, Duration: 4 * time.Second})
	to := res.Timeouts
	if to == nil || to.WaitS != 1 || to.HoldS != 0.2 || to.HotKeys != 1 || to.LoadedStartS != 2 {
		t.Fatalf("timeouts result: %+v", to)
	}
	w := to.Waiting
	ranOut := w.TimedOut + w.OwnIndeterminate
	if w.Acquired == 0 || ranOut == 0 {
		t.Fatalf("waiting callers: %+v; want grants and waits that ran out", w)
	}
	// 16 callers, each holding 200 ms: at most 5 grants a second in 2 s,
	// and at most one at the end of each hold.
	if limit := uint64(2*5 + 16); w.Acquired > limit {
		t.Fatalf("%d grants of one key held 200 ms each within 2 s", w.Acquired)
	}
	if to.BaselineProbes.Acquired == 0 || to.LoadedProbes.Acquired == 0 {
		t.Fatalf("probes: baseline %+v, loaded %+v", to.BaselineProbes, to.LoadedProbes)
	}
	if to.BaselineProbes.OwnIndeterminate+to.LoadedProbes.OwnIndeterminate != 0 {
		t.Fatal("a probe's wait of 0 ran out")
	}
	// The outcome kinds are the run's W and I answers, split by stream.
	if got := to.Waiting.OwnIndeterminate; got != res.Outcomes[WaitElapsed.String()].Count {
		t.Fatalf("W: %d of the waiting callers, %d in the run", got, res.Outcomes[WaitElapsed.String()].Count)
	}
	if got := w.Collateral + to.BaselineProbes.Collateral + to.LoadedProbes.Collateral; got != res.Outcomes[Indeterminate.String()].Count {
		t.Fatalf("I: %d by stream, %d in the run", got, res.Outcomes[Indeterminate.String()].Count)
	}
	for _, p := range []ProbeP99{to.Latency, to.Service} {
		if p.BaselineP99 <= 0 || p.LoadedP99 <= 0 || p.Ratio != p.LoadedP99/p.BaselineP99 {
			t.Fatalf("probe p99: %+v", p)
		}
	}
	if to.BaselineReconnects == nil || to.LoadedReconnects == nil {
		t.Fatal("no reconnect counts for the lockd client")
	}
	// A wait that may have reached the server ends its session (SPEC §6),
	// which the client dials again.
	if w.OwnIndeterminate > 0 && *to.LoadedReconnects == 0 {
		t.Fatalf("%d waits ended indeterminate without a reconnect", w.OwnIndeterminate)
	}
	if *to.LoadedReconnects > 0 && to.ReconnectsPerS <= 0 {
		t.Fatalf("reconnects per second %v", to.ReconnectsPerS)
	}
	var out bytes.Buffer
	WriteTable(&out, []*Result{res})
	for _, want := range []string{"timeouts  open loop  callers 16  rate 500/s", "probes alone until 2.0s, then also 16 waiting callers queueing for 1 hot key(s) with wait 1.00s, hold 200.00ms",
		"probes, baseline", "probes, with timeouts", "own indeterminate (W)", "collateral (I)", "probe A p99: baseline", "client reconnects: baseline "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, out.String())
		}
	}
}

// In bare frames the server answers T at the end of the wait: the same
// workload, no indeterminate outcome, no reconnect count.
func TestTimeoutsWorkloadInBareFrames(t *testing.T) {
	spec := startServer(t, 0)
	opts := testTargetOptions
	opts.Raw = true
	cfg := Config{Workload: Timeouts, Callers: 16, Hold: 200 * time.Millisecond, Rate: 500, Duration: 4 * time.Second}
	res, err := Run(context.Background(), spec, opts, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkSane(t, res)
	to := res.Timeouts
	if to.Waiting.TimedOut == 0 || to.Waiting.OwnIndeterminate+to.Waiting.Collateral != 0 {
		t.Fatalf("waiting callers in bare frames: %+v", to.Waiting)
	}
	if to.BaselineReconnects != nil || to.LoadedReconnects != nil || to.ReconnectsPerS != 0 {
		t.Fatalf("reconnects of a target that does not reconnect: %+v", to)
	}
	if got := to.reconnectSummary(); !strings.Contains(got, "n/a") {
		t.Fatalf("reconnect rate %q", got)
	}
}

// With rounds, windows of probes alone alternate with windows of waiting
// callers: both phases are recorded in every round, and a loaded window
// lasts until its waiting callers' last cycles end, at most a wait and a
// hold past the window.
func TestTimeoutsWorkloadInRounds(t *testing.T) {
	res := runChecked(t, Config{Workload: Timeouts, Callers: 16, Hold: 200 * time.Millisecond, Rate: 500, Duration: 8 * time.Second, Rounds: 2})
	to := res.Timeouts
	if to.Rounds != 2 || to.LoadedStartS != 2 {
		t.Fatalf("rounds %d, first loaded window at %vs; want 2 rounds, at 2s", to.Rounds, to.LoadedStartS)
	}
	// Two loaded windows of 2 s, each drained within a wait and a hold.
	if to.LoadedS < 4 || to.LoadedS > 4+2*1.2+0.5 {
		t.Fatalf("loaded for %vs, want 4s plus at most two drains", to.LoadedS)
	}
	// The baseline windows are 4 s less the drains: at 500/s, well over
	// a thousand probes each way.
	if to.BaselineProbes.Acquired < 1000 || to.LoadedProbes.Acquired < 1000 {
		t.Fatalf("probes: baseline %+v, loaded %+v", to.BaselineProbes, to.LoadedProbes)
	}
	if to.Waiting.OwnIndeterminate == 0 || *to.LoadedReconnects == 0 {
		t.Fatalf("waiting callers %+v, %d reconnects while loaded", to.Waiting, *to.LoadedReconnects)
	}
	var out bytes.Buffer
	WriteTable(&out, []*Result{res})
	if want := "2 rounds of 2.0s of probes alone, then 2.0s with also 16 waiting callers"; !strings.Contains(out.String(), want) {
		t.Errorf("the table lacks %q:\n%s", want, out.String())
	}
}

func TestTimeoutsNeedsTimeForWaitsToRunOut(t *testing.T) {
	_, err := Run(context.Background(), TargetSpec{Scheme: SchemeLockd, Addr: "127.0.0.1:1"}, testTargetOptions,
		Config{Workload: Timeouts, Duration: 3 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "--duration ≥ 4s") {
		t.Fatalf("a 3 s timeouts run with the 1 s wait: %v", err)
	}
	_, err = Run(context.Background(), TargetSpec{Scheme: SchemeLockd, Addr: "127.0.0.1:1"}, testTargetOptions,
		Config{Workload: Timeouts, Duration: 10 * time.Second, Rounds: 3})
	if err == nil || !strings.Contains(err.Error(), "--duration ≥ 12s") {
		t.Fatalf("a 10 s timeouts run of 3 rounds with the 1 s wait: %v", err)
	}
}

// Check passes a timeouts run's indeterminate outcomes, which are what it
// measures, but not one in which no wait ran out; other workloads fail on
// any indeterminate outcome.
func TestCheckOfIndeterminateOutcomes(t *testing.T) {
	outcomes := func(w, i uint64) map[string]Percentiles {
		return map[string]Percentiles{"A": {Count: 10, P50: 1, P90: 2, P99: 3, P999: 4, Max: 5}, "W": {Count: w}, "I": {Count: i}}
	}
	timeouts := &Result{Workload: Timeouts, Cycles: 10, CyclesPerS: 5, Outcomes: outcomes(3, 2),
		Timeouts: &TimeoutsResult{Waiting: OutcomeKinds{Acquired: 10, OwnIndeterminate: 3, Collateral: 2}}}
	if err := Check([]*Result{timeouts}); err != nil {
		t.Fatal(err)
	}
	nothingRanOut := &Result{Workload: Timeouts, Cycles: 10, CyclesPerS: 5, Outcomes: outcomes(0, 0),
		Timeouts: &TimeoutsResult{Waiting: OutcomeKinds{Acquired: 10}}}
	if err := Check([]*Result{nothingRanOut}); err == nil || !strings.Contains(err.Error(), "no wait ran out") {
		t.Fatalf("a timeouts run without a timeout: %v", err)
	}
	contended := &Result{Workload: Contended, Cycles: 10, CyclesPerS: 5, Outcomes: outcomes(1, 0)}
	if err := Check([]*Result{contended}); err == nil || !strings.Contains(err.Error(), "1 indeterminate outcomes") {
		t.Fatalf("a contended run with an indeterminate outcome: %v", err)
	}
}

func TestClientErrorsByOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{nil, Acquired},
		{fmt.Errorf("%w: the deadline came", client.ErrTimeout), TimedOut},
		{client.ErrBusy, Busy},
		{fmt.Errorf("%w: %w: acquire of %q may have reached the server: %w", client.ErrIndeterminate, client.ErrWaitElapsed, "k", errors.New("deadline")), WaitElapsed},
		{fmt.Errorf("%w: acquire of %q: %w", client.ErrIndeterminate, "k", errors.New("session closed")), Indeterminate},
		{client.ErrClosed, Failed},
	} {
		if got, _ := acquireOutcome(tc.err); got != tc.want {
			t.Errorf("acquire %v: %v, want %v", tc.err, got, tc.want)
		}
	}
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{nil, Released},
		{client.ErrNotHeld, NotHeld},
		{fmt.Errorf("%w: no answer", client.ErrIndeterminate), Indeterminate},
		{client.ErrClosed, Failed},
	} {
		if got, _ := releaseOutcome(tc.err); got != tc.want {
			t.Errorf("release %v: %v, want %v", tc.err, got, tc.want)
		}
	}
}
