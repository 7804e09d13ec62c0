package lockd_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lockd/lockd/client"
	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/internal/poll"
)

const (
	rulesFile     = "deploy/monitoring/lockd-rules.yml"
	rulesTestFile = "deploy/monitoring/lockd-rules.test.yml"
	dashboardFile = "deploy/monitoring/lockd-dashboard.json"
)

// freePorts reserves n loopback ports by listening on port 0, and frees
// them for the processes the test starts.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs
}

// lockdProc is one lockd process the test started.
type lockdProc struct {
	name, listen, admin string
	cmd                 *exec.Cmd
	done                chan struct{}
	log                 string
}

// startProc runs bin with args, its output in a log file of dir; the
// process is killed when the test ends.
func startProc(t *testing.T, dir, name, bin string, args ...string) *lockdProc {
	t.Helper()
	return startProcEnv(t, dir, name, bin, nil, args...)
}

// startProcEnv is startProc with env (NAME=value) added to the
// environment.
func startProcEnv(t *testing.T, dir, name, bin string, env []string, args ...string) *lockdProc {
	t.Helper()
	p := &lockdProc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("--- %s log ---\n%s", name, b)
		}
	})
	return p
}

func (p *lockdProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// fleet is what the monitoring tests watch: a single-mode server and the
// three nodes of a cluster, all on loopback.
type fleet struct {
	single *lockdProc
	nodes  []*lockdProc
}

func (f *fleet) all() []*lockdProc { return append([]*lockdProc{f.single}, f.nodes...) }

func startFleet(t *testing.T) *fleet {
	t.Helper()
	bin := buildLockd(t)
	dir := t.TempDir()
	addrs := freePorts(t, 11)
	f := &fleet{}
	f.single = startProc(t, dir, "single", bin, "serve", "--listen", addrs[0], "--admin", addrs[1],
		"--data-dir", filepath.Join(dir, "single.data"), "--log-level", "warn")
	f.single.listen, f.single.admin = addrs[0], addrs[1]
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, addrs[2+i]))
	}
	for i := range 3 {
		name := fmt.Sprintf("node%d", i+1)
		p := startProc(t, dir, name, bin, "serve", "--cluster", "--node-id", strconv.Itoa(i+1),
			"--peers", strings.Join(peers, ","), "--data-dir", filepath.Join(dir, name+".data"),
			"--listen", addrs[5+i], "--admin", addrs[8+i], "--log-level", "warn")
		p.listen, p.admin = addrs[5+i], addrs[8+i]
		f.nodes = append(f.nodes, p)
	}
	// Ready once each answers an acquire (the cluster's after its election).
	for _, p := range f.all() {
		key := "ready-" + p.name
		eventually(t, 30*time.Second, "a first grant from "+p.name, func() (bool, string) {
			c, err := dialLockd(p.listen)
			if err != nil {
				return false, err.Error()
			}
			defer c.close()
			r, err := c.do(codec.AppendAcquire(nil, 1, 1, 0, key))
			if err != nil || r.Op != codec.OpAcquired {
				return false, fmt.Sprintf("%q %v %v", r.Op, r.Reason, err)
			}
			_, err = c.do(codec.AppendRelease(nil, 2, r.Token, key))
			return err == nil, fmt.Sprint(err)
		})
	}
	return f
}

// eventually polls cond every 200 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	held := poll.Until(timeout, 200*time.Millisecond, func() bool {
		var ok bool
		ok, last = cond()
		return ok
	})
	if !held {
		t.Fatalf("no %s within %v; last: %s", what, timeout, last)
	}
}

// lockdConn is a protocol connection that sends one frame at a time.
type lockdConn struct {
	nc net.Conn
	rr *codec.ResponseReader
}

func dialLockd(addr string) (*lockdConn, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	c := &lockdConn{nc: nc, rr: codec.NewResponseReader(nc, 4096)}
	if g, err := c.next(); err != nil || g.Op != codec.OpGreeting {
		nc.Close()
		return nil, fmt.Errorf("greeting %q: %v", g.Op, err)
	}
	return c, nil
}

func (c *lockdConn) next() (codec.Response, error) {
	var r codec.Response
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	err := c.rr.Next(&r)
	return r, err
}

