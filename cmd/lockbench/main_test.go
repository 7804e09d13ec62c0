package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockd/lockd/bench"
	"github.com/lockd/lockd/server/servertest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, servertest.IgnoreGnetWorkers()...)
}

func runCommand(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// The CI smoke, shortened: every lockd-only workload against an
// in-process server, with the JSON file, the report and the check.
func TestSmokeAgainstAnInProcessServer(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "out.json")
	stdout, stderr, err := runCommand(t, "--target", "inproc", "--workload", "uncontended,contended",
		"--duration", "1s", "--progress", "200ms", "--callers", "4", "--json", jsonPath, "--report", dir, "--check")
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	for _, want := range []string{"uncontended  closed loop  callers 4", "contended  closed loop", "check passed (2 runs)", bench.ReportFile} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "cycles") {
		t.Errorf("no progress line on stderr:\n%s", stderr)
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 2 || rep.CyclesPerS <= 0 || rep.CyclesPerS != rep.Runs[0].CyclesPerS {
		t.Fatalf("report: %d runs, cycles_per_s %v", len(rep.Runs), rep.CyclesPerS)
	}
	if rep.Runs[0].Target != "inproc" {
		t.Fatalf("target label %q", rep.Runs[0].Target)
	}
	if _, err := os.Stat(filepath.Join(dir, bench.ReportFile)); err != nil {
		t.Fatal(err)
	}
}

// --server-pids with this process's own pid: the in-process server's
// usage reaches the table and the JSON file.
func TestServerUsageInTheJSON(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "out.json")
	stdout, stderr, err := runCommand(t, "--target", "inproc", "--server-pids", fmt.Sprint(os.Getpid()), "--workload", "uncontended",
		"--duration", "1s", "--progress", "0", "--callers", "4", "--json", jsonPath, "--check")
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	if !strings.Contains(stdout, "context switches (") || !strings.Contains(stdout, "; server ") {
		t.Errorf("no usage per cycle in the table:\n%s", stdout)
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Runs []map[string]any }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	run := doc.Runs[0]
	for _, field := range []string{"cycles", "cycles_per_s", "server_cpu_s", "server_syscr", "server_syscw", "server_ctxsw", "bench_syscr", "bench_syscw", "bench_ctxsw", "requests"} {
		if v, ok := run[field].(float64); !ok || v <= 0 {
			t.Errorf("%s = %#v", field, run[field])
		}
	}
	if _, ok := run["target"].(string); !ok {
		t.Errorf("target = %#v", run["target"])
	}
}

