package codec_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/lockd/lockd/codec"
)

// protocolDoc is the protocol reference whose worked examples the tests
// below hold to the codec.
const protocolDoc = "../docs/protocol.md"

// docExamples reads every block of protocol.md introduced by
// "<!-- example: NAME -->" and fenced as ```hex: bytes in hex, any
// spacing, with # comments.
func docExamples(t *testing.T) map[string][]byte {
	t.Helper()
	doc, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(doc), "\n")
	examples := make(map[string][]byte)
	for i := 0; i < len(lines); i++ {
		name, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "<!-- example: ")
		if !ok {
			continue
		}
		name, ok = strings.CutSuffix(name, " -->")
		if !ok || name == "" {
			t.Fatalf("%s:%d: malformed example marker %q", protocolDoc, i+1, lines[i])
		}
		if _, dup := examples[name]; dup {
			t.Fatalf("%s:%d: example %q appears twice", protocolDoc, i+1, name)
		}
		if i+1 >= len(lines) || lines[i+1] != "```hex" {
			t.Fatalf("%s:%d: example %q is not followed by a ```hex block", protocolDoc, i+1, name)
		}
		var digits strings.Builder
		for i += 2; i < len(lines) && lines[i] != "```"; i++ {
			data, _, _ := strings.Cut(lines[i], "#")
			for _, field := range strings.Fields(data) {
				if len(field) != 2 {
					t.Fatalf("%s:%d: %q is not one hex byte", protocolDoc, i+1, field)
				}
				digits.WriteString(field)
			}
		}
		if i == len(lines) {
			t.Fatalf("%s: example %q: the hex block never ends", protocolDoc, name)
		}
		b, err := hex.DecodeString(digits.String())
		if err != nil {
			t.Fatalf("%s: example %q: %v", protocolDoc, name, err)
		}
		examples[name] = b
	}
	return examples
}

