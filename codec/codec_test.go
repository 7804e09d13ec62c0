package codec

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func acquireFrame(owner uint64, lease uint16, wait uint8, key string) []byte {
	return AppendAcquire(nil, owner, lease, wait, key)
}

func TestDecodeRequestFieldRules(t *testing.T) {
	tests := []struct {
		name  string
		frame []byte
		want  error
		owner uint64
	}{
		{"acquire ok", acquireFrame(7, 30, 5, "orders/42"), nil, 7},
		{"key of 128 bytes", acquireFrame(7, 30, 0, strings.Repeat("k", 128)), nil, 7},
		{"key of 129 bytes", acquireFrame(7, 30, 0, strings.Repeat("k", 129)), BadKey, 7},
		{"empty key", acquireFrame(7, 30, 0, ""), BadKey, 7},
		{"key with space", acquireFrame(7, 30, 0, "a b"), BadKey, 7},
		{"invalid utf-8", acquireFrame(7, 30, 0, "a\xffb"), BadKey, 7},
		{"64 two-byte runes fill 128 bytes", acquireFrame(7, 30, 0, strings.Repeat("é", 64)), nil, 7},
		{"65 two-byte runes", acquireFrame(7, 30, 0, strings.Repeat("ж", 65)), BadKey, 7},
		{"42 three-byte runes are 126 bytes", acquireFrame(7, 30, 0, strings.Repeat("한", 42)), nil, 7},
		{"43 three-byte runes are 129 bytes", acquireFrame(7, 30, 0, strings.Repeat("한", 43)), BadKey, 7},
		{"CR is opaque to the server", acquireFrame(7, 30, 0, "k\r"), nil, 7},
		{"lease 0", acquireFrame(7, 0, 0, "k"), BadLease, 7},
		{"lease 3600", acquireFrame(7, 3600, 0, "k"), nil, 7},
		{"lease 3601", acquireFrame(7, 3601, 0, "k"), BadLease, 7},
		{"wait 255", acquireFrame(7, 1, 255, "k"), nil, 7},
		{"owner 0", acquireFrame(0, 30, 0, "k"), BadOwner, 0},
		{"release ok", AppendRelease(nil, 9, 3, "k"), nil, 9},
		{"release owner 0", AppendRelease(nil, 0, 3, "k"), BadOwner, 0},
		{"release bad key", AppendRelease(nil, 9, 3, "a b"), BadKey, 9},
		{"release empty key", AppendRelease(nil, 9, 3, ""), BadKey, 9},
		{"keep ok", AppendKeep(nil, 9, 3, 30, "k"), nil, 9},
		{"keep owner 0", AppendKeep(nil, 0, 3, 30, "k"), BadOwner, 0},
		{"keep bad key", AppendKeep(nil, 9, 3, 30, "a b"), BadKey, 9},
		{"keep lease 0", AppendKeep(nil, 9, 3, 0, "k"), BadLease, 9},
		{"keep lease 3600", AppendKeep(nil, 9, 3, 3600, "k"), nil, 9},
		{"keep lease 3601", AppendKeep(nil, 9, 3, 3601, "k"), BadLease, 9},
		{"ping ok", AppendPing(nil, 5), nil, 5},
		{"ping owner 0", AppendPing(nil, 0), BadOwner, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req Request
			n, err := DecodeRequest(tt.frame, &req)
			if err != tt.want {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if n != len(tt.frame) {
				t.Fatalf("consumed %d of %d bytes: a field error must keep the frame boundary", n, len(tt.frame))
			}
			if req.Owner != tt.owner {
				t.Fatalf("owner = %d, want %d", req.Owner, tt.owner)
			}
		})
	}
}

