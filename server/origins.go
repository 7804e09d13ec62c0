package server

import (
	"encoding/binary"
	"hash/maphash"
	"net"
	"net/netip"
	"sync/atomic"
)

// This file owns the origins table: for lock inspection, the remote
// address of the connection each recent grant was delivered on. A grant
// is recorded when its A is written to its connection; inspection shows
// the address only while the key's slot still holds that exact grant
// (key and token), and nothing otherwise. It is a fixed array of slots,
// each a seqlock of atomic words, written from the connections' loops
// without a lock, without waiting and without allocating; a reader never
// holds a writer up.

// originSlots is how many grants the table remembers at most: a later
// grant of a key whose slot is taken overwrites the older one. 65 536
// slots of 48 bytes are 3 MiB.
const originSlots = 1 << 16

// origins maps (tenant, key, token) to the remote address the grant went
// to. Its zero value is not usable: see newOrigins.
type origins struct {
	tenantSeed, keySeed maphash.Seed
	slots               []originSlot
}

// originSlot is one recorded grant: seq is odd while a writer fills the
// slot, and a reader that sees it change reads again. key is 0 while the
// slot is empty (originKey is never 0). The address is kept as words, not
// as a netip.AddrPort, so that the table holds no pointer for the
// collector to scan; the zone of a link-local IPv6 address is not kept.
type originSlot struct {
	seq   atomic.Uint64
	key   atomic.Uint64
	token atomic.Uint64
	// addrHi and addrLo are the address in its 16-byte form; port holds
	// the port, with originIPv4 set for an IPv4 address.
	addrHi, addrLo atomic.Uint64
	port           atomic.Uint64
}

const originIPv4 = 1 << 16

func newOrigins() *origins {
	return &origins{tenantSeed: maphash.MakeSeed(), keySeed: maphash.MakeSeed(), slots: make([]originSlot, originSlots)}
}

// tenantOrigin is the part of originKey that depends on the tenant alone,
// which a connection computes once.
func (o *origins) tenantOrigin(tenant string) uint64 { return maphash.String(o.tenantSeed, tenant) }

// originKey names key of the tenant whose tenantOrigin is tenant; never
// 0. The tenant's and the key's hashes have seeds of their own, so that
// swapping a tenant's name and a key's does not give the same name.
func (o *origins) originKey(tenant uint64, key []byte) uint64 {
	return (tenant ^ maphash.Bytes(o.keySeed, key)) | 1
}

// record notes that the grant of token for the key named origin went to
// remote. A writer that finds another one filling the slot leaves it to
// that one: the slot then holds the other grant, and inspection of this
// one shows no address rather than a wrong one.
func (o *origins) record(origin, token uint64, remote netip.AddrPort) {
	if !remote.IsValid() {
		return
	}
	s := &o.slots[origin&(originSlots-1)]
	seq := s.seq.Load()
	if seq&1 != 0 || !s.seq.CompareAndSwap(seq, seq+1) {
		return
	}
	a := remote.Addr()
	b := a.As16()
	port := uint64(remote.Port())
	if a.Is4() {
		port |= originIPv4
	}
	s.key.Store(origin)
	s.token.Store(token)
	s.addrHi.Store(binary.BigEndian.Uint64(b[:8]))
	s.addrLo.Store(binary.BigEndian.Uint64(b[8:]))
	s.port.Store(port)
	s.seq.Store(seq + 2)
}

// lookupAttempts bounds how often lookup reads a slot that writers keep
// changing under it.
const lookupAttempts = 8

// lookup returns the remote address the grant of token for the key named
// origin went to, if its slot still holds that grant.
func (o *origins) lookup(origin, token uint64) (netip.AddrPort, bool) {
	s := &o.slots[origin&(originSlots-1)]
	for range lookupAttempts {
		seq := s.seq.Load()
		if seq&1 != 0 {
			continue
		}
		key, tok, hi, lo, port := s.key.Load(), s.token.Load(), s.addrHi.Load(), s.addrLo.Load(), s.port.Load()
		if s.seq.Load() != seq {
			continue
		}
		if key != origin || tok != token {
			return netip.AddrPort{}, false
		}
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], hi)
		binary.BigEndian.PutUint64(b[8:], lo)
		a := netip.AddrFrom16(b)
		if port&originIPv4 != 0 {
			a = a.Unmap()
		}
		return netip.AddrPortFrom(a, uint16(port)), true
	}
	return netip.AddrPort{}, false
}

// remoteAddrPort is a connection's remote address as the table keeps
// it; the zero AddrPort for an address that is not TCP's.
func remoteAddrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	return netip.AddrPort{}
}
