package server

import (
	"math"
	"math/big"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

// parseMetrics parses a /metrics body as Prometheus does.
func parseMetrics(t *testing.T, body string) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return families
}

// sampleValue is the value of the series of family name with exactly the
// labels given as name, value pairs; ok is false when there is none.
func sampleValue(families map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels)/2 || !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// familyBlocks checks that every family's lines (HELP, TYPE, samples) form
// one contiguous block, as the text format wants, and returns the family
// names in order of appearance.
func familyBlocks(t *testing.T, body string, families map[string]*dto.MetricFamily) []string {
	t.Helper()
	var order []string
	seen := map[string]bool{}
	current := ""
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		var name string
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, _, _ = strings.Cut(rest, " ")
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, _, _ = strings.Cut(rest, " ")
		} else if line != "" && !strings.HasPrefix(line, "#") {
			name = strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })[0]
			// Summaries and histograms add suffixes to their family's name.
			for _, suffix := range []string{"_sum", "_count", "_bucket"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && families[base] != nil {
					name = base
				}
			}
		} else {
			continue
		}
		if name == current {
			continue
		}
		if seen[name] {
			t.Errorf("family %s appears in two places", name)
		}
		seen[name] = true
		current = name
		order = append(order, name)
	}
	return order
}

// TestMetricsExposition: /metrics parses as the Prometheus text format,
// each family is written in one block with one HELP and one TYPE, every
// lockd family is there (the tenant and token-mark ones included), and so
// are the standard go_* and process_* families.
func TestMetricsExposition(t *testing.T) {
	auth, err := ParseAuth(strings.NewReader("alpha:" + strings.Repeat("ab", MinSecretLen) + " keys=10\nbeta:" + strings.Repeat("cd", MinSecretLen) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, func(cfg *Config) {
		cfg.Admin = "127.0.0.1:0"
		cfg.DataDir = filepath.Join(t.TempDir(), "lockd.data")
		cfg.Auth = auth.Secrets
		cfg.Engine.MaxKeys = 100
		cfg.Engine.TenantLimits = auth.TenantLimits(100, 100, 100)
	})
	c := dial(t, s)
	c.hello("alpha", auth.Secrets["alpha"])
	token := c.mustAcquire(1, "k")
	c.send(codec.AppendRelease(nil, 2, token, "k"))
	c.expect(codec.OpReleased, 2)

	code, body := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	families := parseMetrics(t, body)
	order := familyBlocks(t, body, families)
	if len(order) != len(families) {
		t.Errorf("%d blocks for %d families", len(order), len(families))
	}
	for name := range families {
		if n := strings.Count(body, "# TYPE "+name+" "); n != 1 {
			t.Errorf("%d TYPE lines for %s", n, name)
		}
	}
	for _, name := range []string{
		"lockd_requests_total", "lockd_responses_total", "lockd_errors_total",
		"lockd_gate_open", "lockd_gate_refused_total", "lockd_gate_used", "lockd_gate_limit",
		"lockd_tenant_gate_open", "lockd_tenant_gate_refused_total", "lockd_tenant_gate_used", "lockd_tenant_gate_limit",
		"lockd_keys", "lockd_waiters", "lockd_inflight_acquires", "lockd_connections",
		"lockd_token_highest_issued", "lockd_token_mark", "lockd_token_reserve_busy_total", "lockd_token_reserve_failures_total",
		"lockd_tokens_issued_total", "lockd_response_writes_total", "lockd_loop_wakeups_total", "lockd_connections_accepted_total",
		"lockd_connections_rejected_total", "lockd_slow_clients_dropped_total", "lockd_progress_timeouts_total",
		"lockd_auth_failures_total", "lockd_conn_inflight_busy_total",
		"lockd_orphan_grants_queued_total", "lockd_orphan_grants_dropped_total",
		"go_goroutines", "go_memstats_heap_alloc_bytes", "process_open_fds", "process_resident_memory_bytes",
	} {
		if families[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if g, ok := sampleValue(families, "go_goroutines"); !ok || g < 1 {
		t.Errorf("go_goroutines %v %v", g, ok)
	}
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"lockd_requests_total", []string{"op", "acquire"}, 1},
		{"lockd_responses_total", []string{"op", "hello", "result", "welcome"}, 1},
		{"lockd_responses_total", []string{"op", "release", "result", "released"}, 1},
		{"lockd_tenant_gate_limit", []string{"tenant", "alpha", "gate", "keys"}, 10},
		{"lockd_tokens_issued_total", nil, 1},
		{"lockd_token_highest_issued", nil, float64(token)},
		{"lockd_connections", nil, 1},
	} {
		if got, ok := sampleValue(families, want.name, want.labels...); !ok || got != want.value {
			t.Errorf("%s%v = %v (present %v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
}

// TestTokenCounterNeverReadsBelowAnIssuedToken: a sample is a float64; a
// token above 2^53 that does not fit exactly is shown rounded up, so a
// replacement started above the scraped value issues no token again.
func TestTokenCounterNeverReadsBelowAnIssuedToken(t *testing.T) {
	const first = 1<<60 + 1 // float64(first) is 1<<60, one below it
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0"; cfg.Engine.FirstToken = first })
	c := dial(t, s)
	token := c.mustAcquire(1, "k")
	_, body := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	got, ok := sampleValue(parseMetrics(t, body), "lockd_token_highest_issued")
	if !ok {
		t.Fatalf("/metrics has no lockd_token_highest_issued:\n%s", body)
	}
	if new(big.Float).SetFloat64(got).Cmp(new(big.Float).SetUint64(token)) < 0 {
		t.Fatalf("lockd_token_highest_issued %v reads below the issued token %d", got, token)
	}
}

func TestRoundedUp(t *testing.T) {
	for _, v := range []uint64{0, 1, 1 << 53, 1<<53 + 1, 1<<60 + 1, math.MaxUint64 - 1, math.MaxUint64} {
		f := roundedUp(v)
		exact := new(big.Float).SetUint64(v)
		if new(big.Float).SetFloat64(f).Cmp(exact) < 0 {
			t.Errorf("roundedUp(%d) = %v, below it", v, f)
		}
		if below := math.Nextafter(f, 0); v != 0 && new(big.Float).SetFloat64(below).Cmp(exact) >= 0 {
			t.Errorf("roundedUp(%d) = %v is not the least float64 at or above it", v, f)
		}
	}
}

// metricValue is the value of an unlabelled series in a /metrics body.
func metricValue(t *testing.T, body, name string) uint64 {
	t.Helper()
	v, ok := sampleValue(parseMetrics(t, body), name)
	if !ok {
		t.Fatalf("/metrics has no %s:\n%s", name, body)
	}
	return uint64(v)
}

// histogramSample is the count and sum of the histogram series of family
// name with exactly the labels given as name, value pairs.
func histogramSample(t *testing.T, families map[string]*dto.MetricFamily, name string, labels ...string) (uint64, float64) {
	t.Helper()
	for _, m := range families[name].GetMetric() {
		if len(m.GetLabel()) == len(labels)/2 && hasLabels(m, labels) && m.Histogram != nil {
			return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
		}
	}
	t.Fatalf("/metrics has no histogram %s%v", name, labels)
	return 0, 0
}

// TestLatencyHistograms drives acquires of every outcome, a queued wait,
// a release and an expiry on the fake clock, and reads each histogram:
// acquire latency from arrival to answer by outcome, the queue wait of
// the granted waiter, the hold times, the expiry counter, the build.
func TestLatencyHistograms(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0" })
	holder, waiter, other := dial(t, s), dial(t, s), dial(t, s)
	token := holder.mustAcquire(1, "k")
	waiter.acquire(2, 30, 10, "k") // queued at 0
	other.acquire(3, 30, 0, "k")
	other.expect(codec.OpTimeout, 3)
	other.acquire(4, 30, 1, "k") // queued at 0, times out at 1 s
	// Both waiters are queued once the one behind them has been answered.
	other.send(codec.AppendPing(nil, 5))
	other.expect(codec.OpPong, 5)
	waiter.send(codec.AppendPing(nil, 6))
	waiter.expect(codec.OpPong, 6)
	s.advance(time.Second)
	other.expect(codec.OpTimeout, 4)
	s.advance(2 * time.Second)
	holder.send(codec.AppendRelease(nil, 7, token, "k"))
	holder.expect(codec.OpReleased, 7)
	if r := waiter.expect(codec.OpAcquired, 2); r.WaitedMs != 3000 {
		t.Fatalf("waited_ms %d, want 3000", r.WaitedMs)
	}
	s.advance(31 * time.Second) // the waiter's 30 s lease lapses
	s.Engine().Sweep()

	_, body := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	families := parseMetrics(t, body)
	for _, want := range []struct {
		name     string
		labels   []string
		count    uint64
		sumAbove float64 // the sum is at least this, and below it plus 10 ms
	}{
		{"lockd_acquire_duration_seconds", []string{"outcome", "acquired"}, 2, 3},
		{"lockd_acquire_duration_seconds", []string{"outcome", "timeout"}, 2, 1},
		{"lockd_acquire_duration_seconds", []string{"outcome", "busy"}, 0, 0},
		{"lockd_acquire_duration_seconds", []string{"outcome", "error"}, 0, 0},
		{"lockd_acquire_queue_wait_seconds", nil, 1, 3},
		{"lockd_lock_hold_seconds", nil, 2, 3 + 30},
	} {
		count, sum := histogramSample(t, families, want.name, want.labels...)
		if count != want.count || sum < want.sumAbove || sum > want.sumAbove+0.01 {
			t.Errorf("%s%v: count %d sum %v, want %d and %v", want.name, want.labels, count, sum, want.count, want.sumAbove)
		}
	}
	if v, ok := sampleValue(families, "lockd_lease_expiries_total"); !ok || v != 1 {
		t.Errorf("lockd_lease_expiries_total %v (present %v), want 1", v, ok)
	}
	build := families["lockd_build_info"].GetMetric()
	if len(build) != 1 || build[0].GetGauge().GetValue() != 1 || !hasLabels(build[0], []string{"goversion", runtime.Version()}) {
		t.Errorf("lockd_build_info %v, want one series of value 1 naming %s", build, runtime.Version())
	}
}

// recordingTransport is a connection whose writes are kept, for tests
// that run a session's passes themselves.
type recordingTransport struct{ written []byte }

func (t *recordingTransport) write(b []byte)      { t.written = append(t.written, b...) }
func (*recordingTransport) outboundBuffered() int { return 0 }
func (*recordingTransport) wake()                 {}
func (*recordingTransport) remoteAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// A waiter granted during another connection's pass of the same loop,
// after the clock moved on since that pass began, is observed with its
// own latency: its arrival is estimated back from a clock reading taken
// when its answer is delivered, not from the pass's start (the answer
// would otherwise count the time the pass ran twice).
func TestWaiterGrantedDuringAnotherPassHasItsOwnLatency(t *testing.T) {
	s := startServer(t, func(cfg *Config) { cfg.Admin = "127.0.0.1:0" })
	b := &batch{}
	pass := func(ss *session, frame []byte) {
		b.beginPass()
		ss.process(frame)
		b.endPass()
	}
	newConn := func() (*session, *recordingTransport) {
		tr := &recordingTransport{}
		ss, _, err := newSession(s.Server, tr, b)
		if err != nil {
			t.Fatal(err)
		}
		return ss, tr
	}
	holder, holderTr := newConn()
	waiter, waiterTr := newConn()
	other, _ := newConn()
	pass(holder, codec.AppendAcquire(nil, 1, 30, 0, "k"))
	var r codec.Response
	if _, err := codec.DecodeResponse(holderTr.written, &r); err != nil || r.Op != codec.OpAcquired {
		t.Fatalf("holder's answer %+v %v, want a grant", r, err)
	}
	pass(waiter, codec.AppendAcquire(nil, 2, 30, 10, "k")) // queued at 0
	s.advance(3 * time.Second)

	b.beginPass()
	other.process(codec.AppendPing(nil, 3)) // the pass begins at 3 s
	s.clock.Advance(2 * time.Second)
	if res := s.Engine().Release(s.Engine().Namespace("default"), []byte("k"), r.Token); res.Outcome != engine.Released {
		t.Fatalf("release: %+v", res)
	}
	b.endPass() // the waiter's grant, resolved at 5 s, is delivered here

	if _, err := codec.DecodeResponse(waiterTr.written, &r); err != nil || r.Op != codec.OpAcquired || r.WaitedMs != 5000 {
		t.Fatalf("waiter's answer %+v %v, want a grant after 5000 ms", r, err)
	}
	_, body := scrape(t, "http://"+s.AdminAddr()+"/metrics")
	if count, sum := histogramSample(t, parseMetrics(t, body), "lockd_acquire_duration_seconds", "outcome", "acquired"); count != 2 || sum < 5 || sum > 5.01 {
		t.Fatalf("acquired latency: count %d sum %v s, want 2 grants taking 0 s and 5 s", count, sum)
	}
}