func TestDecodeRequestStructuralErrors(t *testing.T) {
	tests := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"unknown op", []byte("Z\n"), BadRequest},
		{"response op from a client", AppendOwnerOnly(nil, OpTimeout, 1), BadRequest},
		{"text after ping", append(AppendPing(nil, 5)[:9], "x\n"...), BadRequest},
		{"no LF within 192 bytes", acquireFrame(1, 30, 0, strings.Repeat("k", 200))[:200], Oversized},
		{"exactly 192 bytes without LF", bytes.Repeat([]byte{'A'}, MaxFrame), Oversized},
		{"only the op", []byte("A"), ErrIncomplete},
		{"fixed part not complete", acquireFrame(1, 30, 0, "k")[:5], ErrIncomplete},
		{"keep fixed part not complete", AppendKeep(nil, 1, 2, 30, "k")[:18], ErrIncomplete},
		{"empty", nil, ErrIncomplete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req Request
			n, err := DecodeRequest(tt.frame, &req)
			if err != tt.want || n != 0 {
				t.Fatalf("got (%d, %v), want (0, %v)", n, err, tt.want)
			}
		})
	}
}

func TestLargestWellFormedFrameFits(t *testing.T) {
	f := AppendKeep(nil, ^uint64(0), ^uint64(0), MaxLeaseSeconds, strings.Repeat("k", MaxKeyLen))
	if len(f) != 148 || MaxRequestFrame != 148 {
		t.Fatalf("largest request frame is %d bytes (MaxRequestFrame %d), spec says 148", len(f), MaxRequestFrame)
	}
	var req Request
	if n, err := DecodeRequest(f, &req); err != nil || n != len(f) {
		t.Fatalf("got (%d, %v)", n, err)
	}
}

// The fixed part is binary: an owner, lease or token byte of 0x0A must not
// end the frame.
func TestFixedPartMayContainLF(t *testing.T) {
	owner := uint64(0x0A0A0A0A0A0A0A0A)
	f := AppendAcquire(nil, owner, 0x0A0A, 0x0A, "k")
	var req Request
	n, err := DecodeRequest(f, &req)
	if err != nil || n != len(f) {
		t.Fatalf("got (%d, %v)", n, err)
	}
	if req.Owner != owner || req.LeaseSeconds != 0x0A0A || req.WaitSeconds != 0x0A || string(req.Key) != "k" {
		t.Fatalf("decoded %+v", req)
	}
	rel := AppendRelease(nil, 1, 0x0A, "key")
	if n, err := DecodeRequest(rel, &req); err != nil || n != len(rel) || req.Token != 0x0A {
		t.Fatalf("release with LF token: (%d, %v, %d)", n, err, req.Token)
	}
	keep := AppendKeep(nil, 0x0A, 0x0A0A, 0x0A0A, "key")
	if n, err := DecodeRequest(keep, &req); err != nil || n != len(keep) ||
		req.Op != OpKeep || req.Owner != 0x0A || req.Token != 0x0A0A || req.LeaseSeconds != 0x0A0A || string(req.Key) != "key" {
		t.Fatalf("keep with LF bytes: (%d, %v) %+v", n, err, req)
	}
}

// Every prefix of a valid stream is incomplete, never an error, and the
// whole decodes to the same frames: frames split at every byte.
func TestSplitAtEveryByte(t *testing.T) {
	var stream []byte
	var hello [MACLen]byte
	stream = AppendHello(stream, [NonceLen]byte{0x0A, 1}, hello, "tenant-1")
	stream = AppendAcquire(stream, 0x0A, 10, 0x0A, "é/key")
	stream = AppendRelease(stream, 2, 0x0A0A, "é/key")
	stream = AppendKeep(stream, 4, 0x0A0A, 0x0A, "é/key")
	stream = AppendPing(stream, 3)
	stream = AppendSession(stream, 0x0A, [ClientIDLen]byte{0x0A, '\n', 7})
	stream = AppendAbandon(stream, 5, 0x0A0A, "é/key")
	wantOps := []byte{OpHello, OpAcquire, OpRelease, OpKeep, OpPing, OpSession, OpAbandon}

	for cut := 0; cut <= len(stream); cut++ {
		var got []byte
		var pending []byte
		var req Request
		for _, chunk := range [][]byte{stream[:cut], stream[cut:]} {
			pending = append(pending, chunk...)
			for {
				n, err := DecodeRequest(pending, &req)
				if err == ErrIncomplete {
					break
				}
				if err != nil {
					t.Fatalf("cut %d: %v", cut, err)
				}
				got = append(got, req.Op)
				pending = pending[n:]
			}
		}
		if !bytes.Equal(got, wantOps) || len(pending) != 0 {
			t.Fatalf("cut %d: ops %q, %d bytes left", cut, got, len(pending))
		}
	}
}

