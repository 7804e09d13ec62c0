package engine_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
	"github.com/lockd/lockd/engine/rulestest"
)

// newModelEngine is the engine the model check runs on: four shards, so
// that keys share token counters and shard locks, with the seed's limits.
func newModelEngine(l rulestest.Limits) rulestest.Wrapper {
	return newModelEngineWrapper(l)
}

func newModelEngineWrapper(l rulestest.Limits) *rulestest.EngineWrapper {
	return rulestest.NewEngineWrapper(engine.Config{Shards: 4, MaxKeys: l.MaxKeys, MaxWaiters: l.MaxWaiters, MaxInflight: l.MaxInflight})
}

// TestModelCheck runs the model check (engine/rulestest) on the engine: 8
// seeds × 200k steps (1.6M in all; 200k with -short), with the engine's
// counters, sweep and shutdown checked too. A failure names its seed and
// step; rerun it alone with -model.seed.
func TestModelCheck(t *testing.T) {
	rulestest.CheckModel(t, rulestest.ModelRun{Package: "./engine", Steps: 200_000, ShortSteps: 25_000, New: newModelEngine})
}

// TestModelCheckIsDeterministic proves that a seed reproduces exactly: two
// runs of one seed make the same calls and get the same answers.
func TestModelCheckIsDeterministic(t *testing.T) {
	const steps = 20_000
	for _, seed := range []uint64{11, 12} {
		a, b := rulestest.NewModel(seed, newModelEngine), rulestest.NewModel(seed, newModelEngine)
		if err := a.Run(steps); err != nil {
			t.Fatal(err)
		}
		if err := b.Run(steps); err != nil {
			t.Fatal(err)
		}
		if a.Trace() != b.Trace() || a.Counts() != b.Counts() {
			t.Fatalf("seed %d: traces %016x and %016x, counts %s and %s",
				seed, a.Trace(), b.Trace(), a.Counts(), b.Counts())
		}
	}
	if modelTrace(t, 11) == modelTrace(t, 13) {
		t.Fatal("different seeds gave the same trace: the trace does not record the run")
	}
}

func modelTrace(t *testing.T, seed uint64) uint64 {
	m := rulestest.NewModel(seed, newModelEngine)
	if err := m.Run(5_000); err != nil {
		t.Fatal(err)
	}
	return m.Trace()
}

// TestModelCheckCatchesViolations runs the model check on engines broken
// the ways a lock server can be, so the model is known to fail when the
// rules are broken: each must be caught within a short run, by the check
// that names its fault.
func TestModelCheckCatchesViolations(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wrap  func(*rulestest.EngineWrapper) rulestest.Wrapper
		fault string // what the model's failure says
	}{
		{"grants a held key", func(w *rulestest.EngineWrapper) rulestest.Wrapper { return &grantsHeldKeys{EngineWrapper: w} }, "mutual exclusion"},
		{"refuses a valid release", func(w *rulestest.EngineWrapper) rulestest.Wrapper { return refusesReleases{w} }, "want released"},
		{"grants shorter leases", func(w *rulestest.EngineWrapper) rulestest.Wrapper { return shortensLeases{w} }, "want renewed"},
		{"cancel leaves the wait queued", func(w *rulestest.EngineWrapper) rulestest.Wrapper {
			return &ignoresCancel{Wrapper: w, queued: make(map[uint64]bool)}
		}, "not pending"},
		{"cancel of an answered wait succeeds", func(w *rulestest.EngineWrapper) rulestest.Wrapper { return cancelsAnything{w} }, "whose wait is over"},
		{"acquires without their requester", func(w *rulestest.EngineWrapper) rulestest.Wrapper { return forgetsRequesters{w} }, "abandon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Seed 11 runs without limits, so the broken answers are not
			// also counted against the gates.
			m := rulestest.NewModel(11, func(l rulestest.Limits) rulestest.Wrapper { return tc.wrap(newModelEngineWrapper(l)) })
			err := m.Run(20_000)
			if err == nil {
				t.Fatal("the model check passed a broken engine")
			}
			if !strings.Contains(strings.ToLower(err.Error()), tc.fault) {
				t.Fatalf("the model check failed with %q, want a failure about %q", err, tc.fault)
			}
		})
	}
}

// grantsHeldKeys answers a wait-0 acquire of a held key with a grant of a
// fresh token instead of TimedOut.
type grantsHeldKeys struct {
	*rulestest.EngineWrapper
	forged uint64
}

func (w *grantsHeldKeys) Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result {
	return w.AcquireFor(tenant, key, owner, 0, lease, wait)
}

func (w *grantsHeldKeys) AcquireFor(tenant, key string, owner uint64, r engine.Requester, lease, wait time.Duration) engine.Result {
	res := w.EngineWrapper.AcquireFor(tenant, key, owner, r, lease, wait)
	if res.Outcome == engine.TimedOut {
		w.forged++
		return engine.Result{Outcome: engine.Granted, Token: 1<<40 + w.forged}
	}
	return res
}

// refusesReleases answers every release NotHeld.
type refusesReleases struct{ *rulestest.EngineWrapper }

func (w refusesReleases) Release(string, string, uint64) engine.Result {
	return engine.Result{Outcome: engine.NotHeld}
}

// shortensLeases grants half the lease asked for.
type shortensLeases struct{ *rulestest.EngineWrapper }

func (w shortensLeases) Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result {
	return w.AcquireFor(tenant, key, owner, 0, lease, wait)
}

func (w shortensLeases) AcquireFor(tenant, key string, owner uint64, r engine.Requester, lease, wait time.Duration) engine.Result {
	return w.EngineWrapper.AcquireFor(tenant, key, owner, r, lease/2, wait)
}

// ignoresCancel says it cancelled a queued acquire but leaves it queued.
// It hides the engine's counters (it embeds only the Wrapper), which
// would notice first, so that the check every wrapper gets catches it.
type ignoresCancel struct {
	rulestest.Wrapper
	queued map[uint64]bool
}

func (w *ignoresCancel) Acquire(tenant, key string, owner uint64, lease, wait time.Duration) engine.Result {
	r := w.Wrapper.Acquire(tenant, key, owner, lease, wait)
	if r.Outcome == engine.Queued {
		w.queued[owner] = true
	}
	return r
}

func (w *ignoresCancel) Resolutions() []rulestest.Resolution {
	res := w.Wrapper.Resolutions()
	for _, r := range res {
		delete(w.queued, r.Owner)
	}
	return res
}

func (w *ignoresCancel) Cancel(owner uint64) bool {
	queued := w.queued[owner]
	delete(w.queued, owner)
	return queued
}

// cancelsAnything answers every cancel true.
type cancelsAnything struct{ *rulestest.EngineWrapper }

func (w cancelsAnything) Cancel(owner uint64) bool {
	w.EngineWrapper.Cancel(owner)
	return true
}

// forgetsRequesters acquires without the requester (SPEC §6a): its grants
// and waiters cannot be abandoned, and its tombstones refuse nothing.
type forgetsRequesters struct{ *rulestest.EngineWrapper }

func (w forgetsRequesters) AcquireFor(tenant, key string, owner uint64, _ engine.Requester, lease, wait time.Duration) engine.Result {
	return w.EngineWrapper.AcquireFor(tenant, key, owner, 0, lease, wait)
}
