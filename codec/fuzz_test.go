package codec

import (
	"bytes"
	"testing"
)

func seedRequests(f *testing.F) {
	var mac [MACLen]byte
	f.Add(AppendAcquire(nil, 1, 30, 0, "k"))
	f.Add(AppendAcquire(nil, 0x0A, 0x0A0A, 0x0A, "é"))
	f.Add(AppendRelease(nil, 2, 3, "k"))
	f.Add(AppendKeep(nil, 5, 0x0A0A, 0x0A, "k"))
	f.Add(AppendPing(nil, 4))
	f.Add(AppendHello(nil, [NonceLen]byte{0x0A}, mac, "t"))
	f.Add([]byte("X\n"))
	f.Add(bytes.Repeat([]byte{'A'}, MaxFrame+1))
}

// FuzzDecodeRequest checks the invariants the server relies on for any
// byte stream: decoding never panics, never consumes past the buffer or
// the frame limit, a consumed frame ends in LF, and decoding a prefix of a
// stream never disagrees with decoding the whole of it.
func FuzzDecodeRequest(f *testing.F) {
	seedRequests(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var req Request
		n, err := DecodeRequest(data, &req)
		if n < 0 || n > len(data) || n > MaxFrame {
			t.Fatalf("consumed %d of %d", n, len(data))
		}
		if n > 0 && data[n-1] != '\n' {
			t.Fatalf("frame of %d bytes does not end in LF", n)
		}
		if err == nil && n == 0 {
			t.Fatal("success without consuming")
		}
		if err == nil && (req.Op == OpAcquire || req.Op == OpRelease || req.Op == OpKeep) && !ValidKey(req.Key) {
			t.Fatalf("accepted invalid key %q", req.Key)
		}
		if err == nil && (req.Op == OpAcquire || req.Op == OpKeep) && (req.LeaseSeconds == 0 || req.LeaseSeconds > MaxLeaseSeconds) {
			t.Fatalf("accepted lease %d", req.LeaseSeconds)
		}
		if n > 0 {
			var again Request
			m, err2 := DecodeRequest(data[:n], &again)
			if m != n || err2 != err {
				t.Fatalf("frame alone decodes to (%d, %v), in stream to (%d, %v)", m, err2, n, err)
			}
		}
	})
}

// FuzzRequestRoundTrip encodes arbitrary valid fields and checks they
// decode to the same values, whatever bytes (0x0A included) they contain.
func FuzzRequestRoundTrip(f *testing.F) {
	f.Add(uint64(1), uint16(30), uint8(0), uint64(5), "k")
	f.Add(uint64(0x0A), uint16(0x0A), uint8(0x0A), uint64(0x0A0A), "é/한")
	f.Fuzz(func(t *testing.T, owner uint64, lease uint16, wait uint8, token uint64, key string) {
		if owner == 0 || lease == 0 || lease > MaxLeaseSeconds || !ValidKey([]byte(key)) {
			return
		}
		var req Request
		acq := AppendAcquire(nil, owner, lease, wait, key)
		if n, err := DecodeRequest(acq, &req); err != nil || n != len(acq) ||
			req.Owner != owner || req.LeaseSeconds != lease || req.WaitSeconds != wait || string(req.Key) != key {
			t.Fatalf("acquire round trip: (%d, %v) %+v", n, err, req)
		}
		rel := AppendRelease(nil, owner, token, key)
		if n, err := DecodeRequest(rel, &req); err != nil || n != len(rel) ||
			req.Owner != owner || req.Token != token || string(req.Key) != key {
			t.Fatalf("release round trip: (%d, %v) %+v", n, err, req)
		}
		keep := AppendKeep(nil, owner, token, lease, key)
		if n, err := DecodeRequest(keep, &req); err != nil || n != len(keep) || req.Op != OpKeep ||
			req.Owner != owner || req.Token != token || req.LeaseSeconds != lease || string(req.Key) != key {
			t.Fatalf("keep round trip: (%d, %v) %+v", n, err, req)
		}
	})
}

// FuzzDecodeResponse is the client's parser under hostile servers.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(AppendGreeting(nil, 1, [NonceLen]byte{0x0A}, "node"))
	f.Add(AppendAcquired(nil, 0x0A, 2, 3))
	f.Add(AppendError(nil, 1, Unavailable))
	f.Add(AppendWelcome(nil, [MACLen]byte{0x0A}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		n, err := DecodeResponse(data, &r)
		if n < 0 || n > len(data) || n > MaxFrame {
			t.Fatalf("consumed %d of %d", n, len(data))
		}
		if err == nil && data[n-1] != '\n' {
			t.Fatal("frame does not end in LF")
		}
		if err == nil && r.Op == OpError && r.Reason == 0 {
			t.Fatal("error frame without a known reason")
		}
	})
}
