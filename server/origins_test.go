package server

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
)

// TestOriginsShowOnlyTheGrantTheSlotHolds: a recorded grant is found by
// its key and token, in IPv4 and IPv6; another token of the key, the
// same token of another key, and a grant overwritten by a later one in
// its slot are not found rather than found wrong.
func TestOriginsShowOnlyTheGrantTheSlotHolds(t *testing.T) {
	o := newOrigins()
	v4 := netip.MustParseAddrPort("127.0.0.1:40001")
	v6 := netip.MustParseAddrPort("[2001:db8::7]:40002")
	name := func(tenant, key string) uint64 { return o.originKey(o.tenantOrigin(tenant), []byte(key)) }
	jobs, cron := name("acme", "jobs"), name("acme", "cron")
	if jobs == name("other", "jobs") || name("ab", "c") == name("a", "bc") || name("x", "y") == name("y", "x") {
		t.Fatal("two (tenant, key) pairs share a name")
	}
	o.record(jobs, 7, v4)
	o.record(cron, 8, v6)
	for _, tt := range []struct {
		name          string
		origin, token uint64
		want          netip.AddrPort
		found         bool
	}{
		{"ipv4 grant", jobs, 7, v4, true},
		{"ipv6 grant", cron, 8, v6, true},
		{"another token of the key", jobs, 8, netip.AddrPort{}, false},
		{"the token of another key", name("acme", "mail"), 7, netip.AddrPort{}, false},
	} {
		if got, found := o.lookup(tt.origin, tt.token); got != tt.want || found != tt.found {
			t.Errorf("%s: %v %v, want %v %v", tt.name, got, found, tt.want, tt.found)
		}
	}

	// A key sharing jobs's slot: its grant overwrites jobs's.
	other := jobs + originSlots
	o.record(other, 9, v6)
	if got, found := o.lookup(jobs, 7); found {
		t.Errorf("overwritten grant found: %v", got)
	}
	if got, _ := o.lookup(other, 9); got != v6 {
		t.Errorf("the later grant: %v, want %v", got, v6)
	}
	o.record(jobs, 10, netip.AddrPort{}) // not a TCP connection: nothing to record
	if got, _ := o.lookup(other, 9); got != v6 {
		t.Errorf("after an invalid address: %v, want %v", got, v6)
	}
}

// TestOriginsNeverMixTwoGrants: writers racing on one slot, each writing
// a grant whose address is derived from its token, never leave a reader a
// token with another grant's address, and the reader holds no writer up:
// once they are done, the slot holds the last grant one of them recorded.
func TestOriginsNeverMixTwoGrants(t *testing.T) {
	o := newOrigins()
	const origin, writers, grants = 12345, 4, 5000
	addrOf := func(token uint64) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(token >> 8), byte(token)}), uint16(token))
	}
	var latest [writers]atomic.Uint64 // each writer's last recorded token
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range uint64(grants) {
				token := uint64(w)*grants + i + 1
				o.record(origin, token, addrOf(token))
				latest[w].Store(token)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	check := func() (found int) {
		for w := range latest {
			token := latest[w].Load()
			if got, ok := o.lookup(origin, token); ok {
				found++
				if got != addrOf(token) {
					t.Fatalf("token %d: %v, another grant's address", token, got)
				}
			}
		}
		return found
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			check()
		}
	}
	if found := check(); found != 1 {
		t.Errorf("with the writers done, %d of their last grants found, want the one the slot holds", found)
	}
	if _, ok := o.lookup(origin, 0); ok {
		t.Error("token 0, never granted, found")
	}
}

// BenchmarkOriginRecord is what the origins table adds to a granted
// ACQUIRE: naming its key, then recording the grant.
func BenchmarkOriginRecord(b *testing.B) {
	o := newOrigins()
	key := []byte("jobs/nightly-report")
	remote := netip.MustParseAddrPort("127.0.0.1:40001")
	b.ReportAllocs()
	tenant := o.tenantOrigin("default")
	for i := range b.N {
		o.record(o.originKey(tenant, key), uint64(i), remote)
	}
}
