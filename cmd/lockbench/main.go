// Command lockbench is lockd's benchmark harness: it runs the workloads of
// package bench against lockd (and, in the same command, against Redis
// through rueidis and through go-redis, and etcd), prints per-outcome
// latency percentiles, lock cycles per second and what the processes spent
// per cycle side by side, and writes a JSON file for CI and an HTML report.
// It owns flags and output only; the measuring is bench's.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockd/lockd/bench"
	"github.com/lockd/lockd/cmd/internal/tlsflags"
	"github.com/lockd/lockd/internal/privatefile"
)

const usage = `usage: lockbench [flags]

Runs each --workload against each --target, for each --callers and --rate
value, and prints the results side by side.

  lockbench --target lockd://127.0.0.1:7420 --workload uncontended
  lockbench --target lockd://127.0.0.1:7420,redis://127.0.0.1:6379,goredis://127.0.0.1:6379,etcd://127.0.0.1:2379 \
            --server-pids 101,202,202,303 --workload uncontended,contended --callers 64,256 --json out.json --report out/
  lockbench --target inproc --workload admission --duration 20s
  lockbench --target lockd://127.0.0.1:7420 --workload timeouts

Targets: lockd://H:P through the official client (--raw: bare frames),
redis://H:P through rueidis with auto-pipelining, goredis://H:P through
go-redis's connection pool, etcd://H:P through concurrency.Mutex.
--target inproc starts a lockd in this process for each run (with
--admission-limit as its in-flight limit for the admission workload).

Workloads: uncontended (wait 0 on random keys), contended (hot keys,
--wait 5s), admission (lockd only: fill the in-flight gate, probe it),
timeouts (--callers callers queue for --keys 1 hot key, holding it --hold
50ms, with --wait 1s, so most waits run out, while uncontended probes at
--rate 1000/s share the client; --rounds windows of probes alone, their
baseline, alternate with as many windows of waiting callers (1: two
halves); outcomes by kind: A, T, W own indeterminate, I collateral, and
the client's reconnects), keepalive (lockd client only: uncontended probes
at --rate 1000/s throughout; in the second half --keepalive-holders 64
callers, each holding a lock, also renew it every --keepalive-every 100ms
through Ticket.Renew; reports the renewals' latencies and what each
renewal cost in CPU time, syscalls and context switches, as the second
half's usage over the first's), failover (starts a 3-node --cluster
lockd or etcd itself, ignoring --target; 24 callers, each with a client
of its own given all three nodes, cycle over --keys 8 keys with --lease
30s, --wait 5s, --hold 5ms; at 8 s --fault hits the --victim; reports how
long a key went without a grant from the fault, grants/s after ÷ before,
and outcomes by kind; --duration 30s unless given).

With --server-pids, each run reports the server's CPU time, read and write
syscalls and context switches per cycle beside lockbench's own.

Baseline gate: --repeat N runs every configuration N times, the targets
interleaved, each round in another order. --save-baseline FILE writes the
runs (every sample) as JSON once they pass --check's tests; a later
--baseline FILE compares this build's runs with them, per target,
workload, callers and rate, on cycles/s, A p99 and server CPU per cycle
(with --server-pids): a figure regressed when its median is worse by more
than --max-regression and a two-sided Mann-Whitney U test over all the
samples of both sides gives p < --alpha.

  lockbench --target inproc --repeat 8 --save-baseline base.json   # on main
  lockbench --target inproc --repeat 8 --baseline base.json        # on a change

Exit status: 0 done (and passed the check and the gate when asked), 1 an
error or a failed --check, 2 bad flags, 3 the baseline gate found a
regression.

`

// inprocTarget is the --target value that starts an in-process lockd.
const inprocTarget = "inproc"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(2)
	case errors.As(err, new(regressionError)):
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(3)
	case err != nil:
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(1)
	}
}

type usageError struct{ error }

// regressionError is the baseline gate's failure: its own exit status, so
// that CI tells a slower build from a broken run.
type regressionError struct{ error }

