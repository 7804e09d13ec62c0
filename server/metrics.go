package server

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/lockd/lockd/codec"
	"github.com/lockd/lockd/engine"
)

type opKind uint8

const (
	opUnknown opKind = iota
	opHello
	opAcquire
	opRelease
	opKeep
	opPing
	opCount
)

var opNames = [opCount]string{"unknown", "hello", "acquire", "release", "keep", "ping"}

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

// writePrometheus writes the metrics in the Prometheus text format.
func (s *Server) writePrometheus(w io.Writer) {
	m := &s.metrics
	st := s.backend.Stats()
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }

	p("# HELP lockd_requests_total Frames received, by op.\n# TYPE lockd_requests_total counter\n")
	for op := range opCount {
		p("lockd_requests_total{op=%q} %d\n", opNames[op], m.requests[op].Load())
	}
	p("# HELP lockd_responses_total Responses sent, by request op and result.\n# TYPE lockd_responses_total counter\n")
	for op := range opCount {
		for r := range resultCount {
			if v := m.results[op][r].Load(); v > 0 {
				p("lockd_responses_total{op=%q,result=%q} %d\n", opNames[op], resultNames[r], v)
			}
		}
	}
	p("# HELP lockd_errors_total E responses, by reason.\n# TYPE lockd_errors_total counter\n")
	for reason := codec.BadRequest; reason <= codec.ShuttingDown; reason++ {
		p("lockd_errors_total{reason=%q} %d\n", reason.String(), m.errors[reason].Load())
	}
	p("# HELP lockd_gate_open Admission gate state (1 open, 0 closed).\n# TYPE lockd_gate_open gauge\n")
	p("# HELP lockd_gate_refused_total B answers caused by each admission gate.\n# TYPE lockd_gate_refused_total counter\n")
	p("# HELP lockd_gate_count Current count held against each gate's limit.\n# TYPE lockd_gate_count gauge\n")
	p("# HELP lockd_gate_limit Hard limit of each gate.\n# TYPE lockd_gate_limit gauge\n")
	for _, g := range []struct {
		name string
		st   engine.GateStats
	}{{"keys", st.KeysGate}, {"waiters", st.WaitersGate}, {"inflight", st.InflightGate}} {
		open := 0
		if g.st.Open {
			open = 1
		}
		p("lockd_gate_open{gate=%q} %d\n", g.name, open)
		p("lockd_gate_refused_total{gate=%q} %d\n", g.name, g.st.Refused)
		p("lockd_gate_count{gate=%q} %d\n", g.name, g.st.Count)
		p("lockd_gate_limit{gate=%q} %d\n", g.name, g.st.Limit)
	}
	writeTenantGates(p, st.Tenants)
	gauge := func(name, help string, v any) {
		p("# HELP %s %s\n# TYPE %s gauge\n%s %v\n", name, help, name, name, v)
	}
	counter := func(name, help string, v uint64) {
		p("# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	gauge("lockd_keys", "Live keys (held or with waiters).", st.Keys)
	gauge("lockd_held_locks", "Keys currently held.", st.HeldLocks)
	gauge("lockd_waiters", "Queued waiters.", st.Waiters)
	gauge("lockd_inflight_acquires", "Acquires being processed or queued.", st.Inflight)
	gauge("lockd_connections", "Open client connections.", s.conns.Load())
	gauge("lockd_token_counter", "Highest fencing token issued (before any grant, one below the first token); a replacement process without this data dir must start above it with --first-token.", st.LastToken)
	if st.TokenMark != 0 {
		gauge("lockd_token_mark", "Token high-water mark recorded in the data dir: every token issued is below it, and a restart starts at it.", st.TokenMark)
		counter("lockd_token_reserve_busy_total", "Acquires answered B because the tokens reserved on disk had run out.", st.TokensUnreserved)
		counter("lockd_token_reserve_failures_total", "Token marks the data dir could not record.", st.TokenReserveFailures)
	}
	counter("lockd_tokens_issued_total", "Fencing tokens issued (grants).", st.TokensIssued)
	counter("lockd_response_writes_total", "Write calls carrying responses (at most 64 responses each).", m.writes.Load())
	counter("lockd_connections_accepted_total", "Client connections accepted.", m.connsAccepted.Load())
	counter("lockd_connections_rejected_total", "Connections closed at once because --max-conns was reached.", m.connsRejected.Load())
	counter("lockd_tls_handshake_failures_total", "TLS port connections closed because the TLS handshake failed or took longer than 5 s (a client without TLS, a client certificate refused).", m.tlsHandshakeFailures.Load())
	counter("lockd_slow_clients_dropped_total", "Connections dropped for not reading their responses.", m.slowDropped.Load())
	counter("lockd_progress_timeouts_total", "Connections closed for a frame stalled past 5 s.", m.progressTimeouts.Load())
	counter("lockd_auth_failures_total", "Failed handshakes.", m.authFailures.Load())
	counter("lockd_conn_inflight_busy_total", "B answers caused by --max-conn-inflight.", m.connInflightBusy.Load())
	counter("lockd_memory_returns_total", "Times the memory a flood left was returned to the OS.", m.memoryReturns.Load())
	counter("lockd_orphan_grants_released_total", "Grants to closed connections released by the backend.", st.AbandonedReleased)
	counter("lockd_orphan_grants_dropped_total", "Grants to closed connections left to lease expiry (release queue full).", st.AbandonedDropped)
	if x, ok := s.backend.(interface{ WritePrometheus(io.Writer) }); ok {
		x.WritePrometheus(w) // cluster mode's own series
	}
}

// writeTenantGates writes the gates of the tenants with limits, one
// family at a time; the tenants are those of the auth file, a bounded set.
func writeTenantGates(p func(format string, a ...any), tenants []engine.TenantStats) {
	if len(tenants) == 0 {
		return
	}
	for _, family := range []struct {
		name, help, kind string
		value            func(engine.GateStats) any
	}{
		{"lockd_tenant_gate_open", "A tenant's own admission gate state (1 open, 0 closed).", "gauge", func(g engine.GateStats) any {
			if g.Open {
				return 1
			}
			return 0
		}},
		{"lockd_tenant_gate_refused_total", "B answers caused by a tenant's own gate.", "counter", func(g engine.GateStats) any { return g.Refused }},
		{"lockd_tenant_gate_count", "Current count held against a tenant's own limit.", "gauge", func(g engine.GateStats) any { return g.Count }},
		{"lockd_tenant_gate_limit", "A tenant's own limit (0: the global gate alone).", "gauge", func(g engine.GateStats) any { return g.Limit }},
	} {
		p("# HELP %s %s\n# TYPE %s %s\n", family.name, family.help, family.name, family.kind)
		for _, ts := range tenants {
			for _, g := range []struct {
				name string
				st   engine.GateStats
			}{{"keys", ts.KeysGate}, {"waiters", ts.WaitersGate}, {"inflight", ts.InflightGate}} {
				p("%s{tenant=%q,gate=%q} %v\n", family.name, ts.Tenant, g.name, family.value(g.st))
			}
		}
	}
}
