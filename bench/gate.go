package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"text/tabwriter"
	"time"
)

// The baseline gate: is this build slower than the one a baseline file
// was saved from? One run against one earlier run answers that wrongly
// both ways on a shared machine, so each configuration is run several
// times on each side, and a figure counts as regressed only when its
// median is worse by more than GateConfig.MaxRegression and a two-sided
// Mann-Whitney U test over all the samples of both sides says the
// difference is unlikely to be noise (p < GateConfig.Alpha).

// Defaults of the gate.
const (
	DefaultMaxRegression = 0.10
	DefaultAlpha         = 0.05
)

// GateConfig is what makes a difference a regression.
type GateConfig struct {
	// MaxRegression is how much worse a median may be, as a fraction of
	// the baseline's, before it can count as a regression.
	MaxRegression float64 `json:"max_regression"`
	// Alpha is the significance level: a difference counts only when the
	// test's p-value is below it.
	Alpha float64 `json:"alpha"`
}

// gateMetric is one figure the gate compares.
type gateMetric struct {
	name           string
	higherIsBetter bool
	// value reads the figure from one run; false when the run has none.
	value func(*Result) (float64, bool)
}

// gateMetrics are the figures the gate judges: throughput, the tail an
// acquiring caller sees, and what the server spends per cycle (only
// where --server-pids gave its processes).
var gateMetrics = []gateMetric{
	{"cycles/s", true, func(r *Result) (float64, bool) { return r.CyclesPerS, r.DurationS > 0 }},
	{"A p99", false, func(r *Result) (float64, bool) {
		a := r.Outcomes[Acquired.String()]
		return a.P99, a.Count > 0
	}},
	{"server CPU/cycle", false, func(r *Result) (float64, bool) {
		return r.serverMicrosPerCycle(), r.ServerCPUS > 0 && r.Cycles > 0
	}},
}

// Samples summarises one side's values of one figure.
type Samples struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	// Spread is the farthest sample from the median, as a fraction of it.
	Spread float64 `json:"spread"`
}

func summarise(values []float64) Samples {
	sorted := slices.Sorted(slices.Values(values))
	n := len(sorted)
	median := (sorted[(n-1)/2] + sorted[n/2]) / 2
	spread := 0.0
	if median != 0 {
		spread = max(median-sorted[0], sorted[n-1]-median) / math.Abs(median)
	}
	return Samples{N: n, Median: median, Spread: spread}
}

// Comparison is one figure of one configuration: the baseline's samples
// against this build's.
type Comparison struct {
	// Config names the target and the workload's shape.
	Config string `json:"config"`
	Metric string `json:"metric"`
	// Baseline and Current summarise each side.
	Baseline Samples `json:"baseline"`
	Current  Samples `json:"current"`
	// Change is this build's median over the baseline's, less one.
	Change float64 `json:"change"`
	// Worse is how much worse this build's median is, as a fraction of
	// the baseline's: Change for a figure where lower is better, -Change
	// where higher is; negative when it is better.
	Worse float64 `json:"worse"`
	// P is the two-sided Mann-Whitney U test's p-value.
	P float64 `json:"p"`
	// Regressed: worse beyond MaxRegression, with P below Alpha.
	Regressed bool `json:"regressed"`
}

// Gate is the baseline gate's verdict on one command's runs.
type Gate struct {
	Config      GateConfig   `json:"config"`
	Comparisons []Comparison `json:"comparisons"`
	// Notes say what could not be compared, and what weakens the
	// comparisons made.
	Notes []string `json:"notes,omitempty"`
}

// configKey names a run's configuration: target, implementation and
// shape, the same across builds and repeats.
func (r *Result) configKey() string {
	return fmt.Sprintf("%s (%s)  %s", r.Target, r.Kind, r.describe())
}

// groupByConfig gathers the samples of each configuration, in first-run
// order.
func groupByConfig(results []*Result) (keys []string, samples map[string][]*Result) {
	samples = make(map[string][]*Result)
	for _, r := range results {
		key := r.configKey()
		if _, seen := samples[key]; !seen {
			keys = append(keys, key)
		}
		samples[key] = append(samples[key], r)
	}
	return keys, samples
}

// Compare judges this build's runs against the baseline's, configuration
// by configuration and figure by figure.
func Compare(baseline, current []*Result, cfg GateConfig) *Gate {
	g := &Gate{Config: cfg}
	_, before := groupByConfig(baseline)
	keys, after := groupByConfig(current)
	for _, key := range keys {
		old, ok := before[key]
		if !ok {
			g.Notes = append(g.Notes, fmt.Sprintf("%s: not in the baseline, not compared", key))
			continue
		}
		for _, m := range gateMetrics {
			x, y := metricValues(old, m), metricValues(after[key], m)
			if len(x) == 0 || len(y) == 0 {
				continue
			}
			g.Comparisons = append(g.Comparisons, compareMetric(key, m, x, y, cfg))
		}
		if least := leastMannWhitneyP(len(old), len(after[key])); least >= cfg.Alpha {
			g.Notes = append(g.Notes, fmt.Sprintf("%s: %d baseline and %d current samples can never give p < %g (the least is %.3f): nothing there can be flagged; use --repeat 5 or more on both sides",
				key, len(old), len(after[key]), cfg.Alpha, least))
		}
	}
	return g
}

