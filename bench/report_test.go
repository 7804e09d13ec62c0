package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleResults are two targets of one shape and an admission run, as a
// command comparing peers would produce.
func sampleResults() []*Result {
	outcomes := func(scale float64) map[string]Percentiles {
		m := make(map[string]Percentiles)
		for o := range numOutcomes {
			m[o.String()] = Percentiles{}
		}
		m["A"] = Percentiles{Count: 100, P50: 10 * scale, P90: 20 * scale, P99: 40 * scale, P999: 80 * scale, Max: 90 * scale}
		m["R"] = Percentiles{Count: 100, P50: 8, P90: 9, P99: 12, P999: 15, Max: 20}
		return m
	}
	timeline := []TimelinePoint{{T: 0, BRate: 0}, {T: 0.1, BRate: 0.4}, {T: 0.2, BRate: 0.1}}
	reconnects := []uint64{0, 12}
	return []*Result{
		{Target: "lockd://127.0.0.1:1", Kind: "lockd", Workload: Uncontended, Mode: "closed", Callers: 64, Conns: 4, Transport: "official client, Sessions 4",
			DurationS: 1, Cycles: 3000, CyclesPerS: 3000, Requests: 6000, BenchCPUS: 0.5, ServerCPUS: 0.3,
			BenchSyscr: 1500, BenchSyscw: 3000, BenchCtxsw: 600, ServerSyscr: 2000, ServerSyscw: 2000, ServerCtxsw: 900,
			Notes:    []string{"1 thread(s) of server pid 7 exited during the run: their context switches during it are not counted"},
			Outcomes: outcomes(1), Timeline: timeline},
		{Target: "redis://127.0.0.1:2", Kind: "redis", Workload: Uncontended, Mode: "closed", Callers: 64, Conns: 2, Transport: "rueidis auto-pipelining, its default PipelineMultiplex",
			DurationS: 1, Cycles: 1000, CyclesPerS: 1000, Requests: 2000, BenchCPUS: 0.4, BenchSyscr: 100, BenchSyscw: 2000, BenchCtxsw: 50,
			Notes: []string{"server syscalls unknown: open /proc/8/io: permission denied"}, Outcomes: outcomes(2), Timeline: timeline},
		{Target: "lockd://127.0.0.1:1", Kind: "lockd", Workload: Timeouts, Mode: "open", Rate: 1000, Callers: 64, Conns: 4, DurationS: 10, Cycles: 500, CyclesPerS: 50,
			Outcomes: outcomes(1), Timeline: timeline, Timeouts: &TimeoutsResult{WaitS: 1, HoldS: 0.05, HotKeys: 1, LoadedStartS: 5,
				Waiting:        OutcomeKinds{Acquired: 90, TimedOut: 1, OwnIndeterminate: 250, Collateral: 30},
				BaselineProbes: OutcomeKinds{Acquired: 5000}, LoadedProbes: OutcomeKinds{Acquired: 4990, Collateral: 10},
				Latency:            ProbeP99{BaselineP99: 1000, LoadedP99: 3000, Ratio: 3},
				Service:            ProbeP99{BaselineP99: 500, LoadedP99: 750, Ratio: 1.5},
				BaselineReconnects: &reconnects[0], LoadedReconnects: &reconnects[1], ReconnectsPerS: 2.4}},
		{Target: "lockd://127.0.0.1:1", Kind: "lockd", Workload: Admission, Mode: "open", Rate: 100, Callers: 8, Conns: 4, Cycles: 10, CyclesPerS: 10, Outcomes: outcomes(1), Timeline: timeline,
			Admission: &AdmissionResult{Limit: 10, WaitS: 1, ReopenS: 0.1, Phases: []PhaseResult{
				{Load: 0, StartS: 0, EndS: 0.1, Probe: outcomes(1), ProbeService: outcomes(1), Pressure: outcomes(1)},
				{Load: 1.3, StartS: 0.1, EndS: 0.2, BRate: 0.4, Probe: outcomes(1), ProbeService: outcomes(1), Pressure: outcomes(1)},
			}}},
	}
}

func TestJSONShape(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	if err := NewReport("lockbench --test", time.Now(), sampleResults()).WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Read it as CI would: untyped.
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if v, ok := doc["cycles_per_s"].(float64); !ok || v != 3000 {
		t.Fatalf("top-level cycles_per_s = %#v, want the first run's 3000", doc["cycles_per_s"])
	}
	outcomes, ok := doc["outcomes"].(map[string]any)
	if !ok {
		t.Fatalf("top-level outcomes: %#v", doc["outcomes"])
	}
	for _, letter := range []string{"A", "T", "B", "R", "N"} {
		p, ok := outcomes[letter].(map[string]any)
		if !ok {
			t.Fatalf("outcome %s missing", letter)
		}
		for _, field := range []string{"count", "p50_us", "p90_us", "p99_us", "p999_us", "max_us"} {
			if _, ok := p[field].(float64); !ok {
				t.Fatalf("outcome %s has no number %s: %#v", letter, field, p)
			}
		}
	}
	runs, ok := doc["runs"].([]any)
	if !ok || len(runs) != 4 {
		t.Fatalf("runs: %#v", doc["runs"])
	}
	lockd, redis := runs[0].(map[string]any), runs[1].(map[string]any)
	for field, want := range map[string]float64{
		"cycles": 3000, "cycles_per_s": 3000, "server_cpu_s": 0.3, "requests": 6000, "conns": 4,
		"server_syscr": 2000, "server_syscw": 2000, "server_ctxsw": 900, "bench_syscr": 1500, "bench_syscw": 3000, "bench_ctxsw": 600,
	} {
		if got, ok := lockd[field].(float64); !ok || got != want {
			t.Errorf("run %s = %#v, want %v", field, lockd[field], want)
		}
	}
	if lockd["target"] != "lockd://127.0.0.1:1" || lockd["transport"] != "official client, Sessions 4" || len(lockd["notes"].([]any)) != 1 {
		t.Errorf("run: target %v, transport %v, notes %v", lockd["target"], lockd["transport"], lockd["notes"])
	}
	// Unknown server counters are absent, not zero; lockbench's are always there.
	for _, field := range []string{"server_cpu_s", "server_syscr", "server_syscw", "server_ctxsw"} {
		if _, ok := redis[field]; ok {
			t.Errorf("unknown %s reported: %v", field, redis[field])
		}
	}
	for _, field := range []string{"bench_syscr", "bench_syscw", "bench_ctxsw"} {
		if _, ok := redis[field].(float64); !ok {
			t.Errorf("no %s", field)
		}
	}
	timeouts := runs[2].(map[string]any)["timeouts"].(map[string]any)
	if w := timeouts["waiting"].(map[string]any); w["indeterminate_own"] != 250.0 || w["indeterminate_collateral"] != 30.0 || w["acquired"] != 90.0 || w["timed_out"] != 1.0 {
		t.Errorf("timeouts waiting: %v", w)
	}
	if timeouts["loaded_reconnects"] != 12.0 || timeouts["loaded_reconnects_per_s"] != 2.4 || timeouts["latency"].(map[string]any)["loaded_over_baseline"] != 3.0 {
		t.Errorf("timeouts: %v", timeouts)
	}
	if _, ok := runs[0].(map[string]any)["timeouts"]; ok {
		t.Error("a timeouts section in an uncontended run")
	}
	admission := runs[3].(map[string]any)["admission"].(map[string]any)
	for _, field := range []string{"limit", "phases", "reopen_s", "latency", "service"} {
		if _, ok := admission[field]; !ok {
			t.Fatalf("admission has no %s", field)
		}
	}
	for _, field := range []string{"b_p99_us", "unloaded_a_p99_us", "loaded_a_p99_us"} {
		if _, ok := admission["latency"].(map[string]any)[field].(float64); !ok {
			t.Fatalf("admission latency has no %s", field)
		}
	}
	machine := doc["machine"].(map[string]any)
	if machine["num_cpu"].(float64) < 1 || !strings.HasPrefix(machine["go_version"].(string), "go") {
		t.Fatalf("machine: %#v", machine)
	}
}

func TestHTMLReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "report")
	path, err := NewReport("lockbench --test", time.Now(), sampleResults()).WriteHTML(dir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	for _, want := range []string{"<svg", "Latency against offered load", "B rate across the gate", "gate closes (90 %)", "redis p99", "3.00×",
		"4 connections (official client, Sessions 4)",
		"<tr><td>lockbench</td><td>166.7µs</td><td>0.50</td><td>1.00</td><td>0.20</td><td>4.00</td></tr>",
		"<tr><td>server</td><td>100.0µs</td><td>0.67</td><td>0.67</td><td>0.30</td><td>3.00</td></tr>",
		"Note: 1 thread(s) of server pid 7 exited", "Note: server syscalls unknown",
		"Timeouts: lockd://127.0.0.1:1 (lockd)", "<th>own indeterminate (W)</th><th>collateral (I)</th>",
		"<tr><td>waiting callers</td><td>90</td><td>1</td><td>250</td><td>30</td><td>0</td></tr>",
		"baseline 1.00ms, with timeouts 3.00ms (3.00×)", "baseline 0, with timeouts 12 (2.4/s, 0.04 per indeterminate outcome)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(page, "http://") && !strings.Contains(page, `xmlns="http://www.w3.org/2000/svg"`) || strings.Contains(page, "<script") {
		t.Error("the report should load nothing from anywhere")
	}
	// Each chart is well-formed XML.
	for _, svg := range strings.Split(page, "<svg")[1:] {
		svg = "<svg" + svg[:strings.Index(svg, "</svg>")] + "</svg>"
		var root struct{ XMLName xml.Name }
		if err := xml.Unmarshal([]byte(svg), &root); err != nil {
			t.Fatalf("malformed SVG: %v", err)
		}
	}
}

func TestTablesShowRatiosAndAdmission(t *testing.T) {
	var out bytes.Buffer
	results := sampleResults()
	WriteTable(&out, results)
	WriteComparison(&out, results)
	text := out.String()
	for _, want := range []string{"cycles 3000", "server 0.3s (0.30 cores, 100.0µs per cycle)", "first ÷ this", "3.00×", "2.00×", "130%", "40.0%", "reopen: 0.10s",
		"4 connections: official client, Sessions 4", "requests 6000",
		"per cycle: lockbench 0.50 reads, 1.00 writes, 0.20 context switches (4.00 requests per read); server 0.67 reads, 0.67 writes, 0.30 context switches (3.00 requests per read)",
		"note: server syscalls unknown: open /proc/8/io: permission denied",
		"req/read", "waiting callers", "client reconnects: baseline 0, with timeouts 12 (2.4/s, 0.04 per indeterminate outcome)"} {
		if !strings.Contains(text, want) {
			t.Errorf("the tables lack %q:\n%s", want, text)
		}
	}
}

// The comparison's cost table: the server's and lockbench's figures per
// cycle side by side, "–" where a server's counters are unknown.
func TestComparisonShowsCostPerCycle(t *testing.T) {
	var out bytes.Buffer
	WriteComparison(&out, sampleResults()[:2])
	lines := strings.Split(out.String(), "\n")
	row := func(kind string) []string {
		for _, l := range lines[slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "per cycle") }):] {
			if f := strings.Fields(l); len(f) > 0 && f[0] == kind {
				return f
			}
		}
		t.Fatalf("no %s row in:\n%s", kind, out.String())
		return nil
	}
	if got, want := row("lockd"), []string{"lockd", "100.0µs", "0.67", "0.67", "0.30", "3.00", "166.7µs", "0.50", "1.00", "0.20", "4.00"}; !slices.Equal(got, want) {
		t.Errorf("lockd: %q, want %q", got, want)
	}
	if got, want := row("redis"), []string{"redis", "–", "–", "–", "–", "–", "400.0µs", "0.10", "2.00", "0.05", "20.00"}; !slices.Equal(got, want) {
		t.Errorf("redis: %q, want %q", got, want)
	}
}
