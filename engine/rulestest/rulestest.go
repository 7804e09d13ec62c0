// Package rulestest runs the lock rules' scenario scripts and the model
// check (model.go) against a wrapper of the rule core — the sharded
// engine, the cluster's replicated state machine — so that both modes are
// held to the same expected answers and the same invariants. It owns the
// script format, the model of the rules and its simulated clients, and a
// reference wrapper around engine.Engine; it knows nothing of sockets or
// Raft, and is imported by tests only.
//
// A script (testdata/*.txt) is a list of scenarios, each a title line
// "scenario: NAME" followed by one step per line; "#" starts a comment:
//
//	acquire KEY OWNER lease=10s wait=0s -> granted TOKEN WAITED
//	acquire KEY OWNER lease=10s wait=30s -> queued
//	release KEY OWNER -> released | 2 granted 2 3s, 3 timedout
//	release KEY token=7 -> notheld
//	keep KEY OWNER lease=10s -> renewed TOKEN
//	advance 1s
//	tick | 2 granted 2 7s
//	acquire KEY OWNER session=c1 lease=10s wait=30s -> queued
//	abandon KEY OWNER session=c1 -> released | 3 granted 4 0s
//	abandon-bound KEY session=c9 -> notheld
//
// KEY may be "TENANT/KEY" (default tenant "t1"). OWNER names the
// requester of an acquire, and for release and keep whose last granted
// token to use. After "|" come the resolutions of queued acquires the
// step must cause, in order ("OWNER ANSWER", comma-separated). tick lets
// every timer due at the current instant act: waits that elapsed, leases
// that ran out with waiters.
//
// SPEC §6a: session=NAME makes an acquire a request of the session NAME
// (a client_id made of the name's bytes), tagged with the requester
// engine.NewSessionKey(id).Requester(OWNER); an acquire without it has no
// session. abandon KEY OWNER session=NAME is that session's ABANDON of its
// request OWNER on KEY (released, or notheld, a dropped waiter answered
// timedout). abandon-bound KEY session=NAME abandons the owners 1 to
// engine.DefaultTombstonesPerTenant of NAME on KEY, each answered ANSWER:
// it fills the tenant's tombstones to their bound. Scenarios with these
// steps need an AbandonWrapper; a wrapper without one skips them.
package rulestest

import (
	"bufio"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

// Wrapper is one mode's rule core, driven by a fake clock that starts at
// an arbitrary instant and only moves by Advance.
type Wrapper interface {
	// Acquire answers at once: Granted, Queued, TimedOut or Busy.
	Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result
	Release(tenant, key string, token uint64) engine.Result
	Keep(tenant, key string, token uint64, lease time.Duration) engine.Result
	// Cancel withdraws owner's queued acquire, as the server does when its
	// connection closes, without resolving it; false when owner has no
	// acquire queued (it was answered, or cancelled already).
	Cancel(owner uint64) bool
	Advance(d time.Duration)
	// Tick lets the timers due now act.
	Tick()
	// Resolutions returns the queued acquires resolved since the last
	// call, in order, each once.
	Resolutions() []Resolution
}

// AbandonWrapper is a Wrapper that serves SPEC §6a, keeping the default
// bound of tombstones (engine.DefaultTombstonesPerTenant).
type AbandonWrapper interface {
	Wrapper
	// AcquireFor is Acquire of the request tagged r (0: no session).
	AcquireFor(tenant, key string, owner uint64, r engine.Requester, lease, wait time.Duration) engine.Result
	// Abandon is the ABANDON of the request tagged r on key: Released or
	// NotHeld; a waiter it drops is resolved TimedOut.
	Abandon(tenant, key string, r engine.Requester) engine.Result
}

// RequesterOf is the requester tag of owner's acquire in the script's
// session named session ("" is no session: 0).
func RequesterOf(session string, owner uint64) engine.Requester {
	if session == "" {
		return 0
	}
	var id [16]byte
	copy(id[:], session)
	return engine.NewSessionKey(id).Requester(owner)
}

// Resolution is the final answer to a queued acquire.
type Resolution struct {
	Owner  uint64
	Result engine.Result
}

func (r Resolution) String() string { return fmt.Sprintf("%d %s", r.Owner, formatResult(r.Result)) }

//go:embed testdata/*.txt
var scripts embed.FS

// Scenario is one titled list of steps.
type Scenario struct {
	Name  string
	Steps []Step
}

// Step is one line of a scenario.
type Step struct {
	Line     int
	Op       string // acquire, release, keep, abandon, abandon-bound, advance, tick
	Tenant   string
	Session  string // acquire, abandon, abandon-bound: session=NAME
	Key      string
	Owner    uint64
	Token    uint64 // release, keep: the token, when given as token=N
	Lease    time.Duration
	Wait     time.Duration
	By       time.Duration // advance
	Want     engine.Result
	Resolved []Resolution
}

// Scenarios parses every embedded script.
func Scenarios() ([]Scenario, error) {
	names, err := fs.Glob(scripts, "testdata/*.txt")
	if err != nil {
		return nil, err
	}
	var out []Scenario
	for _, name := range names {
		b, err := scripts.ReadFile(name)
		if err != nil {
			return nil, err
		}
		sc, err := Parse(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, sc...)
	}
	return out, nil
}

// Run runs every embedded scenario as a subtest on a fresh wrapper.
func Run(t *testing.T, fresh func(t *testing.T) Wrapper) {
	t.Helper()
	all, err := Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("no scenarios")
	}
	for _, sc := range all {
		t.Run(sc.Name, func(t *testing.T) { Play(t, fresh(t), sc) })
	}
}

