package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// startServer runs an in-process lockd for one test.
func startServer(t *testing.T, maxInflight int) TargetSpec {
	t.Helper()
	srv, err := StartServer(maxInflight)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return TargetSpec{Scheme: SchemeLockd, Addr: srv.Addr()}
}

var testTargetOptions = TargetOptions{Conns: 2, Lease: 30 * time.Second}

// checkSane asserts what every run must show, whatever its speed.
func checkSane(t *testing.T, res *Result) {
	t.Helper()
	if err := Check([]*Result{res}); err != nil {
		t.Fatal(err)
	}
	a := res.Outcomes[Acquired.String()]
	if a.Count == 0 || a.P50 <= 0 {
		t.Fatalf("no acquire latencies: %+v", a)
	}
	if len(res.Timeline) == 0 {
		t.Fatal("empty timeline")
	}
}

// runChecked runs cfg through the official client against a fresh
// in-process server and fails the test unless Check passes the result.
func runChecked(t *testing.T, cfg Config) *Result {
	t.Helper()
	res, err := Run(context.Background(), startServer(t, 0), testTargetOptions, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check([]*Result{res}); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestWorkloadsAgainstAnInProcessServer(t *testing.T) {
	spec := startServer(t, 0)
	for _, tc := range []struct {
		name string
		raw  bool
		cfg  Config
	}{
		{name: "uncontended closed loop", cfg: Config{Workload: Uncontended, Callers: 8}},
		{name: "contended closed loop", cfg: Config{Workload: Contended, Callers: 8, Keys: 2}},
		{name: "uncontended open loop", cfg: Config{Workload: Uncontended, Callers: 8, Rate: 2000}},
		{name: "contended open loop", cfg: Config{Workload: Contended, Callers: 8, Rate: 1000, Keys: 1, Hold: 100 * time.Microsecond}},
		{name: "uncontended raw", raw: true, cfg: Config{Workload: Uncontended, Callers: 8}},
		{name: "contended raw", raw: true, cfg: Config{Workload: Contended, Callers: 8, Keys: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Duration = time.Second
			cfg.ServerPIDs = []int{os.Getpid()}
			opts := testTargetOptions
			opts.Raw = tc.raw
			res, err := Run(context.Background(), spec, opts, cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkSane(t, res)
			wantKind := SchemeLockd
			if tc.raw {
				wantKind = "lockd-raw"
			}
			if res.Kind != wantKind || res.Target != spec.String() || res.Conns < 1 || tc.raw && res.Conns != opts.Conns {
				t.Fatalf("result describes %s %s conns %d", res.Kind, res.Target, res.Conns)
			}
			// This process serves the in-process server: its counters are
			// the server's.
			if res.ServerCPUS <= 0 || res.ServerSyscr == 0 || res.ServerSyscw == 0 || res.ServerCtxsw == 0 ||
				res.BenchSyscr == 0 || res.BenchSyscw == 0 || res.BenchCtxsw == 0 || res.Requests < 2*res.Cycles {
				t.Fatalf("usage: %+v", res)
			}
			if released := res.Outcomes[Released.String()].Count + res.Outcomes[NotHeld.String()].Count; released != res.Cycles {
				t.Fatalf("%d cycles but %d release answers", res.Cycles, released)
			}
			if cfg.Rate > 0 {
				if res.Mode != "open" || res.SchedulerLag == nil {
					t.Fatalf("open loop reported as %q, lag %v", res.Mode, res.SchedulerLag)
				}
				// Arrivals are bounded by the schedule, whatever the server does.
				if limit := uint64(cfg.Rate*cfg.Duration.Seconds()) + 1; res.Cycles > limit {
					t.Fatalf("%d cycles from at most %d arrivals", res.Cycles, limit)
				}
			} else if res.Mode != "closed" || res.SchedulerLag != nil {
				t.Fatalf("closed loop reported as %q", res.Mode)
			}
		})
	}
}

func TestAdmissionWorkloadClosesAndReopensTheGate(t *testing.T) {
	const limit = 200
	spec := startServer(t, limit)
	cfg := Config{
		Workload: Admission,
		// Three phases of 1.5 s: unloaded, past the gate, back below it.
		Duration: 4500 * time.Millisecond,
		Callers:  8,
		Rate:     500,
		Admission: AdmissionConfig{
			Limit: limit,
			Wait:  time.Second,
			Loads: []float64{0, 1.3, 0.4},
		},
	}
	res, err := Run(context.Background(), spec, testTargetOptions, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkSane(t, res)
	a := res.Admission
	if a == nil || len(a.Phases) != 3 {
		t.Fatalf("admission result: %+v", a)
	}
	if a.Phases[0].BRate != 0 {
		t.Errorf("B answers with no pressure: B rate %v", a.Phases[0].BRate)
	}
	if a.Phases[1].BRate == 0 || a.Phases[1].Pressure[Busy.String()].Count == 0 {
		t.Errorf("the gate did not close at 130 %%: %+v", a.Phases[1])
	}
	if a.Phases[1].Pressure[TimedOut.String()].Count == 0 {
		t.Errorf("no pressure acquire queued until its wait ran out: %+v", a.Phases[1].Pressure)
	}
	if a.ReopenS < 0 || a.ReopenS > a.Phases[2].EndS-a.Phases[2].StartS {
		t.Errorf("reopen time %v s", a.ReopenS)
	}
	if a.Latency.UnloadedAcquiredP99 <= 0 || a.Latency.LoadedAcquiredP99 <= 0 || a.Latency.BusyP99 <= 0 ||
		a.Service.BusyP99 <= 0 || a.Service.BusyP99 > a.Latency.BusyP99 {
		t.Errorf("missing admission latencies: %+v", a)
	}
	if a.Phases[0].Probe[Acquired.String()].Count == 0 || a.Phases[2].Probe[Acquired.String()].Count == 0 {
		t.Errorf("probes were not admitted outside the loaded phase")
	}
}

func TestRunRefusesBadConfigs(t *testing.T) {
	spec := TargetSpec{Scheme: SchemeLockd, Addr: "127.0.0.1:1"}
	for _, tc := range []struct {
		spec TargetSpec
		cfg  Config
		want string
	}{
		{spec, Config{Workload: "bogus", Duration: time.Second}, "unknown workload"},
		{spec, Config{Workload: Uncontended}, "duration"},
		{spec, Config{Workload: Admission, Duration: 2 * time.Second}, "--duration ≥ 6s"},
		{spec, Config{Workload: Admission, Duration: time.Minute, Admission: AdmissionConfig{Loads: []float64{0.5, -1}}}, "load -1"},
		{TargetSpec{Scheme: SchemeRedis, Addr: "127.0.0.1:1"}, Config{Workload: Admission, Duration: time.Minute}, "no admission gate"},
	} {
		_, err := Run(context.Background(), tc.spec, testTargetOptions, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]TargetSpec{
		"lockd://127.0.0.1:7420":   {SchemeLockd, "127.0.0.1:7420"},
		"127.0.0.1:7420":           {SchemeLockd, "127.0.0.1:7420"},
		"redis://127.0.0.1:6379":   {SchemeRedis, "127.0.0.1:6379"},
		"goredis://127.0.0.1:6379": {SchemeGoRedis, "127.0.0.1:6379"},
		"etcd://localhost:2379":    {SchemeEtcd, "localhost:2379"},
	} {
		if got, err := ParseTarget(in); err != nil || got != want {
			t.Errorf("ParseTarget(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"http://127.0.0.1:80", "lockd://nohost", ""} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) accepted", bad)
		}
	}
}

func TestReopenTime(t *testing.T) {
	steps := make([][numOutcomes]uint64, 100) // one second in 10 ms steps
	drop := 500 * time.Millisecond
	for i := 40; i < 62; i++ {
		steps[i][Busy] = 3
	}
	for i := range steps {
		steps[i][Acquired] = 1
	}
	// The last B is in step 61; the first grant after it in step 62.
	if got := reopenTime(steps, drop, time.Second); got < 0.119 || got > 0.121 {
		t.Fatalf("reopen %v s, want 0.12", got)
	}
	open := make([][numOutcomes]uint64, 100)
	if got := reopenTime(open, drop, time.Second); got != 0 {
		t.Fatalf("no B after the drop: reopen %v, want 0", got)
	}
	stuck := make([][numOutcomes]uint64, 100)
	for i := range stuck {
		stuck[i][Busy] = 1
	}
	if got := reopenTime(stuck, drop, time.Second); got != -1 {
		t.Fatalf("B to the end: reopen %v, want -1", got)
	}
}

func TestTimelineSumsStepsAndTrimsTheTail(t *testing.T) {
	steps := make([][numOutcomes]uint64, 50)
	for i := range 25 {
		steps[i][Acquired] = 1
		if i >= 10 {
			steps[i][Busy] = 1
		}
	}
	points := timeline(steps)
	if len(points) != 3 {
		t.Fatalf("%d points, want 3 (250 ms of answers in 100 ms steps)", len(points))
	}
	if points[0].Counts["A"] != 10 || points[0].BRate != 0 || points[1].BRate != 0.5 || points[2].Counts["A"] != 5 {
		t.Fatalf("points: %+v", points)
	}
	if points[1].T != 0.1 {
		t.Fatalf("second point at %v s", points[1].T)
	}
}

func TestCheckFlagsInsaneResults(t *testing.T) {
	good := &Result{Cycles: 10, CyclesPerS: 5, Outcomes: map[string]Percentiles{"A": {Count: 10, P50: 1, P90: 2, P99: 3, P999: 4, Max: 5}}}
	if err := Check([]*Result{good}); err != nil {
		t.Fatal(err)
	}
	if Check(nil) == nil {
		t.Fatal("no results passed the check")
	}
	for name, bad := range map[string]*Result{
		"no cycles":         {Outcomes: good.Outcomes},
		"errors":            {Cycles: 1, CyclesPerS: 1, Errors: 2, Outcomes: good.Outcomes},
		"disordered":        {Cycles: 1, CyclesPerS: 1, Outcomes: map[string]Percentiles{"R": {Count: 1, P50: 9, P90: 2, P99: 3, P999: 4, Max: 5}}},
		"gate never closed": {Cycles: 1, CyclesPerS: 1, Outcomes: good.Outcomes, Admission: &AdmissionResult{}},
	} {
		if Check([]*Result{good, bad}) == nil {
			t.Errorf("%s passed the check", name)
		}
	}
}