func (c *lockdConn) do(frame []byte) (codec.Response, error) {
	if _, err := c.nc.Write(frame); err != nil {
		return codec.Response{}, err
	}
	return c.next()
}

func (c *lockdConn) close() { c.nc.Close() }

// liveMetricFamilies scrapes /metrics of every process: the names of the
// families any of them exports.
func liveMetricFamilies(t *testing.T, procs []*lockdProc) map[string]bool {
	t.Helper()
	names := make(map[string]bool)
	for _, p := range procs {
		resp, err := http.Get("http://" + p.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
		if err != nil {
			t.Fatalf("%s /metrics: %v", p.name, err)
		}
		for name := range families {
			names[name] = true
		}
	}
	return names
}

var (
	promToken      = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*|[0-9][0-9.]*(?:[eE][+-]?[0-9]+)?|"(?:[^"\\]|\\.)*"|\{[^}]*\}|\[[^\]]*\]|\S`)
	promIdentifier = regexp.MustCompile(`^[A-Za-z_:][A-Za-z0-9_:]*$`)
	// promWords are PromQL's keywords and the clause words whose
	// parenthesised label lists name labels, not metrics.
	promWords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
		// aggregation operators, which may be followed by a clause before their parenthesis
		"sum": true, "min": true, "max": true, "avg": true, "count": true, "group": true, "stddev": true, "stdvar": true,
		"topk": true, "bottomk": true, "quantile": true, "count_values": true}
	promLabelList = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
)

// metricNames are the metric names a PromQL expression reads: identifiers
// that are not functions, keywords or label lists; selectors' label
// matchers, ranges and strings are skipped whole.
func metricNames(expr string) []string {
	tokens := promToken.FindAllString(expr, -1)
	var names []string
	for i := 0; i < len(tokens); i++ {
		tok := tokens[i]
		next := ""
		if i+1 < len(tokens) {
			next = tokens[i+1]
		}
		switch {
		case promLabelList[tok]:
			for i < len(tokens) && tokens[i] != ")" { // skip the label list
				i++
			}
		case promIdentifier.MatchString(tok):
			if next != "(" && !promWords[strings.ToLower(tok)] {
				names = append(names, tok)
			}
		}
	}
	return names
}

// familyOf maps a series name to its family: a histogram's _bucket,
// _count and _sum series belong to the histogram.
func familyOf(name string, live map[string]bool) string {
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && live[base] {
			return base
		}
	}
	return name
}

