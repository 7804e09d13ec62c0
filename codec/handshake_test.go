package codec

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// handshakePeer is the server side of SPEC §7 played over byte buffers:
// the client reads what it queued, and each write is decoded as a HELLO
// and answered by answer.
type handshakePeer struct {
	t        *testing.T
	nonce    [NonceLen]byte
	toClient bytes.Buffer
	hellos   []Request
	// answer is what the server sends in reply to a HELLO it was given.
	answer func(hello *Request) []byte
}

func newHandshakePeer(t *testing.T, flags uint8) *handshakePeer {
	p := &handshakePeer{t: t, nonce: [NonceLen]byte{0x0A, 7}}
	p.toClient.Write(AppendGreeting(nil, flags, p.nonce, "node"))
	return p
}

func (p *handshakePeer) Read(b []byte) (int, error) { return p.toClient.Read(b) }

func (p *handshakePeer) Write(b []byte) (int, error) {
	var req Request
	n, err := DecodeRequest(b, &req)
	if err != nil || n != len(b) || req.Op != OpHello {
		p.t.Fatalf("the client wrote %q (%d bytes decoded, %v) instead of one HELLO", b, n, err)
	}
	req.Tenant = bytes.Clone(req.Tenant)
	p.hellos = append(p.hellos, req)
	p.toClient.Write(p.answer(&req))
	return len(b), nil
}

// welcomeWith answers every HELLO with WELCOME and the server MAC for secret.
func (p *handshakePeer) welcomeWith(secret []byte) func(*Request) []byte {
	return func(h *Request) []byte {
		return AppendWelcome(nil, ServerMAC(secret, h.ClientNonce, p.nonce, h.Tenant))
	}
}

func TestClientHandshakeAuthenticatesBothWays(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	p := newHandshakePeer(t, GreetingAuthRequired)
	p.answer = p.welcomeWith(secret)
	// A server may pipeline nothing before WELCOME, but the reader must keep
	// what follows it for the caller.
	after := AppendOwnerOnly(nil, OpPong, 9)
	answer := p.answer
	p.answer = func(h *Request) []byte { return append(answer(h), after...) }
	rr := NewResponseReader(p, 0)
	if _, err := ClientHandshake(p, rr, Credentials{Tenant: "alpha", Secret: secret}); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if len(p.hellos) != 1 {
		t.Fatalf("%d HELLOs sent", len(p.hellos))
	}
	h := p.hellos[0]
	if string(h.Tenant) != "alpha" || h.Version != Version || !EqualMAC(h.MAC, ClientMAC(secret, p.nonce, h.ClientNonce, h.Tenant)) {
		t.Fatalf("HELLO does not prove the secret: %+v", h)
	}
	if h.ClientNonce == ([NonceLen]byte{}) {
		t.Fatal("the client nonce is all zeros: not drawn at random")
	}
	var r Response
	if err := rr.Next(&r); err != nil || r.Op != OpPong || r.Owner != 9 {
		t.Fatalf("the frame after WELCOME: %v %+v", err, r)
	}
}

func TestClientHandshakeWithAuthOff(t *testing.T) {
	// No tenant: nothing is sent, the connection is the tenant default.
	p := newHandshakePeer(t, 0)
	if _, err := ClientHandshake(p, NewResponseReader(p, 0), Credentials{}); err != nil || len(p.hellos) != 0 {
		t.Fatalf("no tenant: %v, %d HELLOs", err, len(p.hellos))
	}
	// A named tenant is sent in a HELLO; the WELCOME's zero MAC is accepted.
	p = newHandshakePeer(t, 0)
	p.answer = func(*Request) []byte { return AppendWelcome(nil, [MACLen]byte{}) }
	if _, err := ClientHandshake(p, NewResponseReader(p, 0), Credentials{Tenant: "beta"}); err != nil || len(p.hellos) != 1 || string(p.hellos[0].Tenant) != "beta" {
		t.Fatalf("tenant beta: %v, HELLOs %+v", err, p.hellos)
	}
}

