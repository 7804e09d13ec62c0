package cluster

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/engine/rulestest"
)

// groupWrapper drives one group's replicated state the way the nodes do,
// on a fake clock: every command is stamped with the clock; Tick is the
// node's wait timers (TimedOut for a wait that elapsed) and then the
// leader's expiry driver (a lease end for every lease due); a queued
// request is answered once, by whichever comes first, as the node's
// request registry does.
type groupWrapper struct {
	s        replicated
	now      time.Duration
	nextID   uint64
	waiting  map[uint64]time.Duration // owner -> wait deadline, queued and unanswered
	resolved []rulestest.Resolution
	out      applied
}

func newGroupWrapper() *groupWrapper {
	return &groupWrapper{s: newReplicated(1), now: 1_700_000_000 * time.Second, nextID: 1 << 40, waiting: make(map[uint64]time.Duration)}
}

// apply runs c and returns the answer to request id, routing the others.
func (w *groupWrapper) apply(c *command, id uint64) engine.Result {
	w.s.now = max(w.s.now, w.now)
	w.s.apply(c, &w.out)
	var got engine.Result
	for _, a := range w.out.answers {
		switch {
		case a.kind == answerDirect && a.id == id:
			got = a.r
		case a.kind == answerHandOff:
			w.answer(a.id, a.r)
		}
	}
	w.out.answers = w.out.answers[:0]
	w.out.leases = w.out.leases[:0]
	return got
}

func (w *groupWrapper) answer(owner uint64, r engine.Result) {
	if _, ok := w.waiting[owner]; ok {
		delete(w.waiting, owner)
		w.resolved = append(w.resolved, rulestest.Resolution{Owner: owner, Result: r})
	}
}

func (w *groupWrapper) request() uint64 { w.nextID++; return w.nextID }

func (w *groupWrapper) Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result {
	c := command{kind: cmdAcquire, node: 1, id: owner, lease: uint16(lease / time.Second), wait: int64(wait), keyLimit: 1 << 20, tenant: []byte(tenant), key: []byte(key)}
	r := w.apply(&c, owner)
	if r.Outcome == engine.Queued {
		w.waiting[owner] = w.now + wait
	}
	return r
}

func (w *groupWrapper) Release(tenant, key string, token uint64) engine.Result {
	id := w.request()
	c := command{kind: cmdRelease, node: 1, id: id, token: token, tenant: []byte(tenant), key: []byte(key)}
	return w.apply(&c, id)
}

func (w *groupWrapper) Keep(tenant, key string, token uint64, lease time.Duration) engine.Result {
	id := w.request()
	k := lockKey([]byte(tenant), []byte(key))
	var renewals uint32
	if l := w.s.locks[k]; l != nil && l.Token == token {
		renewals = l.renewals
	}
	c := command{kind: cmdKeep, node: 1, id: id, token: token, renewals: renewals, lease: uint16(lease / time.Second), tenant: []byte(tenant), key: []byte(key)}
	return w.apply(&c, id)
}

func (w *groupWrapper) Advance(d time.Duration) { w.now += d }

func (w *groupWrapper) Tick() {
	// What fell due, in the order of the instants it fell due at, as the
	// engine's timer heap and the node's timers with the leader's expiry
	// heap take them.
	type event struct {
		at    time.Duration
		owner uint64 // a wait that elapsed
		key   string // a lease that ran out
	}
	var due []event
	for owner, deadline := range w.waiting {
		if deadline <= w.now {
			due = append(due, event{at: deadline, owner: owner})
		}
	}
	for k, l := range w.s.locks {
		if l.Lapsed(w.now) {
			due = append(due, event{at: l.End, key: k})
		}
	}
	slices.SortFunc(due, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.owner, b.owner), cmp.Compare(a.key, b.key))
	})
	for _, e := range due {
		if e.key == "" {
			w.answer(e.owner, engine.Result{Outcome: engine.TimedOut})
			continue
		}
		l := w.s.locks[e.key]
		if l == nil || !l.Lapsed(w.now) {
			continue
		}
		tenant, key := splitLockKey(e.key)
		c := command{kind: cmdLeaseEnd, token: l.Token, renewals: l.renewals, tenant: []byte(tenant), key: key}
		w.apply(&c, 0)
	}
}