func TestMetricNamesOfPromQL(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (outcome, le) (rate(lockd_acquire_duration_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`: {"lockd_acquire_duration_seconds_bucket"},
		`1 - lockd_token_highest_issued / 9.223372036854775807e18`:                                                                              {"lockd_token_highest_issued"},
		`lockd:acquire_duration_seconds:p99_5m{outcome="acquired"} > 0.25`:                                                                      {"lockd:acquire_duration_seconds:p99_5m"},
		`up{job="lockd"} == 0 and on (instance) max without (version) (lockd_build_info)`:                                                       {"up", "lockd_build_info"},
		`label_values(lockd_build_info, instance)`:                                                                                              {"lockd_build_info", "instance"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}

// dashboardQueries are the PromQL expressions of the dashboard: its
// panels' targets and its template variables' queries.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			if target.Expr == "" {
				t.Errorf("panel %q has a target without a query", p.Title)
			}
			exprs = append(exprs, target.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok && v.Type == "query" {
			// label_values(METRIC, LABEL): the label is not a metric.
			expr, _ := q["query"].(string)
			exprs = append(exprs, strings.Replace(expr, ", instance)", ")", 1))
		}
	}
	if len(exprs) < 20 {
		t.Fatalf("%s has %d queries", dashboardFile, len(exprs))
	}
	return exprs
}

// ruleExprs are the expressions of the rules file, and the names its
// recording rules define.
func ruleExprs(t *testing.T) (exprs []string, recorded map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	recorded = make(map[string]bool)
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:- )?(record|expr): (.+)$`).FindAllStringSubmatch(string(raw), -1) {
		if m[1] == "record" {
			recorded[m[2]] = true
		} else {
			exprs = append(exprs, m[2])
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("%s has %d expressions", rulesFile, len(exprs))
	}
	return exprs, recorded
}

// TestDashboardAndRulesNameLiveMetrics: every metric the dashboard and the
// rules read is one a running single server or cluster node exports (the
// rules may also read Prometheus's own `up` and their recorded series).
func TestDashboardAndRulesNameLiveMetrics(t *testing.T) {
	f := startFleet(t)
	driveLoad(t, f, time.Second)
	live := liveMetricFamilies(t, f.all())
	for _, expr := range dashboardQueries(t) {
		for _, name := range metricNames(expr) {
			if !live[familyOf(name, live)] {
				t.Errorf("%s: %s reads %s, which lockd does not export", dashboardFile, expr, name)
			}
		}
	}
	exprs, recorded := ruleExprs(t)
	for _, expr := range exprs {
		for _, name := range metricNames(expr) {
			if name != "up" && !recorded[name] && !live[familyOf(name, live)] {
				t.Errorf("%s: %s reads %s, which lockd does not export", rulesFile, expr, name)
			}
		}
	}
}

// TestAlertRulesUnitTests runs promtool's checks and the rules' unit tests.
func TestAlertRulesUnitTests(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run does)")
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// driveLoad runs bounded traffic against every process for d: uncontended
// acquire and release on each cluster node, and on the single server
// grants that wait 1.2 s behind a holder (every second A answer is slow)
// and waits of 1 s that run out (T answers), so that its latency series
// differ from the cluster's.
func driveLoad(t *testing.T, f *fleet, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	run := func(fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil {
				errs <- err
			}
		}()
	}
	for _, p := range f.nodes {
		run(func() error {
			c, err := dialLockd(p.listen)
			if err != nil {
				return err
			}
			defer c.close()
			for owner := uint64(1); time.Now().Before(deadline); owner += 2 {
				key := fmt.Sprintf("load-%d", owner%16)
				r, err := c.do(codec.AppendAcquire(nil, owner, 5, 0, key))
				if err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				if r.Op == codec.OpAcquired {
					if _, err := c.do(codec.AppendRelease(nil, owner+1, r.Token, key)); err != nil {
						return fmt.Errorf("%s: %w", p.name, err)
					}
				}
			}
			return nil
		})
	}
	run(func() error { return slowGrants(f.single.listen, deadline) })
	run(func() error { return runOutWaits(f.single.listen, deadline) })
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// slowGrants holds a key while a second connection waits for it, and
// releases after 1.2 s: every second grant answers after 1.2 s.
func slowGrants(addr string, deadline time.Time) error {
	holder, err := dialLockd(addr)
	if err != nil {
		return err
	}
	defer holder.close()
	waiter, err := dialLockd(addr)
	if err != nil {
		return err
	}
	defer waiter.close()
	for owner := uint64(1); time.Now().Before(deadline); owner += 3 {
		r, err := holder.do(codec.AppendAcquire(nil, owner, 5, 0, "slow"))
		if err != nil || r.Op != codec.OpAcquired {
			return fmt.Errorf("slow holder: %q %v", r.Op, err)
		}
		if _, err := waiter.nc.Write(codec.AppendAcquire(nil, owner+1, 5, 5, "slow")); err != nil {
			return err
		}
		time.Sleep(1200 * time.Millisecond)
		if _, err := holder.do(codec.AppendRelease(nil, owner+2, r.Token, "slow")); err != nil {
			return err
		}
		w, err := waiter.next()
		if err != nil || w.Op != codec.OpAcquired {
			return fmt.Errorf("slow waiter: %q %v", w.Op, err)
		}
		if _, err := waiter.do(codec.AppendRelease(nil, owner+2, w.Token, "slow")); err != nil {
			return err
		}
	}
	return nil
}

// runOutWaits holds a key and asks for it again with a wait of 1 s, which
// runs out: T answers after 1 s.
func runOutWaits(addr string, deadline time.Time) error {
	holder, err := dialLockd(addr)
	if err != nil {
		return err
	}
	defer holder.close()
	waiter, err := dialLockd(addr)
	if err != nil {
		return err
	}
	defer waiter.close()
	r, err := holder.do(codec.AppendAcquire(nil, 1, 60, 0, "held"))
	if err != nil || r.Op != codec.OpAcquired {
		return fmt.Errorf("held: %q %v", r.Op, err)
	}
	for owner := uint64(1); time.Now().Before(deadline); owner++ {
		if r, err := waiter.do(codec.AppendAcquire(nil, owner, 5, 1, "held")); err != nil || r.Op != codec.OpTimeout {
			return fmt.Errorf("waiting for a held key: %q %v", r.Op, err)
		}
	}
	return nil
}

// prometheus is a Prometheus server the test started.
type prometheus struct{ base string }

// query evaluates expr now: each series' instance label and value.
func (p prometheus) query(expr string) (map[string]float64, error) {
	resp, err := http.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, errors.New(body.Error)
	}
	out := make(map[string]float64)
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, err
		}
		out[r.Metric["instance"]] = v
	}
	return out, nil
}

