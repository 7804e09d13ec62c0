package server

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/internal/histogram"
)

type opKind uint8

const (
	opUnknown opKind = iota
	opHello
	opAcquire
	opRelease
	opKeep
	opPing
	opSession
	opAbandon
	opCount
)

var opNames = [opCount]string{"unknown", "hello", "acquire", "release", "keep", "ping", "session", "abandon"}

func opOf(op byte) opKind {
	switch op {
	case codec.OpHello:
		return opHello
	case codec.OpAcquire:
		return opAcquire
	case codec.OpRelease:
		return opRelease
	case codec.OpKeep:
		return opKeep
	case codec.OpPing:
		return opPing
	case codec.OpSession:
		return opSession
	case codec.OpAbandon:
		return opAbandon
	}
	return opUnknown
}

type resultKind uint8

const (
	resultWelcome resultKind = iota
	resultAcquired
	resultTimeout
	resultBusy
	resultReleased
	resultRenewed
	resultNotHeld
	resultPong
	resultError
	resultCount
)

var resultNames = [resultCount]string{"welcome", "acquired", "timeout", "busy", "released", "renewed", "not_held", "pong", "error"}

func resultOf(respOp byte) resultKind {
	switch respOp {
	case codec.OpAcquired:
		return resultAcquired
	case codec.OpTimeout:
		return resultTimeout
	case codec.OpBusy:
		return resultBusy
	case codec.OpReleased:
		return resultReleased
	case codec.OpNotHeld:
		return resultNotHeld
	case codec.OpPong:
		return resultPong
	}
	return resultError
}

// metrics are the server's counters. They are plain atomics: a scrape
// reads each without stopping the loops.
type metrics struct {
	requests         [opCount]atomic.Uint64
	results          [opCount][resultCount]atomic.Uint64
	errors           [codec.ShuttingDown + 1]atomic.Uint64
	writes           atomic.Uint64
	wakeups          atomic.Uint64
	connsAccepted    atomic.Uint64
	connsRejected    atomic.Uint64
	slowDropped      atomic.Uint64
	progressTimeouts atomic.Uint64
	authFailures     atomic.Uint64
	connInflightBusy atomic.Uint64

	memoryReturns atomic.Uint64

	// tlsHandshakeFailures counts TLS port connections whose handshake
	// failed: no TLS, a certificate refused, or the progress timeout.
	tlsHandshakeFailures atomic.Uint64

	// latency is striped by batch, so that the loops observe into
	// histograms of their own and a scrape sums the stripes.
	latency    [latencyStripes]latencyStripe
	nextStripe atomic.Uint32
}

// acquireOutcome is the class of an acquire's answer (SPEC §3): A, T, B
// or E.
type acquireOutcome uint8

const (
	acquireAcquired acquireOutcome = iota
	acquireTimeout
	acquireBusy
	acquireError
	acquireOutcomes
)

// acquireOutcomeNames are the label values, those of lockd_responses_total.
var acquireOutcomeNames = [acquireOutcomes]string{"acquired", "timeout", "busy", "error"}

func acquireOutcomeOf(o engine.Outcome) acquireOutcome {
	switch o {
	case engine.Granted:
		return acquireAcquired
	case engine.TimedOut:
		return acquireTimeout
	case engine.Busy:
		return acquireBusy
	}
	return acquireError
}

// latencyStripes bounds the histograms' stripes: the event loops (one per
// processor) and TLS connections share them round robin.
const latencyStripes = 16

// latencyStripe is one loop's share of the latency histograms.
type latencyStripe struct {
	acquire   [acquireOutcomes]histogram.Histogram
	queueWait histogram.Histogram
}

func (m *metrics) nextLatencyStripe() *latencyStripe {
	return &m.latency[(m.nextStripe.Add(1)-1)%latencyStripes]
}

// acquireAger is a backend that tells how long ago a queued acquire
// arrived, from its handle: what the server keeps of a queued waiter has
// no room for the instant.
type acquireAger interface {
	AcquireAge(h engine.Handle) (time.Duration, bool)
}