func (w *groupWrapper) Resolutions() []rulestest.Resolution {
	r := w.resolved
	w.resolved = nil
	return r
}

// The cluster's state machine answers the lock rules' scripts as the
// engine does (engine.TestRuleScenarios): a lapsed lease is free, a late
// release or keep is NotHeld, judged on the group's clock.
func TestRuleScenarios(t *testing.T) {
	rulestest.Run(t, func(*testing.T) rulestest.Wrapper { return newGroupWrapper() })
}

// Random histories of acquires, releases, keeps and time on one key get
// the same answers from the engine and from the cluster's state machine,
// and those answers keep the model check's client-side promises
// (holders): no two clients hold the key at once by their own validity,
// tokens strictly increase, and a holder within its validity is never
// refused its release or renewal.
// One key, because the rules are per key and because on several keys two
// leases that end at the same instant are taken in an order neither mode
// promises, which numbers the tokens they hand off differently.
func TestRulesAgreeWithTheEngine(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			single, group := rulestest.NewEngineWrapper(), newGroupWrapper()
			// Releases and keeps mostly name a recent grant, so that many
			// are current and some are late; the rest name any token.
			type holding struct {
				tenant, key string
				token       uint64
			}
			var grants []holding
			pick := func() (string, string, uint64) {
				switch {
				case len(grants) > 0 && rng.IntN(4) > 0:
					h := grants[max(0, len(grants)-1-rng.IntN(8))]
					return h.tenant, h.key, h.token
				case rng.IntN(2) == 0:
					return []string{"t1", "t2"}[rng.IntN(2)], []string{"k", "other"}[rng.IntN(2)], uint64(rng.IntN(len(grants) + 2))
				}
				return "t1", "k", uint64(rng.IntN(len(grants) + 2))
			}
			exercised := map[engine.Outcome]int{}
			owner := uint64(0)
			view := newHolders()
			leaseOf := map[uint64]time.Duration{} // owner -> lease of its acquire
			for step := range 5000 {
				// Every call at its own instant, so that no two deadlines
				// tie and the order things fall due in is the same for both.
				d := time.Duration(1 + rng.IntN(1_000_000))
				single.Advance(d)
				group.Advance(d)
				// Acquires all go to t1/k; a release or keep sometimes names
				// another tenant's key of the same name, or another key.
				tenant, key := "t1", "k"
				lease := time.Duration(1+rng.IntN(8)) * time.Second
				var a, b engine.Result
				var what string
				switch rng.IntN(10) {
				case 0, 1, 2:
					owner++
					var wait time.Duration
					if rng.IntN(3) > 0 {
						wait = time.Duration(1+rng.IntN(8)) * time.Second
					}
					what = fmt.Sprintf("acquire %s/%s %d lease=%v wait=%v", tenant, key, owner, lease, wait)
					a, b = single.Acquire(tenant, key, owner, lease, wait), group.Acquire(tenant, key, owner, lease, wait)
					leaseOf[owner] = lease
					if a.Outcome == engine.Granted {
						grants = append(grants, holding{tenant, key, a.Token})
						if err := view.granted(a.Token, group.now, lease); err != nil {
							t.Fatalf("step %d: %s: %v", step, what, err)
						}
					}
				case 3, 4:
					tenant, key, token := pick()
					what = fmt.Sprintf("release %s/%s token=%d", tenant, key, token)
					a, b = single.Release(tenant, key, token), group.Release(tenant, key, token)
					if tenant == "t1" && key == "k" {
						if err := view.released(token, group.now, a.Outcome); err != nil {
							t.Fatalf("step %d: %s: %v", step, what, err)
						}
					}
				case 5, 6:
					tenant, key, token := pick()
					what = fmt.Sprintf("keep %s/%s token=%d lease=%v", tenant, key, token, lease)
					a, b = single.Keep(tenant, key, token, lease), group.Keep(tenant, key, token, lease)
					if tenant == "t1" && key == "k" {
						if err := view.kept(token, group.now, lease, a.Outcome); err != nil {
							t.Fatalf("step %d: %s: %v", step, what, err)
						}
					}
				default:
					d := time.Duration(rng.IntN(1500)) * time.Millisecond
					what = fmt.Sprintf("advance %v; tick", d)
					single.Advance(d)
					group.Advance(d)
					single.Tick()
					group.Tick()
				}
				if a != b {
					t.Fatalf("step %d: %s: engine %+v, cluster %+v", step, what, a, b)
				}
				exercised[a.Outcome]++
				ra, rb := sorted(single.Resolutions()), sorted(group.Resolutions())
				if !slices.Equal(ra, rb) {
					t.Fatalf("step %d: %s: engine resolved %v, cluster %v", step, what, ra, rb)
				}
				for _, r := range ra {
					exercised[r.Result.Outcome]++
					if r.Result.Outcome == engine.Granted {
						grants = append(grants, holding{"t1", "k", r.Result.Token})
						if err := view.granted(r.Result.Token, group.now, leaseOf[r.Owner]); err != nil {
							t.Fatalf("step %d: %s: owner %d: %v", step, what, r.Owner, err)
						}
					}
				}
			}
			for _, o := range []engine.Outcome{engine.Granted, engine.Queued, engine.TimedOut, engine.Released, engine.NotHeld, engine.Renewed} {
				if exercised[o] == 0 {
					t.Fatalf("the history never produced %v: %v", o, exercised)
				}
			}
		})
	}
}

