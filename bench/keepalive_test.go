package bench

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// The keepalive workload against lockd through the client: the renewals
// come at the holders' fixed rate in the second half only, every one is
// confirmed, the probes run in both halves, and the cost per renewal is
// reported, the server's too since this process is the server.
func TestKeepaliveWorkloadThroughTheClient(t *testing.T) {
	res := runChecked(t, Config{Workload: Keepalive, Callers: 8, Rate: 500, Duration: 2 * time.Second,
		Keepalive: KeepaliveConfig{Holders: 16, Every: 50 * time.Millisecond}, ServerPIDs: []int{os.Getpid()}})
	k := res.Keepalive
	if k == nil || k.Holders != 16 || k.EveryS != 0.05 || k.LoadedStartS != 1 {
		t.Fatalf("keepalive result: %+v", k)
	}
	// 16 holders renewing every 50 ms for 1 s: 320 renewals, fewer if
	// some fell behind, never more.
	renewed := k.Renewals[Acquired.String()].Count
	if renewed == 0 || renewed > 16*20 || k.Errors != 0 {
		t.Fatalf("%d renewals confirmed (%d errors: %s), want 1..320", renewed, k.Errors, k.FirstError)
	}
	if k.RenewalsPerS != float64(renewed) {
		t.Fatalf("renewals per second %v for %d renewals in 1 s", k.RenewalsPerS, renewed)
	}
	if p := k.Renewals[Acquired.String()]; !(p.P50 > 0 && p.P50 <= p.P99) {
		t.Fatalf("renewal latencies %+v", p)
	}
	if k.Latency.BaselineP99 <= 0 || k.Latency.LoadedP99 <= 0 {
		t.Fatalf("probe p99 %+v", k.Latency)
	}
	c := k.PerRenewal
	if c == nil || c.ServerCPUUS == nil || c.ServerSyscall == nil || c.ServerCtxsw == nil {
		t.Fatalf("cost per renewal %+v", c)
	}
	if k.Loaded.ServerCPUS <= 0 || k.Baseline.ServerCPUS <= 0 || k.Loaded.BenchCPUS <= 0 {
		t.Fatalf("halves' usage: baseline %+v loaded %+v", k.Baseline, k.Loaded)
	}
	// Renewals are not lock cycles: the cycles are the probes' alone.
	if released := res.Outcomes[Released.String()].Count; released != res.Cycles {
		t.Fatalf("%d cycles but %d releases", res.Cycles, released)
	}
	var out bytes.Buffer
	WriteTable(&out, []*Result{res})
	for _, want := range []string{"keepalive  open loop  callers 8  rate 500/s", "then also 16 holders renewing every 50.00ms", "per renewal", "server syscalls"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, out.String())
		}
	}
}

// The HTML report has a keepalive section with the cost per renewal, and
// leaves the run out of the latency-against-load charts.
func TestKeepaliveInTheHTMLReport(t *testing.T) {
	cpu, calls := 18.8, 0.74
	res := &Result{Target: "lockd://127.0.0.1:1", Kind: "lockd", Workload: Keepalive, Mode: "open", Rate: 1000, Callers: 16,
		Cycles: 10, CyclesPerS: 1, Outcomes: map[string]Percentiles{"A": {Count: 10, P50: 1, P90: 2, P99: 3, P999: 4, Max: 5}},
		Keepalive: &KeepaliveResult{Holders: 64, EveryS: 0.1, LoadedStartS: 5, RenewalsPerS: 639,
			Renewals:   map[string]Percentiles{"A": {Count: 3196, P50: 549, P90: 1180, P99: 2520, P999: 4000, Max: 4330}},
			Latency:    ProbeP99{BaselineP99: 3230, LoadedP99: 2540, Ratio: 2540.0 / 3230},
			PerRenewal: &RenewalCost{BenchCPUUS: 55.5, ServerCPUUS: &cpu, ServerSyscall: &calls}}}
	path, err := NewReport("lockbench --test", time.Now(), []*Result{res}).WriteHTML(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	for _, want := range []string{"Keepalive: lockd://127.0.0.1:1 (lockd)", "then also 64 holders renewing every 100.00ms (639 renewals/s)",
		"<td>3196</td>", "<td>55.5µs</td><td>18.8µs</td><td>0.74</td><td>–</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(page, "Latency against offered load") {
		t.Error("a keepalive run was drawn among the load charts")
	}
}

func TestKeepaliveRefusesWhatCannotRenew(t *testing.T) {
	spec := TargetSpec{Scheme: SchemeLockd, Addr: "127.0.0.1:1"}
	cfg := Config{Workload: Keepalive, Duration: time.Second}
	raw := testTargetOptions
	raw.Raw = true
	for _, tc := range []struct {
		spec TargetSpec
		opts TargetOptions
		cfg  Config
		want string
	}{
		{TargetSpec{Scheme: SchemeRedis, Addr: "127.0.0.1:1"}, testTargetOptions, cfg, "renews no lease"},
		{spec, raw, cfg, "renews no lease"},
		{spec, TargetOptions{Lease: time.Second}, Config{Workload: Keepalive, Duration: time.Second, Keepalive: KeepaliveConfig{Every: time.Second}}, "at least twice"},
	} {
		if _, err := Run(context.Background(), tc.spec, tc.opts, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v %+v: error %v, want one containing %q", tc.spec, tc.cfg, err, tc.want)
		}
	}
}
