package server

// This file owns the connection budgets under --max-conns when auth is
// required: connections before their WELCOME share a small budget of
// their own (Config.MaxHandshakes) and must send HELLO within
// HandshakeTimeout, and with two or more tenants each tenant's
// authenticated connections are held to its share (auth file conns=N, or
// a fair share of what the handshakes leave). One tenant, or clients that
// never authenticate, can then no longer take every connection.

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HandshakeTimeout is how long a connection may take to send its HELLO
// when auth is required; then it is answered E auth_required and closed.
const HandshakeTimeout = 2 * time.Second

// errNoRoom refuses a connection its budget has no room for; it is
// counted, not logged.
var errNoRoom = errors.New("server: no room in the connection's budget")

// connBudget holds the connection counts of the handshake budget and of
// each tenant; its zero value (auth off) limits nothing.
type connBudget struct {
	maxHandshakes     int64 // 0: no budget
	handshakesOpen    atomic.Int64
	handshakesRefused atomic.Uint64
	tenants           map[string]*tenantConns // nil: no shares
}

// tenantConns is one tenant's authenticated connections.
type tenantConns struct {
	open    atomic.Int64
	limit   int64
	refused atomic.Uint64
}

// defaultMaxHandshakes is an eighth of the connection cap, at least 1 and
// at most 1024.
func defaultMaxHandshakes(maxConns int) int {
	return max(1, min(maxConns/8, 1024))
}

// init sizes the budgets of cfg (applyDefaults ran).
func (b *connBudget) init(cfg Config) {
	if cfg.Auth == nil {
		return
	}
	b.maxHandshakes = int64(cfg.MaxHandshakes)
	if len(cfg.Auth) < 2 {
		return
	}
	established := max(1, cfg.MaxConns-cfg.MaxHandshakes)
	share := int64((established + len(cfg.Auth) - 1) / len(cfg.Auth))
	b.tenants = make(map[string]*tenantConns, len(cfg.Auth))
	for tenant := range cfg.Auth {
		tc := &tenantConns{limit: share}
		if cfg.TenantConns != nil {
			if set := cfg.TenantConns(tenant); set > 0 {
				tc.limit = int64(set)
			}
		}
		b.tenants[tenant] = tc
	}
}

// enterHandshake takes a place in the handshake budget for a new
// connection; false when the budget is full.
func (b *connBudget) enterHandshake() bool {
	if b.maxHandshakes == 0 {
		return true
	}
	if b.handshakesOpen.Add(1) > b.maxHandshakes {
		b.handshakesOpen.Add(-1)
		b.handshakesRefused.Add(1)
		return false
	}
	return true
}

// welcome moves an authenticated connection of tenant out of the
// handshake budget into its tenant's share; false when that share is
// full, and the connection then holds nothing.
func (b *connBudget) welcome(tenant string) (*tenantConns, bool) {
	if b.maxHandshakes != 0 {
		b.handshakesOpen.Add(-1)
	}
	tc := b.tenants[tenant]
	if tc == nil {
		return nil, true
	}
	if tc.open.Add(1) > tc.limit {
		tc.open.Add(-1)
		tc.refused.Add(1)
		return nil, false
	}
	return tc, true
}

// leave gives back what a closing connection holds: its place in the
// handshake budget before WELCOME, its tenant's after.
func (b *connBudget) leave(welcomed bool, tc *tenantConns) {
	switch {
	case tc != nil:
		tc.open.Add(-1)
	case !welcomed && b.maxHandshakes != 0:
		b.handshakesOpen.Add(-1)
	}
}

var (
	handshakesOpenDesc     = desc("lockd_handshakes_open", "Connections open before their WELCOME (auth required).")
	handshakesLimitDesc    = desc("lockd_handshakes_limit", "Connections allowed open before their WELCOME (--max-handshakes; 0 with auth off).")
	handshakesRefusedDesc  = desc("lockd_handshakes_refused_total", "Connections closed at once because the handshake budget was full.")
	tenantConnsDesc        = desc("lockd_tenant_connections", "A tenant's authenticated connections.", "tenant")
	tenantConnsLimitDesc   = desc("lockd_tenant_connections_limit", "A tenant's connection share (auth file conns=N, or a fair share).", "tenant")
	tenantConnsRefusedDesc = desc("lockd_tenant_connections_refused_total", "Connections closed after a valid HELLO because the tenant's share was full.", "tenant")
)

// connBudgetCollector exports the budgets' counts, limits and refusals.
type connBudgetCollector struct{ s *Server }

func (connBudgetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{handshakesOpenDesc, handshakesLimitDesc, handshakesRefusedDesc,
		tenantConnsDesc, tenantConnsLimitDesc, tenantConnsRefusedDesc} {
		ch <- d
	}
}

func (c connBudgetCollector) Collect(ch chan<- prometheus.Metric) {
	b := &c.s.budget
	ch <- prometheus.MustNewConstMetric(handshakesOpenDesc, prometheus.GaugeValue, float64(b.handshakesOpen.Load()))
	ch <- prometheus.MustNewConstMetric(handshakesLimitDesc, prometheus.GaugeValue, float64(b.maxHandshakes))
	ch <- prometheus.MustNewConstMetric(handshakesRefusedDesc, prometheus.CounterValue, float64(b.handshakesRefused.Load()))
	for tenant, tc := range b.tenants {
		ch <- prometheus.MustNewConstMetric(tenantConnsDesc, prometheus.GaugeValue, float64(tc.open.Load()), tenant)
		ch <- prometheus.MustNewConstMetric(tenantConnsLimitDesc, prometheus.GaugeValue, float64(tc.limit), tenant)
		ch <- prometheus.MustNewConstMetric(tenantConnsRefusedDesc, prometheus.CounterValue, float64(tc.refused.Load()), tenant)
	}
}