func sorted(rs []rulestest.Resolution) []rulestest.Resolution {
	slices.SortFunc(rs, func(a, b rulestest.Resolution) int { return cmp.Compare(a.Owner, b.Owner) })
	return rs
}

// holders is what the clients of one key believe: each grant is theirs
// from its answer until the answer's instant + lease (or a renewal's),
// unless released first.
type holders struct {
	validUntil map[uint64]time.Duration // token -> end of its holder's validity
	last       uint64                   // the last token granted
}

func newHolders() *holders { return &holders{validUntil: map[uint64]time.Duration{}} }

func (h *holders) granted(token uint64, now, lease time.Duration) error {
	if token <= h.last {
		return fmt.Errorf("token %d granted after token %d", token, h.last)
	}
	for other, until := range h.validUntil {
		if now < until {
			return fmt.Errorf("token %d granted while the holder of token %d believes it holds the key until %v (now %v)", token, other, until, now)
		}
	}
	h.last = token
	h.validUntil[token] = now + lease
	return nil
}

func (h *holders) valid(token uint64, now time.Duration) bool {
	until, ok := h.validUntil[token]
	return ok && now < until
}

func (h *holders) released(token uint64, now time.Duration, got engine.Outcome) error {
	if _, err := h.answered("release", token, now, got, engine.Released); err != nil {
		return err
	}
	delete(h.validUntil, token)
	return nil
}

func (h *holders) kept(token uint64, now, lease time.Duration, got engine.Outcome) error {
	valid, err := h.answered("renewal", token, now, got, engine.Renewed)
	if valid && err == nil {
		h.validUntil[token] = now + lease
	}
	return err
}

// answered checks a release or renewal of token at now that got answered
// got: success (ok) exactly when its holder is within its validity. It
// reports that validity.
func (h *holders) answered(what string, token uint64, now time.Duration, got, ok engine.Outcome) (bool, error) {
	valid := h.valid(token, now)
	switch {
	case valid && got != ok:
		return valid, fmt.Errorf("the holder of token %d, valid until %v, was refused its %s at %v: %v", token, h.validUntil[token], what, now, got)
	case !valid && got == ok:
		return valid, fmt.Errorf("%s of token %d accepted at %v outside its holder's validity", what, token, now)
	}
	return valid, nil
}