// arrivalOf is the instant on the server's clock a queued acquire
// arrived, estimated from its age against now, the clock reading of the
// loop's pass (so that no request costs a clock reading of its own); an
// acquire of unknown age is taken to have arrived at now.
func (s *Server) arrivalOf(h engine.Handle, now int64) int64 {
	if s.ager == nil || h == nil {
		return now
	}
	if age, ok := s.ager.AcquireAge(h); ok {
		return now - int64(age)
	}
	return now
}

// acquireAnswer is an acquire answer waiting in a batch to be written.
type acquireAnswer struct {
	outcome acquireOutcome
	arrived int64
}

// answeredAcquire notes an acquire answer just appended to the batch.
func (b *batch) answeredAcquire(o acquireOutcome, arrived int64) {
	b.answers = append(b.answers, acquireAnswer{o, arrived})
}

// observeAnswers records the latency of the batch's acquire answers,
// written at now: from the arrival of each request to its answer.
func (b *batch) observeAnswers(now time.Duration) {
	for _, a := range b.answers {
		b.latency.acquire[a.outcome].Observe(time.Duration(int64(now) - a.arrived))
	}
}

func (m *metrics) countRequest(op opKind) { m.requests[op].Add(1) }

func (m *metrics) countResult(op opKind, r resultKind) { m.results[op][r].Add(1) }

// encodeResult appends the response to an engine result and counts it.
func (m *metrics) encodeResult(dst []byte, op opKind, owner uint64, r engine.Result) []byte {
	var respOp byte
	switch r.Outcome {
	case engine.Granted:
		m.countResult(op, resultAcquired)
		return codec.AppendAcquired(dst, owner, r.Token, waitedMs(r.Waited))
	case engine.Renewed:
		// SPEC §5: KEEP is answered A with the same token and waited_ms 0.
		m.countResult(op, resultRenewed)
		return codec.AppendAcquired(dst, owner, r.Token, 0)
	case engine.TimedOut:
		respOp = codec.OpTimeout
	case engine.Busy:
		respOp = codec.OpBusy
	case engine.Released:
		respOp = codec.OpReleased
	case engine.NotHeld:
		respOp = codec.OpNotHeld
	case engine.TokenExhausted, engine.ShuttingDown, engine.Unavailable:
		reason := codec.TokenExhausted
		switch r.Outcome {
		case engine.ShuttingDown:
			reason = codec.ShuttingDown
		case engine.Unavailable:
			reason = codec.Unavailable
		}
		m.countResult(op, resultError)
		m.errors[reason].Add(1)
		return codec.AppendError(dst, owner, reason)
	default:
		panic(fmt.Sprintf("server: engine outcome %v has no response", r.Outcome))
	}
	m.countResult(op, resultOf(respOp))
	return codec.AppendOwnerOnly(dst, respOp, owner)
}