// The timeouts workload runs against every target; with the lockd client
// it reports outcomes by kind and reconnects.
func TestTimeoutsWorkload(t *testing.T) {
	stdout, stderr, err := runCommand(t, "--target", "inproc", "--workload", "timeouts", "--callers", "16", "--hold", "200ms",
		"--rate", "200", "--duration", "4s", "--progress", "0", "--check")
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	for _, want := range []string{"timeouts  open loop  callers 16  rate 200/s", "own indeterminate (W)", "client reconnects: baseline", "check passed (1 runs)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

// The keepalive workload through the lockd client: renewals beside the
// probes, their latencies and their cost per renewal in the table.
func TestKeepaliveWorkload(t *testing.T) {
	stdout, stderr, err := runCommand(t, "--target", "inproc", "--workload", "keepalive", "--callers", "8", "--rate", "200",
		"--keepalive-holders", "16", "--keepalive-every", "50ms", "--duration", "2s", "--progress", "0", "--check")
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	for _, want := range []string{"keepalive  open loop  callers 8  rate 200/s", "then also 16 holders renewing every 50.00ms",
		"probe A p99: baseline", "per renewal", "check passed (1 runs)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

func TestKeepaliveSkipsTargetsThatCannotRenew(t *testing.T) {
	for _, args := range [][]string{
		{"--target", "redis://127.0.0.1:1"},
		{"--target", "lockd://127.0.0.1:1", "--raw"},
	} {
		stdout, stderr, err := runCommand(t, append(args, "--workload", "keepalive", "--duration", "2s", "--progress", "0")...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stderr, "skipping keepalive against") || strings.Contains(stdout, "cycles") {
			t.Fatalf("%q: stdout:\n%s\nstderr:\n%s", args, stdout, stderr)
		}
	}
}

func TestAdmissionSkipsTargetsWithoutAGate(t *testing.T) {
	stdout, stderr, err := runCommand(t, "--target", "redis://127.0.0.1:1", "--workload", "admission", "--duration", "6s", "--progress", "0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "skipping admission against redis://127.0.0.1:1") || strings.Contains(stdout, "cycles") {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--target", "http://127.0.0.1:80"},
		{"--target", "rueidis://127.0.0.1:80"},
		{"--callers", "many"},
		{"--rate", ""},
		{"--admission-loads", "0,x"},
		{"--target", "inproc,redis://127.0.0.1:1", "--server-pids", "1"},
		{"--target", "inproc,redis://127.0.0.1:1", "--server-pids", "1+,2"},
		{"--target", "inproc,redis://127.0.0.1:1", "--server-pids", "a+1,2"},
		{"--target", "inproc,redis://127.0.0.1:1", "--server-pids", "1+2+3"},
		{"--target", "inproc,redis://127.0.0.1:1", "--server-pids", "1,0+2"},
		{"extra"},
		{"--repeat", "0"},
		{"--max-regression", "ten"},
		{"--max-regression", "-5%"},
		{"--alpha", "1"},
		{"--duration", "soon"},
	} {
		_, _, err := runCommand(t, args...)
		if !errors.As(err, new(usageError)) {
			t.Errorf("%q: error %v, want a usage error", args, err)
		}
	}
	if _, _, err := runCommand(t, "--help"); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	if _, _, err := runCommand(t, "--workload", "bogus", "--target", "inproc", "--duration", "1s"); err == nil || !strings.Contains(err.Error(), "unknown workload") {
		t.Errorf("unknown workload: %v", err)
	}
}

func TestSecretFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(path, []byte("00ff10\n"), 0o600)
	o, err := parseFlags([]string{"--secret-file", path, "--tenant", "t1"}, new(bytes.Buffer))
	if err != nil || !bytes.Equal(o.target.Secret, []byte{0, 0xff, 0x10}) || o.target.Tenant != "t1" {
		t.Fatalf("%v %+v", err, o)
	}
	os.WriteFile(path, []byte("not hex"), 0o600)
	if _, err := parseFlags([]string{"--secret-file", path}, new(bytes.Buffer)); err == nil {
		t.Fatal("a secret that is not hex was accepted")
	}
}

func TestAllWorkloads(t *testing.T) {
	o, err := parseFlags([]string{"--workload", "all", "--callers", "16,64", "--rate", "0,1000"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.workloads, ",") != "uncontended,contended,admission,timeouts,keepalive" || len(o.callers) != 2 || len(o.rates) != 2 {
		t.Fatalf("%+v", o)
	}
}

func TestServerPIDGroups(t *testing.T) {
	o, err := parseFlags([]string{"--target", "lockd://127.0.0.1:1,etcd://127.0.0.1:2,redis://127.0.0.1:3", "--server-pids", "1+2, 3 ,0"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(o.serverPIDs) != "[[1 2] [3] []]" || o.serverPIDs[2] != nil {
		t.Fatalf("server pids %v", o.serverPIDs)
	}
	for _, pids := range []string{"1+,2", "a+1,2", "+1,2", "1++2,3", "-1,2"} {
		_, err := parseFlags([]string{"--target", "lockd://127.0.0.1:1,etcd://127.0.0.1:2", "--server-pids", pids}, new(bytes.Buffer))
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "--server-pids") {
			t.Errorf("%q: error %v, want a --server-pids usage error", pids, err)
		}
	}
	_, err = parseFlags([]string{"--target", "lockd://127.0.0.1:1", "--server-pids", "1+2,3"}, new(bytes.Buffer))
	if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "2 entries for 1 targets") {
		t.Errorf("two entries for one target: %v", err)
	}
}

// The baseline gate end to end: a saved baseline is a plain lockbench JSON
// with every sample; against a baseline far faster than this build the
// gate fails with its own error (exit status 3), against one far slower
// it passes. The statistics are bench's tests'; the injected slowdown is
// in bench's TestGateFlagsAnInjectedSlowdownAndNotTheSameBuild. α 0.02
// lets one sample of the five lack an A (a run starved of every cycle on
// a loaded machine) and still reach p = 0.016.
func TestBaselineGate(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.json")
	args := []string{"--target", "inproc", "--workload", "uncontended", "--callers", "2", "--duration", "400ms", "--repeat", "5", "--progress", "0"}
	stdout, stderr, err := runCommand(t, append(args, "--save-baseline", base)...)
	if err != nil || !strings.Contains(stdout, "baseline saved: "+base+" (5 runs)") || !strings.Contains(stdout, "sample 5") {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	saved, err := bench.ReadReport(base)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range saved.Runs {
		if r.Sample != i+1 || r.Target != "inproc" || r.CyclesPerS <= 0 {
			t.Fatalf("run %d: sample %d, target %q, %v cycles/s", i, r.Sample, r.Target, r.CyclesPerS)
		}
	}
	// scaled writes the saved baseline with its throughput and tail
	// latency scaled by f.
	scaled := func(name string, f float64) string {
		rep, _ := bench.ReadReport(base)
		for _, r := range rep.Runs {
			r.CyclesPerS *= f
			a := r.Outcomes[bench.Acquired.String()]
			a.P99 /= f
			r.Outcomes[bench.Acquired.String()] = a
		}
		path := filepath.Join(dir, name)
		if err := rep.WriteJSON(path); err != nil {
			t.Fatal(err)
		}
		return path
	}

	jsonPath := filepath.Join(dir, "gated.json")
	stdout, stderr, err = runCommand(t, append(args, "--baseline", scaled("faster.json", 100), "--json", jsonPath)...)
	if !errors.As(err, new(regressionError)) || !strings.Contains(err.Error(), "2 figure(s) regressed") {
		t.Fatalf("against a faster baseline: %v, want a regression\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	for _, want := range []string{"inproc (lockd)  uncontended  closed loop  callers 2", "cycles/s", "A p99", "p < 0.05", "REGRESSED", "0.008", "baseline gate FAILED"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	gated, err := bench.ReadReport(jsonPath)
	if err != nil || gated.Gate == nil || len(gated.Gate.Regressions()) != 2 || gated.Gate.Config.MaxRegression != 0.10 {
		t.Fatalf("the JSON's gate: %v %+v", err, gated.Gate)
	}
	stdout, stderr, err = runCommand(t, append(args, "--baseline", scaled("slower.json", 0.01), "--max-regression", "5%", "--alpha", "0.02")...)
	if err != nil || !strings.Contains(stdout, "better") || !strings.Contains(stdout, "baseline gate passed (2 comparisons)") ||
		!strings.Contains(stdout, "worse by more than 5 % and p < 0.02") {
		t.Fatalf("against a slower baseline: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	args[5] = "3" // callers: a configuration the baseline lacks
	args[9] = "1" // repeat
	_, _, err = runCommand(t, append(args, "--baseline", base)...)
	if err == nil || errors.As(err, new(regressionError)) || !strings.Contains(err.Error(), "nothing compared") {
		t.Fatalf("a run the baseline has nothing of: %v", err)
	}
	if _, _, err := runCommand(t, "--baseline", filepath.Join(dir, "none.json")); err == nil || !strings.Contains(err.Error(), "--baseline") {
		t.Fatalf("a missing baseline: %v", err)
	}
}

// --repeat runs round by round, each round starting at another target.
func TestRepeatInterleavesTargets(t *testing.T) {
	srv, err := bench.StartServer(0)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	other := "lockd://" + srv.Addr()
	jsonPath := filepath.Join(t.TempDir(), "out.json")
	stdout, stderr, err := runCommand(t, "--target", "inproc,"+other, "--workload", "uncontended", "--callers", "1", "--duration", "100ms",
		"--repeat", "3", "--progress", "0", "--json", jsonPath)
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	rep, err := bench.ReadReport(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, r := range rep.Runs {
		order = append(order, fmt.Sprintf("%d %s", r.Sample, r.Target))
	}
	want := []string{"1 inproc", "1 " + other, "2 " + other, "2 inproc", "3 inproc", "3 " + other}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("runs %q, want %q", order, want)
	}
}
