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
//
// KEY may be "TENANT/KEY" (default tenant "t1"). OWNER names the
// requester of an acquire, and for release and keep whose last granted
// token to use. After "|" come the resolutions of queued acquires the
// step must cause, in order ("OWNER ANSWER", comma-separated). tick lets
// every timer due at the current instant act: waits that elapsed, leases
// that ran out with waiters.
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
	Op       string // acquire, release, keep, advance, tick
	Tenant   string
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

// Play runs one scenario on w.
func Play(t *testing.T, w Wrapper, sc Scenario) {
	t.Helper()
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
			got = w.Acquire(st.Tenant, st.Key, st.Owner, st.Lease, st.Wait)
			noteGrant(st.Owner, got)
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
	case "acquire", "release", "keep":
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
		default:
			err = fmt.Errorf("unknown argument %q", arg)
		}
		if err != nil {
			return Step{}, err
		}
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