func TestHelloRules(t *testing.T) {
	var mac [MACLen]byte
	nonce := [NonceLen]byte{1, 2, 3}
	good := AppendHello(nil, nonce, mac, "team.a_b-9")
	var req Request
	if n, err := DecodeRequest(good, &req); err != nil || n != len(good) || string(req.Tenant) != "team.a_b-9" || req.ClientNonce != nonce {
		t.Fatalf("good hello: (%d, %v) %+v", n, err, req)
	}
	badVersion := bytes.Clone(good)
	badVersion[1] = 2
	for name, f := range map[string][]byte{
		"bad version":      badVersion,
		"empty tenant":     AppendHello(nil, nonce, mac, ""),
		"tenant too long":  AppendHello(nil, nonce, mac, strings.Repeat("t", 33)),
		"tenant bad chars": AppendHello(nil, nonce, mac, "a/b"),
	} {
		if n, err := DecodeRequest(f, &req); err != AuthFailed || n != len(f) {
			t.Errorf("%s: got (%d, %v), want AuthFailed", name, n, err)
		}
	}
	if !ValidTenant([]byte(strings.Repeat("t", 32))) {
		t.Error("a 32-byte tenant is valid")
	}
}

func TestResponsesRoundTrip(t *testing.T) {
	nonce := [NonceLen]byte{0x0A, 9}
	mac := [MACLen]byte{0x0A, 7}
	var stream []byte
	stream = AppendGreeting(stream, GreetingAuthRequired, nonce, "node-1")
	stream = AppendWelcome(stream, mac)
	stream = AppendAcquired(stream, 0x0A, 0x0A0A, 0x0A)
	for _, op := range []byte{OpTimeout, OpBusy, OpReleased, OpNotHeld, OpPong} {
		stream = AppendOwnerOnly(stream, op, uint64(op))
	}
	stream = AppendError(stream, 4, TokenExhausted)

	var r Response
	next := func() {
		t.Helper()
		n, err := DecodeResponse(stream, &r)
		if err != nil {
			t.Fatalf("decode %q: %v", stream, err)
		}
		stream = stream[n:]
	}
	next()
	if r.Op != OpGreeting || r.Version != Version || r.Flags != GreetingAuthRequired || r.ServerNonce != nonce || string(r.NodeName) != "node-1" {
		t.Fatalf("greeting %+v", r)
	}
	next()
	if r.Op != OpWelcome || r.ServerMAC != mac {
		t.Fatalf("welcome %+v", r)
	}
	next()
	if r.Op != OpAcquired || r.Owner != 0x0A || r.Token != 0x0A0A || r.WaitedMs != 0x0A {
		t.Fatalf("acquired %+v", r)
	}
	for _, op := range []byte{OpTimeout, OpBusy, OpReleased, OpNotHeld, OpPong} {
		next()
		if r.Op != op || r.Owner != uint64(op) {
			t.Fatalf("owner-only %q: %+v", op, r)
		}
	}
	next()
	if r.Op != OpError || r.Owner != 4 || r.Reason != TokenExhausted {
		t.Fatalf("error %+v", r)
	}
	if len(stream) != 0 {
		t.Fatalf("%d bytes left", len(stream))
	}
}

func TestDecodeResponseRejectsWhatServersNeverSend(t *testing.T) {
	for name, f := range map[string][]byte{
		"unknown op":      []byte("Z\n"),
		"unknown reason":  append(AppendOwnerOnly(nil, OpError, 1)[:9], "nope\n"...),
		"text after pong": append(AppendOwnerOnly(nil, OpPong, 1)[:9], "x\n"...),
		"node name of 65": append(AppendGreeting(nil, 0, [NonceLen]byte{}, "")[:19], strings.Repeat("n", 65)+"\n"...),
	} {
		var r Response
		if n, err := DecodeResponse(f, &r); err != BadRequest || n != 0 {
			t.Errorf("%s: got (%d, %v), want BadRequest", name, n, err)
		}
	}
}