func metricValues(runs []*Result, m gateMetric) []float64 {
	var values []float64
	for _, r := range runs {
		if v, ok := m.value(r); ok {
			values = append(values, v)
		}
	}
	return values
}

func compareMetric(key string, m gateMetric, baseline, current []float64, cfg GateConfig) Comparison {
	c := Comparison{Config: key, Metric: m.name, Baseline: summarise(baseline), Current: summarise(current)}
	if c.Baseline.Median != 0 {
		c.Change = c.Current.Median/c.Baseline.Median - 1
	}
	c.Worse = c.Change
	if m.higherIsBetter {
		c.Worse = -c.Change
	}
	_, c.P = mannWhitney(current, baseline)
	c.Regressed = c.Worse > cfg.MaxRegression && c.P < cfg.Alpha
	return c
}

// Regressions are the comparisons that failed the gate.
func (g *Gate) Regressions() []Comparison {
	var out []Comparison
	for _, c := range g.Comparisons {
		if c.Regressed {
			out = append(out, c)
		}
	}
	return out
}

// Write prints every comparison: each side's median, spread and sample
// count, the change, the p-value and the verdict.
func (g *Gate) Write(w io.Writer) {
	fmt.Fprintf(w, "\nbaseline gate: a figure regressed when its median is worse by more than %.0f %% and p < %g (two-sided Mann-Whitney U over every sample)\n",
		100*g.Config.MaxRegression, g.Config.Alpha)
	last := ""
	var tw *tabwriter.Writer
	for _, c := range g.Comparisons {
		if c.Config != last {
			if tw != nil {
				tw.Flush()
			}
			fmt.Fprintf(w, "%s\n", c.Config)
			tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "  figure\tbaseline median\tspread\tn\tthis build\tspread\tn\tchange\tp\tverdict\t\n")
			last = c.Config
		}
		fmt.Fprintf(tw, "  %s\t%s\t±%.1f%%\t%d\t%s\t±%.1f%%\t%d\t%+.1f%%\t%.3f\t%s\t\n", c.Metric,
			formatMetric(c.Metric, c.Baseline.Median), 100*c.Baseline.Spread, c.Baseline.N,
			formatMetric(c.Metric, c.Current.Median), 100*c.Current.Spread, c.Current.N,
			100*c.Change, c.P, c.verdict(g.Config))
	}
	if tw != nil {
		tw.Flush()
	}
	for _, note := range g.Notes {
		fmt.Fprintf(w, "note: %s\n", note)
	}
	if n := len(g.Regressions()); n > 0 {
		fmt.Fprintf(w, "baseline gate FAILED: %d figure(s) regressed\n", n)
	} else {
		fmt.Fprintf(w, "baseline gate passed (%d comparisons)\n", len(g.Comparisons))
	}
}

func (c Comparison) verdict(cfg GateConfig) string {
	switch {
	case c.Regressed:
		return "REGRESSED"
	case c.Worse > cfg.MaxRegression:
		return "worse, not significant"
	case -c.Worse > cfg.MaxRegression && c.P < cfg.Alpha:
		return "better"
	}
	return "ok"
}

func formatMetric(metric string, v float64) string {
	if metric == "cycles/s" {
		return fmt.Sprintf("%.0f", v)
	}
	return formatMicros(v)
}

// ReadReport reads a --json file, such as a saved baseline.
func ReadReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("%s: not a lockbench JSON file: %w", path, err)
	}
	if rep.Version != reportVersion {
		return nil, fmt.Errorf("%s: lockbench JSON version %d, this lockbench reads %d", path, rep.Version, reportVersion)
	}
	if len(rep.Runs) == 0 {
		return nil, errors.New(path + ": no runs")
	}
	return &rep, nil
}

// MachineNotes say where a baseline was taken on another kind of machine
// than this one: its figures are then not this machine's.
func (rep *Report) MachineNotes(here Machine) []string {
	var notes []string
	there := rep.Machine
	if there.NumCPU != here.NumCPU || there.GOMAXPROCS != here.GOMAXPROCS {
		notes = append(notes, fmt.Sprintf("the baseline ran on %d CPUs (GOMAXPROCS %d), this run on %d (%d)", there.NumCPU, there.GOMAXPROCS, here.NumCPU, here.GOMAXPROCS))
	}
	if there.GoVersion != here.GoVersion {
		notes = append(notes, fmt.Sprintf("the baseline was built with %s, this lockbench with %s", there.GoVersion, here.GoVersion))
	}
	if age := time.Since(rep.Started); age > 30*24*time.Hour {
		notes = append(notes, fmt.Sprintf("the baseline is %.0f days old", age.Hours()/24))
	}
	return notes
}