// Play runs one scenario on w. A scenario with §6a steps is skipped when
// w is no AbandonWrapper.
func Play(t *testing.T, w Wrapper, sc Scenario) {
	t.Helper()
	aw, serves := w.(AbandonWrapper)
	if !serves && sc.needsAbandon() {
		t.Skipf("%T serves no SPEC §6a (no AbandonWrapper): scenario %q not run", w, sc.Name)
	}
	tokens := make(map[uint64]uint64) // owner -> last token granted
	noteGrant := func(owner uint64, r engine.Result) {
		if r.Outcome == engine.Granted {
			tokens[owner] = r.Token
		}
	}
	for _, st := range sc.Steps {
		where := fmt.Sprintf("line %d", st.Line)
		token := st.Token
		if token == 0 {
			token = tokens[st.Owner]
		}
		var got engine.Result
		switch st.Op {
		case "acquire":
			if st.Session != "" {
				got = aw.AcquireFor(st.Tenant, st.Key, st.Owner, RequesterOf(st.Session, st.Owner), st.Lease, st.Wait)
			} else {
				got = w.Acquire(st.Tenant, st.Key, st.Owner, st.Lease, st.Wait)
			}
			noteGrant(st.Owner, got)
		case "abandon":
			got = aw.Abandon(st.Tenant, st.Key, RequesterOf(st.Session, st.Owner))
		case "abandon-bound":
			got = st.Want
			for owner := uint64(1); owner <= engine.DefaultTombstonesPerTenant && got == st.Want; owner++ {
				got = aw.Abandon(st.Tenant, st.Key, RequesterOf(st.Session, owner))
			}
		case "release":
			got = w.Release(st.Tenant, st.Key, token)
		case "keep":
			got = w.Keep(st.Tenant, st.Key, token, st.Lease)
		case "advance":
			w.Advance(st.By)
		case "tick":
			w.Tick()
		}
		if got != st.Want {
			t.Fatalf("%s: %s %s/%s = %s, want %s", where, st.Op, st.Tenant, st.Key, formatResult(got), formatResult(st.Want))
		}
		res := w.Resolutions()
		for _, r := range res {
			noteGrant(r.Owner, r.Result)
		}
		if !slices.Equal(res, st.Resolved) {
			t.Fatalf("%s: resolutions %v, want %v", where, res, st.Resolved)
		}
	}
}

func (sc Scenario) needsAbandon() bool {
	return slices.ContainsFunc(sc.Steps, func(st Step) bool { return st.Session != "" })
}

// Parse reads a script.
func Parse(text string) ([]Scenario, error) {
	var out []Scenario
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if name, ok := strings.CutPrefix(line, "scenario:"); ok {
			out = append(out, Scenario{Name: strings.TrimSpace(name)})
			continue
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("line %d: a step before the first scenario", n)
		}
		st, err := parseStep(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		st.Line = n
		cur := &out[len(out)-1]
		cur.Steps = append(cur.Steps, st)
	}
	return out, sc.Err()
}