// newRegistry gathers /metrics: the server's own families, the
// backend's when it has some (cluster mode's lockd_cluster_*), and the
// standard go_* and process_* ones.
func newRegistry(s *Server) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs := []prometheus.Collector{
		serverCollector{s},
		connBudgetCollector{s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	if c, ok := s.backend.(prometheus.Collector); ok {
		cs = append(cs, c)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	return reg, nil
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	requestsDesc  = desc("lockd_requests_total", "Frames received, by op.", "op")
	responsesDesc = desc("lockd_responses_total", "Responses sent, by request op and result.", "op", "result")
	errorsDesc    = desc("lockd_errors_total", "E responses, by reason.", "reason")

	gateOpenDesc    = desc("lockd_gate_open", "Admission gate state (1 open, 0 closed).", "gate")
	gateRefusedDesc = desc("lockd_gate_refused_total", "B answers caused by each admission gate.", "gate")
	gateCountDesc   = desc("lockd_gate_count", "Current count held against each gate's limit.", "gate")
	gateLimitDesc   = desc("lockd_gate_limit", "Hard limit of each gate.", "gate")

	tenantGateOpenDesc    = desc("lockd_tenant_gate_open", "A tenant's own admission gate state (1 open, 0 closed).", "tenant", "gate")
	tenantGateRefusedDesc = desc("lockd_tenant_gate_refused_total", "B answers caused by a tenant's own gate.", "tenant", "gate")
	tenantGateCountDesc   = desc("lockd_tenant_gate_count", "Current count held against a tenant's own limit.", "tenant", "gate")
	tenantGateLimitDesc   = desc("lockd_tenant_gate_limit", "A tenant's own limit (0: the global gate alone).", "tenant", "gate")

	keysDesc         = desc("lockd_keys", "Live keys (held or with waiters).")
	waitersDesc      = desc("lockd_waiters", "Queued waiters.")
	inflightDesc     = desc("lockd_inflight_acquires", "Acquires being processed or queued.")
	connsDesc        = desc("lockd_connections", "Open client connections.")
	tokenHighestDesc = desc("lockd_token_highest_issued", "Highest fencing token issued (before any grant, one below the first token); a replacement process without this data dir must start above it with --first-token. Above 2^53 the value is rounded up, never down.")
	tokenMarkDesc    = desc("lockd_token_mark", "Token high-water mark recorded in the data dir: every token issued is below it, and a restart starts at it.")

	tokenReserveBusyDesc     = desc("lockd_token_reserve_busy_total", "Acquires answered B because the tokens reserved on disk had run out.")
	tokenReserveFailuresDesc = desc("lockd_token_reserve_failures_total", "Token marks the data dir could not record.")
	tokensIssuedDesc         = desc("lockd_tokens_issued_total", "Fencing tokens issued (grants).")
	writesDesc               = desc("lockd_response_writes_total", "Write calls carrying responses (at most 64 responses each).")
	wakeupsDesc              = desc("lockd_loop_wakeups_total", "Wake-ups of a connection's loop from outside its passes: grants and expiries from timers or another loop, overdue frames.")
	connsAcceptedDesc        = desc("lockd_connections_accepted_total", "Client connections accepted.")
	connsRejectedDesc        = desc("lockd_connections_rejected_total", "Connections closed at once because --max-conns was reached.")
	slowDroppedDesc          = desc("lockd_slow_clients_dropped_total", "Connections dropped for not reading their responses.")
	progressTimeoutsDesc     = desc("lockd_progress_timeouts_total", "Connections closed for a frame stalled past 5 s.")
	authFailuresDesc         = desc("lockd_auth_failures_total", "Failed handshakes.")
	connInflightBusyDesc     = desc("lockd_conn_inflight_busy_total", "B answers caused by --max-conn-inflight.")
	tlsHandshakeFailuresDesc = desc("lockd_tls_handshake_failures_total", "TLS port connections closed because the TLS handshake failed or took longer than 5 s (a client without TLS, a client certificate refused).")
	memoryReturnsDesc        = desc("lockd_memory_returns_total", "Times the memory a flood left was returned to the OS.")
	orphansQueuedDesc        = desc("lockd_orphan_grants_queued_total", "Grants to closed connections the backend queued for release (each released if its token is still current).")
	orphansDroppedDesc       = desc("lockd_orphan_grants_dropped_total", "Grants to closed connections left to lease expiry (release queue full).")
	leaseExpiriesDesc        = desc("lockd_lease_expiries_total", "Leases that ended by expiry rather than release (cluster mode: the expiries this node proposed as a group's leader).")
	abandonsDesc             = desc("lockd_abandons_total", "ABANDONs a session sent for its acquires that ended indeterminate, by what they found: a grant released, a queued waiter dropped, nothing.", "result")
	tombstonesDesc           = desc("lockd_tombstones", "Tombstones of abandoned acquires kept to refuse them should they arrive late (expired ones until the next sweep).")
	tombstonesEvictedDesc    = desc("lockd_tombstones_evicted_total", "Tombstones dropped before their time because their tenant reached its bound (each can cost a lease, never exclusion).")
	tombstoneRefusalsDesc    = desc("lockd_tombstone_refusals_total", "Acquires answered T because their session had abandoned them.")

	acquireDurationDesc = desc("lockd_acquire_duration_seconds", "Acquires from the arrival of the request to the write of its answer, by outcome (A acquired, T timeout, B busy, E error).", "outcome")
	queueWaitDesc       = desc("lockd_acquire_queue_wait_seconds", "Time granted waiters spent queued, from the acquire to the grant.")
	holdDesc            = desc("lockd_lock_hold_seconds", "Leases that ended, from grant to release or expiry (cluster mode: on the group's clock, counted by the group's leader).")
	buildInfoDesc       = desc("lockd_build_info", "The running build: module version, VCS revision, Go version; always 1.", "version", "revision", "goversion")
)

// serverCollector reads the server's atomics and the backend's Stats when
// /metrics is scraped, so that counting on the request path stays an
// atomic add.
type serverCollector struct{ s *Server }

func (serverCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		requestsDesc, responsesDesc, errorsDesc,
		gateOpenDesc, gateRefusedDesc, gateCountDesc, gateLimitDesc,
		tenantGateOpenDesc, tenantGateRefusedDesc, tenantGateCountDesc, tenantGateLimitDesc,
		keysDesc, waitersDesc, inflightDesc, connsDesc, tokenHighestDesc, tokenMarkDesc,
		tokenReserveBusyDesc, tokenReserveFailuresDesc, tokensIssuedDesc, writesDesc, wakeupsDesc,
		connsAcceptedDesc, connsRejectedDesc, slowDroppedDesc, progressTimeoutsDesc,
		authFailuresDesc, connInflightBusyDesc, tlsHandshakeFailuresDesc, memoryReturnsDesc,
		orphansQueuedDesc, orphansDroppedDesc, leaseExpiriesDesc,
		abandonsDesc, tombstonesDesc, tombstonesEvictedDesc, tombstoneRefusalsDesc,
		acquireDurationDesc, queueWaitDesc, holdDesc, buildInfoDesc,
	} {
		ch <- d
	}
}

func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	m := &c.s.metrics
	st := c.s.backend.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}

	for op := range opCount {
		counter(requestsDesc, m.requests[op].Load(), opNames[op])
	}
	for op := range opCount {
		for r := range resultCount {
			if v := m.results[op][r].Load(); v > 0 {
				counter(responsesDesc, v, opNames[op], resultNames[r])
			}
		}
	}
	for reason := codec.BadRequest; reason <= codec.ShuttingDown; reason++ {
		counter(errorsDesc, m.errors[reason].Load(), reason.String())
	}
	for _, g := range gatesOf(st.KeysGate, st.WaitersGate, st.InflightGate) {
		gauge(gateOpenDesc, openValue(g.st), g.name)
		counter(gateRefusedDesc, g.st.Refused, g.name)
		gauge(gateCountDesc, float64(g.st.Count), g.name)
		gauge(gateLimitDesc, float64(g.st.Limit), g.name)
	}
	// The tenants are those of the auth file, a bounded set.
	for _, ts := range st.Tenants {
		for _, g := range gatesOf(ts.KeysGate, ts.WaitersGate, ts.InflightGate) {
			gauge(tenantGateOpenDesc, openValue(g.st), ts.Tenant, g.name)
			counter(tenantGateRefusedDesc, g.st.Refused, ts.Tenant, g.name)
			gauge(tenantGateCountDesc, float64(g.st.Count), ts.Tenant, g.name)
			gauge(tenantGateLimitDesc, float64(g.st.Limit), ts.Tenant, g.name)
		}
	}
	gauge(keysDesc, float64(st.Keys))
	gauge(waitersDesc, float64(st.Waiters))
	gauge(inflightDesc, float64(st.Inflight))
	gauge(connsDesc, float64(c.s.conns.Load()))
	gauge(tokenHighestDesc, roundedUp(st.LastToken))
	if st.TokenMark != 0 {
		gauge(tokenMarkDesc, roundedUp(st.TokenMark))
		counter(tokenReserveBusyDesc, st.TokensUnreserved)
		counter(tokenReserveFailuresDesc, st.TokenReserveFailures)
	}
	counter(tokensIssuedDesc, st.TokensIssued)
	counter(writesDesc, m.writes.Load())
	counter(wakeupsDesc, m.wakeups.Load())
	counter(connsAcceptedDesc, m.connsAccepted.Load())
	counter(connsRejectedDesc, m.connsRejected.Load())
	counter(slowDroppedDesc, m.slowDropped.Load())
	counter(progressTimeoutsDesc, m.progressTimeouts.Load())
	counter(authFailuresDesc, m.authFailures.Load())
	counter(connInflightBusyDesc, m.connInflightBusy.Load())
	counter(tlsHandshakeFailuresDesc, m.tlsHandshakeFailures.Load())
	counter(memoryReturnsDesc, m.memoryReturns.Load())
	counter(orphansQueuedDesc, st.UndeliveredQueued)
	counter(orphansDroppedDesc, st.UndeliveredDropped)
	counter(leaseExpiriesDesc, st.LeaseExpiries)
	counter(abandonsDesc, st.AbandonsReleased, "released")
	counter(abandonsDesc, st.AbandonsDroppedWaiter, "waiter_dropped")
	counter(abandonsDesc, st.AbandonsNothing, "nothing")
	gauge(tombstonesDesc, float64(st.Tombstones))
	counter(tombstonesEvictedDesc, st.TombstonesEvicted)
	counter(tombstoneRefusalsDesc, st.TombstoneRefusals)

	var acquire [acquireOutcomes]histogram.Snapshot
	var queueWait histogram.Snapshot
	for i := range m.latency {
		for o := range acquireOutcomes {
			m.latency[i].acquire[o].AddTo(&acquire[o])
		}
		m.latency[i].queueWait.AddTo(&queueWait)
	}
	hist := func(d *prometheus.Desc, s *histogram.Snapshot, labels ...string) {
		ch <- prometheus.MustNewConstHistogram(d, s.Count(), s.Sum.Seconds(), s.Cumulative(), labels...)
	}
	for o := range acquireOutcomes {
		hist(acquireDurationDesc, &acquire[o], acquireOutcomeNames[o])
	}
	hist(queueWaitDesc, &queueWait)
	hist(holdDesc, &st.HoldTimes)
	ch <- prometheus.MustNewConstMetric(buildInfoDesc, prometheus.GaugeValue, 1, build.version, build.revision, build.goVersion)
}

// build is what lockd_build_info says of the running binary, read once
// from the build information the Go linker embeds.
var build = func() (b struct{ version, revision, goVersion string }) {
	b.version, b.revision, b.goVersion = "(devel)", "unknown", runtime.Version()
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if info.Main.Version != "" {
		b.version = info.Main.Version
	}
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified {
		b.revision += "-modified"
	}
	return b
}()

type namedGate struct {
	name string
	st   engine.GateStats
}

func gatesOf(keys, waiters, inflight engine.GateStats) [3]namedGate {
	return [3]namedGate{{"keys", keys}, {"waiters", waiters}, {"inflight", inflight}}
}

func openValue(g engine.GateStats) float64 {
	if g.Open {
		return 1
	}
	return 0
}

// roundedUp is v as a float64 that is not below it. A sample is a
// float64, exact only up to 2^53; a token read from /metrics must never
// read below one issued, or a process started above it could issue that
// token again.
func roundedUp(v uint64) float64 {
	f := float64(v)
	if f < math.MaxUint64 && uint64(f) < v { // float64(MaxUint64) is 2^64, above every v
		f = math.Nextafter(f, math.Inf(1))
	}
	return f
}
