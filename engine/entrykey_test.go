package engine

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Keys of many lengths sharing prefixes, taken and given back at random in
// one shard, pass through the same few reused entries: every held key
// shows whole, with its own token, in Inspect and in List, so a reused
// buffer never shows another key's bytes or a key cut short.
func TestReusedEntriesKeepEveryKeyWhole(t *testing.T) {
	e := New(Config{Clock: NewFakeClock(), Shards: 1, MaxKeys: 64})
	ns := e.Namespace("t")
	rng := rand.New(rand.NewPCG(7, 49))
	held := map[string]uint64{}
	for step := range 5000 {
		// 'k' repeated n times, then one byte: "kkkk0" and "kkkkkkk3" share
		// a prefix, and lengths cross the 16-byte steps of the buffers.
		n := 1 + rng.IntN(70)
		key := append(bytes.Repeat([]byte("k"), n), byte('0'+rng.IntN(4)))
		if token, ok := held[string(key)]; ok {
			if r := e.Release(ns, key, token); r.Outcome != Released {
				t.Fatalf("step %d: release %q: %v", step, key, r.Outcome)
			}
			delete(held, string(key))
		} else if len(held) < 8 {
			r, _ := e.Acquire(ns, key, 1, 0, time.Minute, 0, nil)
			if r.Outcome != Granted {
				t.Fatalf("step %d: acquire %q: %v", step, key, r.Outcome)
			}
			held[string(key)] = r.Token
		}
		var want []LockInfo
		for k, token := range held {
			info := e.Inspect(ns, []byte(k))
			if info.Key != k || !info.Held || info.Token != token {
				t.Fatalf("step %d: Inspect(%q) = %+v, want held with token %d", step, k, info, token)
			}
			want = append(want, info)
		}
		slices.SortFunc(want, func(a, b LockInfo) int { return bytes.Compare([]byte(a.Key), []byte(b.Key)) })
		if got := e.List(ns, nil, 100); !slices.Equal(got, want) {
			t.Fatalf("step %d: List = %+v, want %+v", step, got, want)
		}
	}
}

// A key longer than MaxKeyLen is refused, not stored with its length cut
// to 16 bits (65536 bytes would become the empty key): nothing is held or
// admitted, and a key of exactly MaxKeyLen bytes works whole.
func TestAcquireRefusesAKeyPastMaxKeyLen(t *testing.T) {
	e := New(Config{Clock: NewFakeClock()})
	ns := e.Namespace("t")
	long := bytes.Repeat([]byte("x"), MaxKeyLen+1)
	if r, w := e.Acquire(ns, long, 1, 0, time.Minute, time.Second, &recorder{}); r.Outcome != Busy || w != nil {
		t.Fatalf("acquire of a %d-byte key: %v, %v; want Busy, no wait", len(long), r.Outcome, w)
	}
	if st := e.Stats(); st.Keys != 0 || st.Waiters != 0 || st.Inflight != 0 {
		t.Fatalf("after the refusal: keys %d, waiters %d, in flight %d; want none", st.Keys, st.Waiters, st.Inflight)
	}
	for _, k := range [][]byte{long, {}} {
		if info := e.Inspect(ns, k); info.Held {
			t.Fatalf("a %d-byte key is held after the refusal", len(k))
		}
	}

	longest := long[:MaxKeyLen]
	r, _ := e.Acquire(ns, longest, 1, 0, time.Minute, 0, nil)
	if r.Outcome != Granted {
		t.Fatalf("acquire of a %d-byte key: %v, want Granted", len(longest), r.Outcome)
	}
	if got := e.List(ns, nil, 10); len(got) != 1 || got[0].Key != string(longest) || got[0].Token != r.Token {
		t.Fatalf("List after a %d-byte grant: %d locks, want the key whole", len(longest), len(got))
	}
	if rr := e.Release(ns, long, r.Token); rr.Outcome != NotHeld {
		t.Fatalf("release of the %d-byte key: %v, want NotHeld", len(long), rr.Outcome)
	}
	if rr := e.Release(ns, longest, r.Token); rr.Outcome != Released {
		t.Fatalf("release of the %d-byte key: %v, want Released", len(longest), rr.Outcome)
	}
}