func parseStep(line string) (Step, error) {
	line, resolved, _ := strings.Cut(line, "|")
	call, want, hasWant := strings.Cut(line, "->")
	f := strings.Fields(call)
	if len(f) == 0 {
		return Step{}, fmt.Errorf("empty step")
	}
	st := Step{Op: f[0], Tenant: "t1"}
	var err error
	for _, r := range strings.Split(resolved, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		owner, answer, _ := strings.Cut(r, " ")
		var res Resolution
		if res.Owner, err = strconv.ParseUint(owner, 10, 64); err != nil {
			return Step{}, fmt.Errorf("resolution %q: %w", r, err)
		}
		if res.Result, err = parseResult(answer); err != nil {
			return Step{}, err
		}
		st.Resolved = append(st.Resolved, res)
	}
	switch st.Op {
	case "advance":
		if len(f) != 2 {
			return Step{}, fmt.Errorf("advance wants a duration")
		}
		st.By, err = time.ParseDuration(f[1])
		return st, err
	case "tick":
		if len(f) != 1 {
			return Step{}, fmt.Errorf("tick takes nothing")
		}
		return st, nil
	case "acquire", "release", "keep", "abandon", "abandon-bound":
	default:
		return Step{}, fmt.Errorf("unknown step %q", st.Op)
	}
	if !hasWant || len(f) < 3 {
		return Step{}, fmt.Errorf("%s wants KEY OWNER|token=N ... -> ANSWER", st.Op)
	}
	if tenant, key, ok := strings.Cut(f[1], "/"); ok {
		st.Tenant, st.Key = tenant, key
	} else {
		st.Key = f[1]
	}
	for _, arg := range f[2:] {
		name, val, isNamed := strings.Cut(arg, "=")
		switch {
		case !isNamed:
			st.Owner, err = strconv.ParseUint(arg, 10, 64)
		case name == "token":
			st.Token, err = strconv.ParseUint(val, 10, 64)
		case name == "lease":
			st.Lease, err = time.ParseDuration(val)
		case name == "wait":
			st.Wait, err = time.ParseDuration(val)
		case name == "session":
			st.Session = val
		default:
			err = fmt.Errorf("unknown argument %q", arg)
		}
		if err != nil {
			return Step{}, err
		}
	}
	if (st.Op == "abandon" || st.Op == "abandon-bound") && st.Session == "" {
		return Step{}, fmt.Errorf("%s wants session=NAME", st.Op)
	}
	st.Want, err = parseResult(want)
	return st, err
}

var outcomes = map[string]engine.Outcome{
	"granted":        engine.Granted,
	"queued":         engine.Queued,
	"timedout":       engine.TimedOut,
	"busy":           engine.Busy,
	"released":       engine.Released,
	"notheld":        engine.NotHeld,
	"tokenexhausted": engine.TokenExhausted,
	"renewed":        engine.Renewed,
}

// parseResult reads "granted TOKEN WAITED", "renewed TOKEN" or a bare outcome.
func parseResult(s string) (engine.Result, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return engine.Result{}, fmt.Errorf("missing answer")
	}
	o, ok := outcomes[f[0]]
	if !ok {
		return engine.Result{}, fmt.Errorf("unknown answer %q", f[0])
	}
	r := engine.Result{Outcome: o}
	var err error
	switch {
	case o == engine.Granted && len(f) == 3:
		if r.Token, err = strconv.ParseUint(f[1], 10, 64); err == nil {
			r.Waited, err = time.ParseDuration(f[2])
		}
	case o == engine.Renewed && len(f) == 2:
		r.Token, err = strconv.ParseUint(f[1], 10, 64)
	case o != engine.Granted && o != engine.Renewed && len(f) == 1:
	default:
		err = fmt.Errorf("answer %q: granted wants TOKEN WAITED, renewed wants TOKEN, others nothing", s)
	}
	return r, err
}

func formatResult(r engine.Result) string {
	for name, o := range outcomes {
		if o != r.Outcome {
			continue
		}
		switch o {
		case engine.Granted:
			return fmt.Sprintf("%s %d %v", name, r.Token, r.Waited)
		case engine.Renewed:
			return fmt.Sprintf("%s %d", name, r.Token)
		}
		return name
	}
	return r.Outcome.String()
}