// The GREETING's flags come back, unknown bits included, with auth off
// and on: the caller decides what a bit it does not know means (nothing).
func TestClientHandshakeReturnsTheGreetingFlags(t *testing.T) {
	const unknown = 0x80
	p := newHandshakePeer(t, GreetingAbandon|unknown)
	if flags, err := ClientHandshake(p, NewResponseReader(p, 0), Credentials{}); err != nil || flags != GreetingAbandon|unknown {
		t.Fatalf("auth off: flags %#x, %v", flags, err)
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	p = newHandshakePeer(t, GreetingAuthRequired|GreetingAbandon)
	p.answer = p.welcomeWith(secret)
	if flags, err := ClientHandshake(p, NewResponseReader(p, 0), Credentials{Tenant: "alpha", Secret: secret}); err != nil || flags != GreetingAuthRequired|GreetingAbandon {
		t.Fatalf("auth on: flags %#x, %v", flags, err)
	}
}

func TestClientHandshakeFailures(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	welcomeZero := func(*Request) []byte { return AppendWelcome(nil, [MACLen]byte{}) }
	for _, tc := range []struct {
		name   string
		server []byte                // what the server sends first; a GREETING when nil
		flags  uint8                 // the GREETING's flags
		answer func(*Request) []byte // the answer to HELLO
		creds  Credentials
		class  error // the sentinel the error must match; nil: the stream's own error
		reason Reason
	}{
		{name: "auth required, no secret", flags: GreetingAuthRequired, creds: Credentials{Tenant: "alpha"}, class: ErrHandshakeAuth},
		{name: "a secret, auth off", creds: Credentials{Tenant: "alpha", Secret: secret}, class: ErrHandshakeAuth},
		{name: "wrong server MAC", flags: GreetingAuthRequired, answer: welcomeZero, creds: Credentials{Tenant: "alpha", Secret: secret}, class: ErrHandshakeAuth},
		{name: "server MAC for another secret", flags: GreetingAuthRequired,
			answer: func(h *Request) []byte {
				return AppendWelcome(nil, ServerMAC([]byte("another secret of 32 bytes ....."), h.ClientNonce, [NonceLen]byte{0x0A, 7}, h.Tenant))
			},
			creds: Credentials{Tenant: "alpha", Secret: secret}, class: ErrHandshakeAuth},
		{name: "refused", flags: GreetingAuthRequired, answer: func(*Request) []byte { return AppendError(nil, 0, AuthFailed) },
			creds: Credentials{Tenant: "alpha", Secret: secret}, class: ErrHandshakeRefused, reason: AuthFailed},
		{name: "HELLO answered with a grant", answer: func(*Request) []byte { return AppendAcquired(nil, 1, 2, 3) },
			creds: Credentials{Tenant: "alpha"}, class: ErrHandshakeProtocol},
		{name: "no GREETING first", server: AppendOwnerOnly(nil, OpPong, 1), class: ErrHandshakeProtocol},
		{name: "GREETING of version 2", server: append([]byte{OpGreeting, 2}, AppendGreeting(nil, 0, [NonceLen]byte{}, "n")[2:]...), class: ErrHandshakeProtocol},
		{name: "undecodable first frame", server: []byte("Z\n"), class: ErrHandshakeProtocol},
		{name: "undecodable answer to HELLO", answer: func(*Request) []byte { return []byte("Z\n") }, creds: Credentials{Tenant: "alpha"}, class: ErrHandshakeProtocol},
		{name: "no answer to HELLO", answer: func(*Request) []byte { return nil }, creds: Credentials{Tenant: "alpha"}},
		{name: "closed before the GREETING", server: []byte{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newHandshakePeer(t, tc.flags)
			if tc.server != nil {
				p.toClient.Reset()
				p.toClient.Write(tc.server)
			}
			p.answer = tc.answer
			if p.answer == nil {
				p.answer = func(*Request) []byte { t.Fatal("the client sent a HELLO"); return nil }
			}
			_, err := ClientHandshake(p, NewResponseReader(p, 0), tc.creds)
			if err == nil {
				t.Fatal("the handshake succeeded")
			}
			matched := 0
			for _, class := range []error{ErrHandshakeProtocol, ErrHandshakeAuth, ErrHandshakeRefused} {
				if errors.Is(err, class) {
					matched++
					if class != tc.class {
						t.Fatalf("%v matches %v, want %v", err, class, tc.class)
					}
				}
			}
			if tc.class == nil && (matched != 0 || !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF)) {
				t.Fatalf("%v: want the stream's own end", err)
			}
			if tc.class != nil && matched != 1 {
				t.Fatalf("%v matches no class, want %v", err, tc.class)
			}
			var reason Reason
			if tc.reason != 0 && (!errors.As(err, &reason) || reason != tc.reason) {
				t.Fatalf("%v: reason %v, want %v", err, reason, tc.reason)
			}
		})
	}
}

func TestClientHandshakeWriteError(t *testing.T) {
	p := newHandshakePeer(t, 0)
	boom := errors.New("boom")
	_, err := ClientHandshake(failingWriter{boom}, NewResponseReader(p, 0), Credentials{Tenant: "alpha"})
	if !errors.Is(err, boom) || errors.Is(err, ErrHandshakeProtocol) || errors.Is(err, ErrHandshakeAuth) {
		t.Fatalf("a failed HELLO write: %v", err)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }
