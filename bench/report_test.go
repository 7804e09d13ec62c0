package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
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
	return []*Result{
		{Target: "lockd://127.0.0.1:1", Kind: "lockd", Workload: Uncontended, Mode: "closed", Callers: 64, Conns: 4, DurationS: 1, Cycles: 3000, CyclesPerS: 3000, BenchCPUS: 0.5, ServerCPUS: 0.3, Outcomes: outcomes(1), Timeline: timeline},
		{Target: "redis://127.0.0.1:2", Kind: "redis", Workload: Uncontended, Mode: "closed", Callers: 64, Conns: 4, DurationS: 1, Cycles: 1000, CyclesPerS: 1000, Outcomes: outcomes(2), Timeline: timeline},
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
	if !ok || len(runs) != 3 {
		t.Fatalf("runs: %#v", doc["runs"])
	}
	admission := runs[2].(map[string]any)["admission"].(map[string]any)
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
	for _, want := range []string{"<svg", "Latency against offered load", "B rate across the gate", "gate closes (90 %)", "redis p99", "3.00×"} {
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
	for _, want := range []string{"cycles 3000", "server 0.3s (0.30 cores, 100.0µs per cycle)", "first ÷ this", "3.00×", "2.00×", "130%", "40.0%", "reopen: 0.10s"} {
		if !strings.Contains(text, want) {
			t.Errorf("the tables lack %q:\n%s", want, text)
		}
	}
}