// TestProtocolDocFrameExamples decodes each worked frame of protocol.md,
// compares its fields with what the example says it carries, and encodes
// those fields back to the same bytes.
func TestProtocolDocFrameExamples(t *testing.T) {
	examples := docExamples(t)
	checks := map[string]func(t *testing.T, frame []byte){
		"acquire": func(t *testing.T, frame []byte) {
			req := decodeRequest(t, frame)
			if req.Op != codec.OpAcquire || req.Owner != 7 || req.LeaseSeconds != 30 || req.WaitSeconds != 10 || string(req.Key) != "orders/42" {
				t.Fatalf("decoded %+v", req)
			}
			sameBytes(t, frame, codec.AppendAcquire(nil, 7, 30, 10, "orders/42"))
		},
		"acquired": func(t *testing.T, frame []byte) {
			resp := decodeResponse(t, frame)
			if resp.Op != codec.OpAcquired || resp.Owner != 7 || resp.Token != 4242 || resp.WaitedMs != 1500 {
				t.Fatalf("decoded %+v", resp)
			}
			sameBytes(t, frame, codec.AppendAcquired(nil, 7, 4242, 1500))
		},
		"keep": func(t *testing.T, frame []byte) {
			req := decodeRequest(t, frame)
			if req.Op != codec.OpKeep || req.Owner != 10 || req.Token != 4242 || req.LeaseSeconds != 60 || string(req.Key) != "orders/42" {
				t.Fatalf("decoded %+v", req)
			}
			sameBytes(t, frame, codec.AppendKeep(nil, 10, 4242, 60, "orders/42"))
		},
		"kept": func(t *testing.T, frame []byte) {
			resp := decodeResponse(t, frame)
			if resp.Op != codec.OpAcquired || resp.Owner != 10 || resp.Token != 4242 || resp.WaitedMs != 0 {
				t.Fatalf("decoded %+v", resp)
			}
			sameBytes(t, frame, codec.AppendAcquired(nil, 10, 4242, 0))
		},
		"release": func(t *testing.T, frame []byte) {
			req := decodeRequest(t, frame)
			if req.Op != codec.OpRelease || req.Owner != 8 || req.Token != 4242 || string(req.Key) != "orders/42" {
				t.Fatalf("decoded %+v", req)
			}
			sameBytes(t, frame, codec.AppendRelease(nil, 8, 4242, "orders/42"))
		},
		"released": func(t *testing.T, frame []byte) {
			resp := decodeResponse(t, frame)
			if resp.Op != codec.OpReleased || resp.Owner != 8 {
				t.Fatalf("decoded %+v", resp)
			}
			sameBytes(t, frame, codec.AppendOwnerOnly(nil, codec.OpReleased, 8))
		},
		"greeting-abandon": func(t *testing.T, frame []byte) {
			resp := decodeResponse(t, frame)
			nonce := [codec.NonceLen]byte{0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf}
			if resp.Op != codec.OpGreeting || resp.Flags != codec.GreetingAbandon || resp.ServerNonce != nonce || string(resp.NodeName) != "n1" {
				t.Fatalf("decoded %+v", resp)
			}
			sameBytes(t, frame, codec.AppendGreeting(nil, codec.GreetingAbandon, nonce, "n1"))
		},
		"session": func(t *testing.T, frame []byte) {
			req := decodeRequest(t, frame)
			id := [codec.ClientIDLen]byte{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
			if req.Op != codec.OpSession || req.Owner != 1 || req.ClientID != id {
				t.Fatalf("decoded %+v", req)
			}
			sameBytes(t, frame, codec.AppendSession(nil, 1, id))
		},
		"abandon": func(t *testing.T, frame []byte) {
			req := decodeRequest(t, frame)
			if req.Op != codec.OpAbandon || req.Owner != 12 || req.Target != 7 || string(req.Key) != "orders/42" {
				t.Fatalf("decoded %+v", req)
			}
			sameBytes(t, frame, codec.AppendAbandon(nil, 12, 7, "orders/42"))
			// SPEC §6a: target 0 names no ACQUIRE, a field error.
			var zero codec.Request
			if _, err := codec.DecodeRequest(codec.AppendAbandon(nil, 12, 0, "orders/42"), &zero); err != codec.BadOwner || zero.Owner != 12 {
				t.Fatalf("an ABANDON of target 0 decodes to %v for owner %d, want bad_owner for owner 12", err, zero.Owner)
			}
		},
		"error": func(t *testing.T, frame []byte) {
			resp := decodeResponse(t, frame)
			if resp.Op != codec.OpError || resp.Owner != 9 || resp.Reason != codec.BadLease || resp.Reason.ClosesConnection() {
				t.Fatalf("decoded %+v", resp)
			}
			sameBytes(t, frame, codec.AppendError(nil, 9, codec.BadLease))
			// The request the example answers: owner 9, lease_s 0.
			var req codec.Request
			if _, err := codec.DecodeRequest(codec.AppendAcquire(nil, 9, 0, 0, "orders/42"), &req); err != codec.BadLease || req.Owner != 9 {
				t.Fatalf("an ACQUIRE with lease_s 0 decodes to %v for owner %d, want bad_lease for owner 9", err, req.Owner)
			}
		},
	}
	for name, check := range checks {
		frame, ok := examples[name]
		if !ok {
			t.Errorf("%s has no example %q", protocolDoc, name)
			continue
		}
		t.Run(name, func(t *testing.T) { check(t, frame) })
	}
	macExamples := []string{"mac-secret", "client-mac-input", "client-mac", "server-mac-input", "server-mac"}
	for name := range examples {
		if _, ok := checks[name]; !ok && !slices.Contains(macExamples, name) {
			t.Errorf("%s: example %q is checked by no test", protocolDoc, name)
		}
	}
}

// TestProtocolDocMACVector holds the handshake test vector of protocol.md
// to codec.ClientMAC and codec.ServerMAC, and checks that each MAC is the
// HMAC-SHA256 of the message the document spells out.
func TestProtocolDocMACVector(t *testing.T) {
	examples := docExamples(t)
	secret := examples["mac-secret"]
	clientInput, serverInput := examples["client-mac-input"], examples["server-mac-input"]
	clientMAC, serverMAC := examples["client-mac"], examples["server-mac"]
	if len(secret) != 32 || len(clientMAC) != codec.MACLen || len(serverMAC) != codec.MACLen {
		t.Fatalf("secret %d bytes, MACs %d and %d bytes", len(secret), len(clientMAC), len(serverMAC))
	}
	const labelLen = len("lockd-v1-client")
	const tenantAt = labelLen + 2*codec.NonceLen
	if len(clientInput) <= tenantAt || len(serverInput) != len(clientInput) {
		t.Fatalf("MAC inputs of %d and %d bytes", len(clientInput), len(serverInput))
	}
	var serverNonce, clientNonce [codec.NonceLen]byte
	copy(serverNonce[:], clientInput[labelLen:])
	copy(clientNonce[:], clientInput[labelLen+codec.NonceLen:])
	tenant := clientInput[tenantAt:]

	wantClientInput := slices.Concat([]byte("lockd-v1-client"), serverNonce[:], clientNonce[:], tenant)
	wantServerInput := slices.Concat([]byte("lockd-v1-server"), clientNonce[:], serverNonce[:], tenant)
	if string(tenant) != "billing" || !bytes.Equal(clientInput, wantClientInput) || !bytes.Equal(serverInput, wantServerInput) {
		t.Fatalf("the MAC inputs are not label | nonces | tenant as §7 orders them:\nclient %x\nserver %x", clientInput, serverInput)
	}
	if got := codec.ClientMAC(secret, serverNonce, clientNonce, tenant); !bytes.Equal(got[:], clientMAC) {
		t.Errorf("codec.ClientMAC = %x, document says %x", got, clientMAC)
	}
	if got := codec.ServerMAC(secret, clientNonce, serverNonce, tenant); !bytes.Equal(got[:], serverMAC) {
		t.Errorf("codec.ServerMAC = %x, document says %x", got, serverMAC)
	}
	for name, input := range map[string][]byte{"client-mac": clientInput, "server-mac": serverInput} {
		m := hmac.New(sha256.New, secret)
		m.Write(input)
		if got := m.Sum(nil); !bytes.Equal(got, examples[name]) {
			t.Errorf("HMAC-SHA256 of the %s input is %x, document says %x", name, got, examples[name])
		}
	}
}

func decodeRequest(t *testing.T, frame []byte) codec.Request {
	t.Helper()
	var req codec.Request
	n, err := codec.DecodeRequest(frame, &req)
	if err != nil || n != len(frame) {
		t.Fatalf("DecodeRequest: %d of %d bytes, %v", n, len(frame), err)
	}
	return req
}

func decodeResponse(t *testing.T, frame []byte) codec.Response {
	t.Helper()
	var resp codec.Response
	n, err := codec.DecodeResponse(frame, &resp)
	if err != nil || n != len(frame) {
		t.Fatalf("DecodeResponse: %d of %d bytes, %v", n, len(frame), err)
	}
	return resp
}

func sameBytes(t *testing.T, doc, encoded []byte) {
	t.Helper()
	if !bytes.Equal(doc, encoded) {
		t.Fatalf("the document's bytes\n%x\nare not what the codec encodes\n%x", doc, encoded)
	}
}
