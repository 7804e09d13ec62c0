package cluster

// The history checker of the multi-process tests: what the lock traffic's
// clients saw, judged for mutual exclusion and fencing.

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"
)

// interval is one client's claim on a key, as the client saw it: from
// receiving A until it sent its release, or, for a claim kept to its
// lease and never released, until its validity bound (SPEC §6: send
// instant + waited_ms + lease − margin), as far as a client trusts a
// lock. An acquire that ended Indeterminate is no claim (its client never
// saw a token, whether or not its ABANDON found a grant), nor is a grant
// that arrived after its validity: the traffic records neither.
type interval struct {
	key        string
	token      uint64
	start, end time.Time
	kept       bool
}

// how the claim ended, for a violation's message.
func (iv interval) how() string {
	if iv.kept {
		return "kept to its validity bound, never released"
	}
	return "released"
}

// checkHistory checks the recorded claims (after finish): per key, no claim
// began before the previous one ended, and tokens strictly increased. It
// fails the test for each violation and returns the number of claims
// checked.
func (lt *lockTraffic) checkHistory(t *testing.T) int {
	t.Helper()
	total, violations := lt.violations()
	for _, v := range violations {
		t.Error(v)
	}
	return total
}

// historyViolation is one breach of the lock's rules in the recorded
// history: an exclusion violation (two claims on a key overlapped) or a
// fencing violation (a token was not above the one before it).
type historyViolation struct {
	fencing bool
	at      time.Time // when the offending claim began
	msg     string
}

func (v historyViolation) String() string { return v.msg }

// violations judges the recorded claims (after finish), returning how many
// it checked and every violation found.
func (lt *lockTraffic) violations() (int, []historyViolation) {
	byKey := map[string][]interval{}
	for _, iv := range lt.history {
		byKey[iv.key] = append(byKey[iv.key], iv)
	}
	total := 0
	var found []historyViolation
	for key, ivs := range byKey {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].start.Before(ivs[j].start) })
		var prev interval
		for i, iv := range ivs {
			total++
			if i > 0 {
				if iv.token <= prev.token {
					found = append(found, historyViolation{fencing: true, at: iv.start,
						msg: fmt.Sprintf("%s: token went back: %d granted after %d", key, iv.token, prev.token)})
				}
				if iv.start.Before(prev.end) {
					found = append(found, historyViolation{at: iv.start,
						msg: fmt.Sprintf("%s: token %d granted %v before token %d's claim ended (%s)",
							key, iv.token, prev.end.Sub(iv.start), prev.token, prev.how())})
				}
			}
			if i == 0 || iv.end.After(prev.end) {
				prev = iv
			} else {
				prev.token = iv.token
			}
		}
	}
	return total, found
}

// The checker on a scripted history: a claim kept to its lease holds the
// key until its client's validity bound, so a grant 4 ms before that is
// an exclusion violation and one at the bound is none; a claim inside a
// longer one is a violation, and the key is free only at the longer
// one's end; a token below the one before is a fencing violation.
func TestHistoryChecker(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lt := &lockTraffic{history: []interval{
		{key: "k", token: 5, start: at(0), end: at(10)},
		{key: "k", token: 6, start: at(20), end: at(1000), kept: true},
		{key: "k", token: 7, start: at(996), end: at(1010)},
		{key: "j", token: 3, start: at(0), end: at(1000), kept: true},
		{key: "j", token: 4, start: at(1000), end: at(1005)},
		{key: "j", token: 2, start: at(1500), end: at(1505)},
		{key: "n", token: 10, start: at(0), end: at(1000), kept: true},
		{key: "n", token: 11, start: at(100), end: at(200)},
		{key: "n", token: 12, start: at(1000), end: at(1010)},
	}}
	total, found := lt.violations()
	var got []string
	fencing := 0
	for _, v := range found {
		got = append(got, v.String())
		if v.fencing {
			fencing++
		}
	}
	slices.Sort(got)
	want := []string{
		"j: token went back: 2 granted after 4",
		"k: token 7 granted 4ms before token 6's claim ended (kept to its validity bound, never released)",
		"n: token 11 granted 900ms before token 10's claim ended (kept to its validity bound, never released)",
	}
	if total != len(lt.history) || !slices.Equal(got, want) || fencing != 1 {
		t.Fatalf("%d claims checked, violations (%d of fencing):\n%q\nwant %d claims, 1 of fencing:\n%q", total, fencing, got, len(lt.history), want)
	}
}
