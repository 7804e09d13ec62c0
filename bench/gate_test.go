package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gateConfig is a short closed-loop run against an in-process lockd.
func gateConfig(d time.Duration) Config {
	return Config{Workload: Uncontended, Callers: 2, Duration: d}
}

// gateSample runs cfg once against a fresh in-process server, as
// lockbench --target inproc does, with every acquire slowed by delay.
func gateSample(t *testing.T, cfg Config, delay time.Duration) *Result {
	t.Helper()
	srv, err := StartServer(0)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	opts := testTargetOptions
	opts.acquireDelay = delay
	res, err := Run(context.Background(), TargetSpec{Scheme: SchemeLockd, Addr: srv.Addr()}, opts, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// No checkSane: on a machine this loaded a run this short may see no
	// cycle at all, which the gate counts as the slow sample it is.
	if res.Errors > 0 {
		t.Fatalf("%d errors, the first: %s", res.Errors, res.FirstError)
	}
	res.Target = "inproc" // one name for every server, as lockbench gives it
	return res
}

// An injected slowdown is flagged; the same build against itself is not.
// Both sides' samples are interleaved, each round in another order, so
// that the machine's drift weighs on all alike. α is 0.001 here, not the
// default 0.05, so that the self-comparison fails the test about once in
// a thousand runs rather than once in twenty: eight samples a side can
// reach p = 0.0002 (and a false alarm needs the worse side, so it comes at
// most once in 2000 per figure). The slowdown caps the slowed build at
// 1000 cycles/s, a quarter of what two callers do here under the race
// detector.
func TestGateFlagsAnInjectedSlowdownAndNotTheSameBuild(t *testing.T) {
	const rounds = 8
	cfg := gateConfig(200 * time.Millisecond)
	gate := GateConfig{MaxRegression: DefaultMaxRegression, Alpha: 0.001}
	delays := []time.Duration{0, 0, 2 * time.Millisecond} // baseline, the same build again, slowed
	samples := make([][]*Result, len(delays))
	for round := range rounds {
		for i := range delays {
			side := (round + i) % len(delays)
			samples[side] = append(samples[side], gateSample(t, cfg, delays[side]))
		}
	}
	var out bytes.Buffer
	slowed := Compare(samples[0], samples[2], gate)
	slowed.Write(&out)
	if len(slowed.Comparisons) != 2 {
		t.Fatalf("%d comparisons, want cycles/s and A p99:\n%s", len(slowed.Comparisons), out.String())
	}
	if !slowed.Comparisons[0].Regressed || slowed.Comparisons[0].Metric != "cycles/s" {
		t.Errorf("the slowed build's cycles/s not flagged:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "baseline gate FAILED") {
		t.Errorf("no failure in the report:\n%s", out.String())
	}
	out.Reset()
	same := Compare(samples[0], samples[1], gate)
	same.Write(&out)
	if r := same.Regressions(); len(r) > 0 || len(same.Comparisons) != 2 {
		t.Errorf("the same build flagged against itself:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}

// result is a synthetic run of one configuration.
func gateResult(target string, cyclesPerS, p99, serverCPUS float64) *Result {
	return &Result{
		Target: target, Kind: "lockd", Workload: Uncontended, Mode: "closed", Callers: 4, DurationS: 1,
		Cycles: uint64(cyclesPerS), CyclesPerS: cyclesPerS, ServerCPUS: serverCPUS,
		Outcomes: map[string]Percentiles{Acquired.String(): {Count: 100, P99: p99}},
	}
}

func TestCompareDecides(t *testing.T) {
	var baseline, current []*Result
	for i := range 5 {
		f := float64(i)
		// a: 20 % fewer cycles, every sample; p99 the same. b: 30 % more
		// server CPU per cycle; cycles/s 20 % worse in the median but
		// mixed in with the baseline's.
		baseline = append(baseline, gateResult("a", 1000+f, 50+f, 0), gateResult("b", 1000+100*f, 50, 1))
		current = append(current, gateResult("a", 800+f, 50+f, 0), gateResult("b", []float64{700, 1010, 800, 1200, 750}[i], 50, 1.3))
	}
	current = append(current, gateResult("c", 1, 1, 0))
	g := Compare(baseline, current, GateConfig{MaxRegression: 0.10, Alpha: 0.05})
	var out bytes.Buffer
	g.Write(&out)
	type verdict struct {
		config, metric string
		regressed      bool
	}
	var got []verdict
	for _, c := range g.Comparisons {
		got = append(got, verdict{c.Config[:1], c.Metric, c.Regressed})
	}
	want := []verdict{
		{"a", "cycles/s", true}, {"a", "A p99", false},
		{"b", "cycles/s", false}, {"b", "A p99", false}, {"b", "server CPU/cycle", true},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("verdicts %v, want %v\n%s", got, want, out.String())
	}
	a := g.Comparisons[0]
	if a.Baseline.Median != 1002 || a.Current.Median != 802 || a.Baseline.N != 5 || a.P != 2.0/252 {
		t.Fatalf("a cycles/s: %+v", a)
	}
	for _, want := range []string{"REGRESSED", "worse, not significant", "c (lockd)  uncontended  closed loop  callers 4: not in the baseline", "baseline gate FAILED: 2 figure(s) regressed", "p < 0.05"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if g := Compare(baseline[:6], current[:6], GateConfig{MaxRegression: 0.10, Alpha: 0.05}); len(g.Regressions()) != 0 || !strings.Contains(strings.Join(g.Notes, "\n"), "can never give p < 0.05") {
		t.Fatalf("three samples a side: %d regressions, notes %q", len(g.Regressions()), g.Notes)
	}
}

// gateTrialsEnv, when set to a number of trials, runs
// TestGateNoiseAndPower (make bench-gate): the false alarms of the same
// build compared with itself, and how often a 10 % slowdown is caught with
// how many repeats, run the way a CI job runs lockbench: the baseline's
// samples first, then this build's.
const gateTrialsEnv = "LOCKBENCH_GATE_TRIALS"

func TestGateNoiseAndPower(t *testing.T) {
	trials, _ := strconv.Atoi(os.Getenv(gateTrialsEnv))
	if trials <= 0 {
		t.Skipf("a measurement of minutes: set %s (make bench-gate)", gateTrialsEnv)
	}
	duration := time.Second
	if d, err := time.ParseDuration(os.Getenv("LOCKBENCH_GATE_DURATION")); err == nil {
		duration = d
	}
	cfg := gateConfig(duration)
	gate := GateConfig{MaxRegression: DefaultMaxRegression, Alpha: DefaultAlpha}
	block := func(n int, delay time.Duration) []*Result {
		var runs []*Result
		for range n {
			runs = append(runs, gateSample(t, cfg, delay))
		}
		return runs
	}
	medianOf := func(runs []*Result) float64 { return summarise(metricValues(runs, gateMetrics[0])).Median }

	const repeat = 5
	selfTrials := trials
	if n, err := strconv.Atoi(os.Getenv("LOCKBENCH_GATE_SELF")); err == nil {
		selfTrials = n // 0: the slowdown alone
	}
	alarms := 0
	var changes []string
	for trial := range selfTrials {
		g := Compare(block(repeat, 0), block(repeat, 0), gate)
		if len(g.Regressions()) > 0 {
			alarms++
		}
		changes = append(changes, fmt.Sprintf("%+.1f%%", 100*g.Comparisons[0].Change))
		t.Logf("self-comparison %d: cycles/s %+.1f%% p %.3f, A p99 %+.1f%% p %.3f, regressed %d",
			trial+1, 100*g.Comparisons[0].Change, g.Comparisons[0].P, 100*g.Comparisons[1].Change, g.Comparisons[1].P, len(g.Regressions()))
	}
	t.Logf("same build against itself, --repeat %d, %v runs: %d false alarm(s) in %d comparisons; cycles/s median changes %s",
		repeat, duration, alarms, selfTrials, strings.Join(changes, " "))

	// sequential runs the baseline's samples, then the slowed build's, as
	// a CI job does; alternating alternates them run by run, each round
	// in another order, as --repeat does with targets.
	var delay time.Duration
	sequential := func(n int) ([]*Result, []*Result) { return block(n, 0), block(n, delay) }
	alternating := func(n int) (base, slowed []*Result) {
		for i := range n {
			if i%2 == 0 {
				base = append(base, gateSample(t, cfg, 0))
			}
			slowed = append(slowed, gateSample(t, cfg, delay))
			if i%2 == 1 {
				base = append(base, gateSample(t, cfg, 0))
			}
		}
		return base, slowed
	}

	// A 10 % slowdown. The spin costs CPU the server needs too, so a
	// tenth of a caller's cycle costs far more than a tenth of the
	// cycles: the delay is the one of a few fractions of the cycle whose
	// alternating runs lose closest to 10 % of their cycles/s.
	perCycle := time.Duration(float64(cfg.Callers) / medianOf(block(repeat, 0)) * float64(time.Second))
	best, chosen := math.Inf(1), time.Duration(0)
	for _, fraction := range []float64{0.01, 0.02, 0.04} {
		delay = time.Duration(fraction * float64(perCycle))
		base, slowed := alternating(8)
		loss := 1 - medianOf(slowed)/medianOf(base)
		t.Logf("calibration: %v per acquire (%.0f %% of a %v cycle): cycles/s %.1f %% lower", delay, 100*fraction, perCycle, 100*loss)
		if math.Abs(loss-0.10) < best {
			best, chosen = math.Abs(loss-0.10), delay
		}
	}
	delay = chosen
	powerTrials := max(trials/4, 3)
	for _, order := range []struct {
		name string
		runs func(n int) ([]*Result, []*Result)
	}{{"sequential", sequential}, {"alternating", alternating}} {
		for _, n := range []int{5, 8} {
			caught := 0
			var seen []string
			for range powerTrials {
				base, slowed := order.runs(n)
				g := Compare(base, slowed, gate)
				if len(g.Regressions()) > 0 {
					caught++
				}
				seen = append(seen, fmt.Sprintf("%+.1f%% p %.3f", 100*g.Comparisons[0].Change, g.Comparisons[0].P))
			}
			t.Logf("slowed by %v per acquire (a cycle is %v), %s, --repeat %d: caught %d of %d; cycles/s %s",
				delay, perCycle, order.name, n, caught, powerTrials, strings.Join(seen, ", "))
		}
	}
}
