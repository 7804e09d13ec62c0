package codec

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

func seedRequests(f *testing.F) {
	var mac [MACLen]byte
	f.Add(AppendAcquire(nil, 1, 30, 0, "k"))
	f.Add(AppendAcquire(nil, 0x0A, 0x0A0A, 0x0A, "é"))
	f.Add(AppendRelease(nil, 2, 3, "k"))
	f.Add(AppendKeep(nil, 5, 0x0A0A, 0x0A, "k"))
	f.Add(AppendPing(nil, 4))
	f.Add(AppendSession(nil, 6, [ClientIDLen]byte{0x0A}))
	f.Add(AppendAbandon(nil, 7, 0x0A, "k"))
	f.Add(AppendHello(nil, [NonceLen]byte{0x0A}, mac, "t"))
	f.Add([]byte("Z\n"))
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
		if err == nil && (req.Op == OpAcquire || req.Op == OpRelease || req.Op == OpKeep || req.Op == OpAbandon) && !ValidKey(req.Key) {
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

// FuzzResponseReader checks the reader clients and lockbench share
// against DecodeResponse over the whole stream: whatever the bytes and
// however the stream splits them into reads, it yields the same frames in
// the same order and stops at the same error, never reading a frame
// across what DecodeResponse would decode.
func FuzzResponseReader(f *testing.F) {
	var stream []byte
	stream = AppendGreeting(stream, 1, [NonceLen]byte{0x0A}, "node")
	stream = AppendWelcome(stream, [MACLen]byte{0x0A})
	stream = AppendAcquired(stream, 0x0A, 2, 3)
	f.Add(stream, uint8(1))
	f.Add(append(AppendOwnerOnly(nil, OpPong, 1), "Z\n"...), uint8(3))
	f.Add(AppendAcquired(nil, 1, 2, 3)[:9], uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		var want []Response
		var wantErr error
		for rest := data; ; {
			var r Response
			n, err := DecodeResponse(rest, &r)
			if err == ErrIncomplete {
				if len(rest) > 0 {
					wantErr = io.ErrUnexpectedEOF
				} else {
					wantErr = io.EOF
				}
				break
			}
			if err != nil {
				wantErr = err
				break
			}
			r.NodeName = bytes.Clone(r.NodeName)
			want = append(want, r)
			rest = rest[n:]
		}
		src := io.Reader(bytes.NewReader(data))
		if chunk > 0 {
			src = &chunkReader{data: data, size: int(chunk)}
		}
		rr := NewResponseReader(src, 0)
		for i := 0; ; i++ {
			var r Response
			err := rr.Next(&r)
			if err != nil {
				if i != len(want) || err != wantErr {
					t.Fatalf("frame %d: error %v, want %d frames then %v", i, err, len(want), wantErr)
				}
				return
			}
			if i >= len(want) {
				t.Fatalf("frame %d decoded, the whole stream holds %d", i, len(want))
			}
			r.NodeName = bytes.Clone(r.NodeName)
			if !reflect.DeepEqual(r, want[i]) {
				t.Fatalf("frame %d: %+v, want %+v", i, r, want[i])
			}
		}
	})
}

// chunkReader hands out data size bytes per Read.
type chunkReader struct {
	data []byte
	size int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.data)
	c.data = c.data[n:]
	return n, nil
}

// FuzzClientHandshake plays arbitrary server bytes to the client side of
// SPEC §7. It never panics; a failure is the stream's own error or
// exactly one handshake class; with a secret no byte string can pass,
// since the server MAC covers a client nonce drawn after those bytes were
// fixed; and a handshake that passes leaves in the reader exactly what
// followed the frames it consumed.
func FuzzClientHandshake(f *testing.F) {
	greeting := AppendGreeting(nil, 0, [NonceLen]byte{0x0A}, "node")
	authGreeting := AppendGreeting(nil, GreetingAuthRequired, [NonceLen]byte{0x0A}, "node")
	f.Add(greeting, false, "")
	f.Add(append(greeting, AppendWelcome(nil, [MACLen]byte{})...), false, "alpha")
	f.Add(append(authGreeting, AppendWelcome(nil, [MACLen]byte{0x0A})...), true, "alpha")
	f.Add(append(authGreeting, AppendError(nil, 0, AuthFailed)...), true, "alpha")
	f.Add(append(greeting, AppendAcquired(nil, 1, 2, 3)...), false, "alpha")
	f.Fuzz(func(t *testing.T, data []byte, withSecret bool, tenant string) {
		if tenant != "" && !ValidTenant([]byte(tenant)) {
			return
		}
		creds := Credentials{Tenant: tenant}
		if withSecret {
			creds.Secret = []byte("0123456789abcdef0123456789abcdef")
		}
		var sent bytes.Buffer
		rr := NewResponseReader(bytes.NewReader(data), 0)
		_, err := ClientHandshake(&sent, rr, creds)
		if err == nil {
			if withSecret {
				t.Fatal("a fixed byte string passed for a server that knows the secret")
			}
			var r Response
			n, derr := DecodeResponse(data, &r)
			if derr != nil || r.Op != OpGreeting || r.Flags&GreetingAuthRequired != 0 {
				t.Fatalf("passed on a stream that does not open with a GREETING without auth: %v %+v", derr, r)
			}
			if tenant != "" {
				m, derr := DecodeResponse(data[n:], &r)
				if derr != nil || r.Op != OpWelcome {
					t.Fatalf("passed without a WELCOME: %v %+v", derr, r)
				}
				n += m
			}
			if rr.Buffered() > len(data)-n {
				t.Fatalf("%d bytes left buffered, %d followed the handshake", rr.Buffered(), len(data)-n)
			}
			return
		}
		classes := 0
		for _, class := range []error{ErrHandshakeProtocol, ErrHandshakeAuth, ErrHandshakeRefused} {
			if errors.Is(err, class) {
				classes++
			}
		}
		if classes > 1 {
			t.Fatalf("%v matches %d classes", err, classes)
		}
		if classes == 0 && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("unclassified error %v", err)
		}
		var reason Reason
		if errors.Is(err, ErrHandshakeRefused) && (!errors.As(err, &reason) || reason == 0) {
			t.Fatalf("a refusal without its reason: %v", err)
		}
	})
}