// startPrometheus runs Debian's prometheus scraping targets every second
// with the rules file, each rule's `for:` cut to forDuration and the
// acquire latency threshold set to latencyThreshold.
func startPrometheus(t *testing.T, bin string, targets []string, forDuration, latencyThreshold string) prometheus {
	t.Helper()
	dir := t.TempDir()
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for: )\S+$`).ReplaceAll(rules, []byte("${1}"+forDuration))
	latency := regexp.MustCompile(`(expr: lockd:acquire_duration_seconds:p99_5m\{outcome="acquired"\} > )\S+`)
	if !latency.Match(rules) {
		t.Fatalf("%s: no acquire latency alert to set the threshold of", rulesFile)
	}
	rules = latency.ReplaceAll(rules, []byte("${1}"+latencyThreshold))
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rules.yml]
scrape_configs:
  - job_name: lockd
    static_configs:
      - targets: ['%s']
`, strings.Join(targets, "', '"))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePorts(t, 1)[0]
	startProc(t, dir, "prometheus", bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	p := prometheus{base: "http://" + addr}
	eventually(t, 30*time.Second, "ready Prometheus", func() (bool, string) {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return p
}

// TestPrometheusSeesLatencyAndANodeDown runs Debian's Prometheus with the
// rules against a single server and a 3-node cluster under load, then
// kills a node: through Prometheus's API, each process's acquire latency
// is recorded, the single server's slow grants fire LockdAcquireLatencyHigh
// (its threshold set to 1.5 s) there and nowhere else, its waits that run out read about their 1 s,
// and LockdNodeDown fires for the killed node alone while the others
// keep every group led.
func TestPrometheusSeesLatencyAndANodeDown(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian: apt-get install prometheus; .ci/run does); TestAlertRulesUnitTests and TestDashboardAndRulesNameLiveMetrics check the rules offline")
	}
	f := startFleet(t)
	var targets []string
	for _, p := range f.all() {
		targets = append(targets, p.admin)
	}
	// The threshold is above the cluster's p99 on a busy test machine and
	// below the single server's: half its grants wait 1.2 s, which puts its
	// p99 near the top of the bucket up to 2.1 s.
	prom := startPrometheus(t, bin, targets, "2s", "1.5")
	// Prometheus applies its targets some seconds after it is ready: the
	// load starts once it scrapes them all.
	eventually(t, 30*time.Second, "a scrape of every process", func() (bool, string) {
		up, err := prom.query(`up{job="lockd"} == 1`)
		return err == nil && len(up) == len(targets), fmt.Sprint(up, err)
	})
	driveLoad(t, f, 4*time.Second)

	eventually(t, 30*time.Second, "acquire p99 of every process", func() (bool, string) {
		p99, err := prom.query(`lockd:acquire_duration_seconds:p99_5m{outcome="acquired"}`)
		if err != nil || len(p99) != len(targets) {
			return false, fmt.Sprint(p99, err)
		}
		for _, node := range f.nodes {
			if !(p99[node.admin] > 0 && p99[node.admin] < p99[f.single.admin]) {
				return false, fmt.Sprintf("%v: want every node's p99 above 0 and below the single server's slow grants", p99)
			}
		}
		return p99[f.single.admin] > 1.5, fmt.Sprint(p99)
	})
	eventually(t, 20*time.Second, "LockdAcquireLatencyHigh for the single server alone", func() (bool, string) {
		firing, err := prom.query(`ALERTS{alertname="LockdAcquireLatencyHigh", alertstate="firing"}`)
		return err == nil && len(firing) == 1 && firing[f.single.admin] == 1, fmt.Sprint(firing, err)
	})
	timeouts, err := prom.query(`lockd:acquire_duration_seconds:p99_5m{outcome="timeout"}`)
	if err != nil {
		t.Fatal(err)
	}
	// 1 s waits land in the bucket up to 1.048576 s (or, answered late on
	// a busy machine, the next, up to 2.097152 s); p99 interpolates in it.
	if v := timeouts[f.single.admin]; v < 0.5 || v > 2.1 {
		t.Errorf("p99 of T answers on the single server %v, want about the 1 s waited (%v)", v, timeouts)
	}

	killed := f.nodes[2]
	killed.kill()
	eventually(t, 30*time.Second, "LockdNodeDown for the killed node alone", func() (bool, string) {
		down, err := prom.query(`ALERTS{alertname="LockdNodeDown", alertstate="firing"}`)
		return err == nil && len(down) == 1 && down[killed.admin] == 1, fmt.Sprint(down, err)
	})
	led, err := prom.query(`min by (instance) (lockd_cluster_group_has_leader)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range f.nodes[:2] {
		if led[node.admin] != 1 {
			t.Errorf("%s: a group without a leader after one node of three died (%v)", node.name, led)
		}
	}
	if firing, err := prom.query(`ALERTS{alertname="LockdGroupWithoutLeader"}`); err != nil || len(firing) != 0 {
		t.Errorf("LockdGroupWithoutLeader with two nodes of three up: %v %v", firing, err)
	}
}

// TestPromtoolChecksLiveMetrics runs promtool check metrics over what
// lockd exports: a single-mode server with per-tenant quotas (so that
// the tenant gates are there) and a one-node cluster. promtool's lint
// finds names, types and help texts Prometheus tooling would trip on.
func TestPromtoolChecksLiveMetrics(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run does)")
	}
	bin := buildLockd(t)
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	lines := "a:" + strings.Repeat("ab", 32) + " keys=10\nb:" + strings.Repeat("cd", 32) + " keys=10\n"
	if err := os.WriteFile(auth, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := freePorts(t, 5)
	single := startProc(t, dir, "single", bin, "serve", "--listen", addrs[0], "--admin", addrs[1], "--auth-file", auth, "--data-dir", "", "--log-level", "warn")
	node := startProc(t, dir, "node", bin, "serve", "--cluster", "--node-id", "1", "--peers", "1="+addrs[2],
		"--data-dir", filepath.Join(dir, "node.data"), "--listen", addrs[3], "--admin", addrs[4], "--log-level", "warn")
	// A tenant's gates are exported once it has been used.
	secret, _ := hex.DecodeString(strings.Repeat("ab", 32))
	eventually(t, 20*time.Second, "a grant to tenant a", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, client.Config{Addrs: []string{addrs[0]}, Tenant: "a", Secret: secret})
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		_, err = c.Acquire(ctx, "k", client.AcquireOptions{MinWorkBudget: client.Budget(0)})
		return err == nil, fmt.Sprint(err)
	})
	for _, p := range []struct {
		proc  *lockdProc
		admin string
	}{{single, addrs[1]}, {node, addrs[4]}} {
		var body []byte
		eventually(t, 30*time.Second, "metrics from "+p.proc.name, func() (bool, string) {
			resp, err := http.Get("http://" + p.admin + "/metrics")
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			body, err = io.ReadAll(resp.Body)
			return err == nil && resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte("lockd_gate_used")), resp.Status
		})
		if p.proc == single && !bytes.Contains(body, []byte("lockd_tenant_gate_used")) {
			t.Fatalf("%s exports no tenant gates to check", p.proc.name)
		}
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("promtool check metrics of %s: %v\n%s", p.proc.name, err, out)
		}
	}
}