// options are the parsed flags.
type options struct {
	targets    []string
	serverPIDs [][]int // by target, its server's processes; nil when unknown
	workloads  []string
	callers    []int
	rates      []float64
	duration   time.Duration
	keys       int
	wait       time.Duration
	hold       time.Duration
	rounds     int
	target     bench.TargetOptions
	admission  bench.AdmissionConfig
	keepalive  bench.KeepaliveConfig
	failover   failoverOptions
	jsonPath   string
	reportDir  string
	progress   time.Duration
	check      bool
	repeat     int
	baseline   string
	saveTo     string
	gate       bench.GateConfig
	secretFile string
	tls        tlsflags.Flags
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	targets := fs.String("target", "lockd://127.0.0.1:7420", "comma-separated targets: lockd://HOST:PORT, redis://HOST:PORT (rueidis), goredis://HOST:PORT (go-redis), etcd://HOST:PORT, or inproc")
	workloads := fs.String("workload", bench.Uncontended, "comma-separated workloads: "+strings.Join(bench.Workloads, ", ")+", failover, or all (failover not included)")
	callers := fs.String("callers", "64", "comma-separated numbers of concurrent callers (open loop: the most cycles in flight)")
	rates := fs.String("rate", "0", fmt.Sprintf("comma-separated arrival rates per second for open loop; 0 runs closed loop (admission, timeouts and keepalive: their probes' rate, 0 meaning %d)", bench.DefaultProbeRate))
	pids := fs.String("server-pids", "", "comma-separated pids of the targets' server processes, in --target order (0: unknown), to report their CPU time, read/write syscalls and context switches per lock cycle (syscalls need the server's user or root); a target served by several processes, such as a cluster's nodes, takes their pids joined by '+' (101+102+103) and reports the sum")
	loads := fs.String("admission-loads", joinFloats(bench.DefaultAdmissionLoads), "admission phases' offered load, as fractions of --admission-limit")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each run")
	fs.IntVar(&o.target.Conns, "conns", 0, "connections per target: lockd client Sessions, --raw connections, rueidis pipelined connections (a power of two), go-redis PoolSize, etcd clients (0: each library's default; 4 for --raw and etcd)")
	fs.IntVar(&o.keys, "keys", 0, fmt.Sprintf("key space (0: %d for uncontended and the admission probes, %d hot keys for contended, %d hot key for timeouts, whose probes draw from %[1]d)", bench.DefaultUncontendedKeys, bench.DefaultContendedKeys, bench.DefaultTimeoutsKeys))
	fs.DurationVar(&o.wait, "wait", 0, fmt.Sprintf("how long a contended or timeouts acquire may wait (0: %v contended, %v timeouts)", bench.DefaultWait, bench.DefaultTimeoutsWait))
	fs.DurationVar(&o.hold, "hold", 0, fmt.Sprintf("time a lock is held before its release (timeouts: the waiting callers' hold, 0 meaning %v)", bench.DefaultTimeoutsHold))
	fs.IntVar(&o.rounds, "rounds", 1, "timeouts: windows of probes alone alternating with as many windows of waiting callers (1: two halves); --duration must be at least 4 × --wait per round")
	fs.DurationVar(&o.target.Lease, "lease", 30*time.Second, "lease of every lock")
	fs.BoolVar(&o.target.Raw, "raw", false, "drive lockd with bare protocol frames instead of the official client")
	fs.StringVar(&o.target.Tenant, "tenant", "", "lockd tenant, with --secret-file when the server requires auth")
	fs.StringVar(&o.secretFile, "secret-file", "", "file holding the tenant's secret in hex")
	o.tls.Register(fs)
	fs.DurationVar(&o.target.RedisRetry, "redis-retry", time.Millisecond, "mean pause between a waiting Redis caller's SET NX attempts")
	fs.IntVar(&o.admission.Limit, "admission-limit", bench.DefaultAdmissionLimit, "the server's in-flight limit (lockd --max-inflight) for the admission workload")
	fs.DurationVar(&o.admission.Wait, "admission-wait", bench.DefaultAdmissionWait, "wait of the admission pressure acquires (whole seconds)")
	fs.IntVar(&o.keepalive.Holders, "keepalive-holders", bench.DefaultKeepaliveHolders, "callers holding a lock and renewing it in the keepalive workload")
	fs.DurationVar(&o.keepalive.Every, "keepalive-every", bench.DefaultKeepaliveEvery, "how often each keepalive holder renews its lease (at most half of --lease)")
	fs.StringVar(&o.jsonPath, "json", "", "write the results as JSON to this file")
	fs.StringVar(&o.reportDir, "report", "", "write an HTML report with charts into this directory")
	fs.DurationVar(&o.progress, "progress", time.Second, "interval of the progress line on stderr; 0 for none")
	fs.BoolVar(&o.check, "check", false, "exit non-zero unless every run is sane: cycles done, no errors, no indeterminate outcome (timeouts: some wait ran out instead), percentiles in order (never a speed threshold)")
	failoverParsed := o.failover.register(fs)
	fs.IntVar(&o.repeat, "repeat", 1, "run every configuration this many times, the targets interleaved, each round in another order (the baseline gate needs 5 or more)")
	fs.StringVar(&o.saveTo, "save-baseline", "", "write the runs as JSON to this file, for a later --baseline, once they pass --check's tests")
	fs.StringVar(&o.baseline, "baseline", "", "compare the runs with those of this lockbench JSON file and exit 3 on a regression")
	o.gate = bench.GateConfig{MaxRegression: bench.DefaultMaxRegression, Alpha: bench.DefaultAlpha}
	fs.Func("max-regression", fmt.Sprintf("how much worse, in percent, a median may be before the baseline gate can flag it (default %g%%)", 100*bench.DefaultMaxRegression), func(s string) error {
		pct, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
		if err != nil || !(pct >= 0 && pct < 1000) {
			return fmt.Errorf("%q is not a percentage between 0 and 1000", s)
		}
		o.gate.MaxRegression = pct / 100
		return nil
	})
	fs.Float64Var(&o.gate.Alpha, "alpha", bench.DefaultAlpha, "significance level of the baseline gate's test: a worse median counts only when p is below it")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if err := failoverParsed(); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	if o.repeat < 1 {
		return nil, usageError{fmt.Errorf("--repeat %d: at least 1", o.repeat)}
	}
	if !(o.gate.Alpha > 0 && o.gate.Alpha < 1) {
		return nil, usageError{fmt.Errorf("--alpha %v: a probability between 0 and 1", o.gate.Alpha)}
	}
	var err error
	o.targets = splitList(*targets)
	o.workloads = splitList(*workloads)
	if len(o.workloads) == 1 && o.workloads[0] == "all" {
		o.workloads = bench.Workloads
	}
	for _, w := range o.workloads {
		if !slices.Contains(bench.Workloads, w) && w != bench.Failover {
			return nil, usageError{fmt.Errorf("unknown workload %q (want one of %s, %s, or all)", w, strings.Join(bench.Workloads, ", "), bench.Failover)}
		}
	}
	if o.callers, err = parseList(*callers, strconv.Atoi); err != nil {
		return nil, usageError{fmt.Errorf("--callers: %w", err)}
	}
	if o.rates, err = parseList(*rates, parseFloat); err != nil {
		return nil, usageError{fmt.Errorf("--rate: %w", err)}
	}
	if o.admission.Loads, err = parseList(*loads, parseFloat); err != nil {
		return nil, usageError{fmt.Errorf("--admission-loads: %w", err)}
	}
	if *pids != "" {
		if o.serverPIDs, err = parseList(*pids, parsePIDGroup); err != nil {
			return nil, usageError{fmt.Errorf("--server-pids: %w", err)}
		}
		if len(o.serverPIDs) != len(o.targets) {
			return nil, usageError{fmt.Errorf("--server-pids has %d entries for %d targets", len(o.serverPIDs), len(o.targets))}
		}
	}
	for _, t := range o.targets {
		if t == inprocTarget {
			continue
		}
		if _, err := bench.ParseTarget(t); err != nil {
			return nil, usageError{err}
		}
	}
	if o.target.TLS, err = o.tls.Config(); err != nil {
		return nil, err
	}
	if o.secretFile != "" {
		data, err := privatefile.ReadFile(o.secretFile)
		if err != nil {
			return nil, fmt.Errorf("--secret-file: %w", err)
		}
		if o.target.Secret, err = hex.DecodeString(strings.TrimSpace(string(data))); err != nil {
			return nil, fmt.Errorf("--secret-file: %w", err)
		}
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range splitList(s) {
		v, err := parse(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// parsePIDGroup parses one target's --server-pids entry: a pid, several
// joined by '+', or 0 for unknown (nil).
func parsePIDGroup(s string) ([]int, error) {
	parts := strings.Split(s, "+")
	pids := make([]int, len(parts))
	for i, p := range parts {
		pid, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || pid < 0 || pid == 0 && len(parts) > 1 {
			return nil, fmt.Errorf("%q is not a pid, pids joined by '+', or 0", s)
		}
		pids[i] = pid
	}
	if len(pids) == 1 && pids[0] == 0 {
		return nil, nil
	}
	return pids, nil
}

func parseFloat(s string) (float64, error) { return strconv.ParseFloat(s, 64) }

func joinFloats(fs []float64) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var baseline *bench.Report
	if o.baseline != "" {
		if baseline, err = bench.ReadReport(o.baseline); err != nil {
			return fmt.Errorf("--baseline: %w", err)
		}
	}
	started := time.Now()
	var results []*bench.Result
	// Round by round, so that a machine whose speed drifts weighs on every
	// configuration's samples alike; each round starts at another target,
	// so that none always runs first.
	for round := range o.repeat {
		for _, workload := range o.workloads {
			if workload == bench.Failover {
				res, err := runFailovers(ctx, o, stderr)
				if err != nil {
					return err
				}
				results = append(results, res...)
				continue
			}
			for _, callers := range o.callers {
				for _, rate := range o.rates {
					for j := range o.targets {
						i := (round + j) % len(o.targets)
						target := o.targets[i]
						if ctx.Err() != nil {
							return ctx.Err()
						}
						var serverPIDs []int
						if o.serverPIDs != nil {
							serverPIDs = o.serverPIDs[i]
						}
						res, err := runOne(ctx, o, target, serverPIDs, workload, callers, rate, stderr)
						if err != nil {
							return fmt.Errorf("%s %s: %w", target, workload, err)
						}
						if res != nil {
							if o.repeat > 1 {
								res.Sample = round + 1
							}
							results = append(results, res)
						}
					}
				}
			}
		}
	}

	bench.WriteTable(stdout, results)
	bench.WriteComparison(stdout, results)
	rep := bench.NewReport("lockbench "+strings.Join(args, " "), started, results)
	var gateErr error
	if baseline != nil {
		rep.Gate = bench.Compare(baseline.Runs, results, o.gate)
		rep.Gate.Notes = append(baseline.MachineNotes(rep.Machine), rep.Gate.Notes...)
		rep.Gate.Write(stdout)
		switch n := len(rep.Gate.Regressions()); {
		case len(rep.Gate.Comparisons) == 0:
			// A gate that compared nothing must not pass for one that
			// found nothing: the flags differ from the baseline's.
			gateErr = fmt.Errorf("no configuration of this run is in %s: nothing compared", o.baseline)
		case n > 0:
			gateErr = regressionError{fmt.Errorf("%d figure(s) regressed against %s", n, o.baseline)}
		}
	}
	if o.jsonPath != "" {
		if err := rep.WriteJSON(o.jsonPath); err != nil {
			return err
		}
	}
	checkErr := bench.Check(results)
	if o.saveTo != "" {
		// A broken run would make every later comparison meaningless.
		if checkErr != nil {
			return fmt.Errorf("baseline not saved, the runs failed the check:\n%w", checkErr)
		}
		if err := rep.WriteJSON(o.saveTo); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "baseline saved: %s (%d runs)\n", o.saveTo, len(results))
	}
	if o.reportDir != "" {
		path, err := rep.WriteHTML(o.reportDir)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nreport: %s\n", path)
	}
	if o.check {
		if checkErr != nil {
			return fmt.Errorf("check failed:\n%w", checkErr)
		}
		fmt.Fprintf(stdout, "check passed (%d runs)\n", len(results))
	}
	return gateErr
}

// runOne runs one workload against one target; it returns nil, nil for a
// combination that cannot run (admission against a peer without a gate).
func runOne(ctx context.Context, o *options, target string, serverPIDs []int, workload string, callers int, rate float64, stderr io.Writer) (*bench.Result, error) {
	cfg := bench.Config{
		Workload:      workload,
		Duration:      o.duration,
		Callers:       callers,
		Rate:          rate,
		Keys:          o.keys,
		Wait:          o.wait,
		Hold:          o.hold,
		Rounds:        o.rounds,
		Admission:     o.admission,
		Keepalive:     o.keepalive,
		ServerPIDs:    serverPIDs,
		ProgressEvery: o.progress,
	}
	if o.progress > 0 {
		cfg.Progress = stderr
	}
	var spec bench.TargetSpec
	if target == inprocTarget {
		limit := 0
		if workload == bench.Admission {
			limit = o.admission.Limit
		}
		srv, err := bench.StartServer(limit)
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		spec = bench.TargetSpec{Scheme: bench.SchemeLockd, Addr: srv.Addr()}
	} else {
		spec, _ = bench.ParseTarget(target) // checked by parseFlags
	}
	if err := bench.CanRun(workload, spec, o.target.Raw); err != nil {
		fmt.Fprintf(stderr, "skipping %s against %s: %v\n", workload, target, err)
		return nil, nil
	}
	fmt.Fprintf(stderr, "%s: %s for %v, callers %d", target, workload, o.duration, callers)
	if rate > 0 || bench.ProbesAtRate(workload) {
		fmt.Fprintf(stderr, ", open loop")
	}
	fmt.Fprintln(stderr)
	res, err := bench.Run(ctx, spec, o.target, cfg)
	if err != nil {
		return nil, err
	}
	// The target as given: "inproc" for every in-process server, whatever
	// its port, so that a baseline's runs meet this build's.
	res.Target = target
	return res, nil
}