func TestReasons(t *testing.T) {
	closing := map[Reason]bool{BadRequest: true, Oversized: true, AuthRequired: true, AuthFailed: true, ShuttingDown: true}
	for r := BadRequest; r <= ShuttingDown; r++ {
		if got := ParseReason([]byte(r.String())); got != r {
			t.Errorf("ParseReason(%q) = %v", r.String(), got)
		}
		if r.ClosesConnection() != closing[r] {
			t.Errorf("%v.ClosesConnection() = %v", r, r.ClosesConnection())
		}
	}
	var err error = BadKey
	if !errors.Is(err, BadKey) || err.Error() != "lockd: bad_key" {
		t.Fatalf("reason as error: %v", err)
	}
}

func TestValidClientKeyRefusesCRLF(t *testing.T) {
	for key, want := range map[string]bool{
		"k": true, "k\r": false, "k\n": false, "a b": false, "": false,
		strings.Repeat("é", 64): true, strings.Repeat("é", 65): false, "\xff": false,
		"é b": false, "é\r": false, "k\xffé": false, "ж/é": true, strings.Repeat("한", 42): true,
	} {
		if got := ValidClientKey(key); got != want {
			t.Errorf("ValidClientKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestHandshakeMACs(t *testing.T) {
	secret := []byte("s3cret")
	sn, cn := [NonceLen]byte{1}, [NonceLen]byte{2}
	c := ClientMAC(secret, sn, cn, []byte("t"))
	s := ServerMAC(secret, cn, sn, []byte("t"))
	if EqualMAC(c, s) {
		t.Fatal("client and server MACs must differ (domain separation)")
	}
	if EqualMAC(c, ClientMAC([]byte("other"), sn, cn, []byte("t"))) {
		t.Fatal("MAC must depend on the secret")
	}
	if EqualMAC(c, ClientMAC(secret, sn, cn, []byte("u"))) {
		t.Fatal("MAC must depend on the tenant")
	}
	if !EqualMAC(c, ClientMAC(secret, sn, cn, []byte("t"))) {
		t.Fatal("MAC must be deterministic")
	}
}

// SESSION and ABANDON (SPEC §6a) decode their fields whatever bytes the
// binary part holds, and their field errors keep the frame boundary.
func TestSessionAndAbandonFrames(t *testing.T) {
	id := [ClientIDLen]byte{'\n', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, '\n'}
	var req Request
	frame := AppendSession(nil, 0x0A, id)
	if n, err := DecodeRequest(frame, &req); err != nil || n != len(frame) || req.Op != OpSession || req.Owner != 0x0A || req.ClientID != id {
		t.Fatalf("session: (%d, %v) %+v", n, err, req)
	}
	frame = AppendAbandon(nil, 9, 0x0A0A, "orders/42")
	if n, err := DecodeRequest(frame, &req); err != nil || n != len(frame) || req.Op != OpAbandon ||
		req.Owner != 9 || req.Target != 0x0A0A || string(req.Key) != "orders/42" {
		t.Fatalf("abandon: (%d, %v) %+v", n, err, req)
	}
	cases := []struct {
		name  string
		frame []byte
		n     int
		err   error
	}{
		{"session owner 0", AppendSession(nil, 0, id), 26, BadOwner},
		{"session with text", append(AppendSession(nil, 1, id)[:25], "x\n"...), 0, BadRequest},
		{"abandon owner 0", AppendAbandon(nil, 0, 1, "k"), 19, BadOwner},
		{"abandon target 0", AppendAbandon(nil, 1, 0, "k"), 19, BadOwner},
		{"abandon bad key", AppendAbandon(nil, 1, 2, "a b"), 21, BadKey},
		{"abandon empty key", AppendAbandon(nil, 1, 2, ""), 18, BadKey},
	}
	for _, c := range cases {
		n, err := DecodeRequest(c.frame, &req)
		if n != c.n || err != c.err {
			t.Errorf("%s: (%d, %v), want (%d, %v)", c.name, n, err, c.n, c.err)
		}
	}
}
