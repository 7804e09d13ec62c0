// Package codec encodes and decodes lockd wire frames (SPEC §2–4, §7).
//
// It owns bytes only: framing, field ranges, error reasons and the HMAC of
// the handshake. It knows nothing of locks, time, sockets or tenants'
// secrets storage. Decoders are small explicit parsers over byte slices that
// report how many bytes they consumed and never allocate; the decoded key,
// tenant and node name alias the input buffer and are valid only as long as
// it is. Encoders append to a caller-owned slice. ResponseReader and
// ClientHandshake are the one response reader and the one client side of
// the handshake that the client and lockbench share; they work over an
// io.Reader and io.Writer the caller owns.
package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"unicode/utf8"
)

// Protocol constants (SPEC §2, §4, §8).
const (
	Version = 1
	// MaxFrame is the largest frame a server accepts, LF included.
	MaxFrame = 192
	// MaxKeyLen is the largest key in bytes.
	MaxKeyLen = 128
	// MaxLeaseSeconds is the longest lease; there is no infinite lease.
	MaxLeaseSeconds = 3600
	// MaxWaitSeconds is the longest wait a frame can carry.
	MaxWaitSeconds = 255
	// MaxTenantLen is the longest tenant name.
	MaxTenantLen = 32
	// MaxNodeNameLen is the longest node name in a GREETING.
	MaxNodeNameLen = 64
	NonceLen       = 16
	MACLen         = 32
	// ClientIDLen is the size of a SESSION's client_id (SPEC §6a).
	ClientIDLen = 16
)

// Request ops (client → server).
const (
	OpHello   byte = 'H'
	OpAcquire byte = 'A'
	OpRelease byte = 'R'
	OpKeep    byte = 'K'
	OpPing    byte = 'P'
	OpSession byte = 'S' // SPEC §6a
	OpAbandon byte = 'X' // SPEC §6a
)

// Response ops (server → client).
const (
	OpGreeting byte = 'G'
	OpWelcome  byte = 'W'
	OpAcquired byte = 'A'
	OpTimeout  byte = 'T'
	OpBusy     byte = 'B'
	OpReleased byte = 'R'
	OpNotHeld  byte = 'N'
	OpPong     byte = 'P'
	OpError    byte = 'E'
)

// Sizes of the fixed part of each frame, after the op byte.
const (
	helloFixed    = 1 + NonceLen + MACLen
	acquireFixed  = 8 + 2 + 1
	releaseFixed  = 8 + 8
	keepFixed     = 8 + 8 + 2
	ownerFixed    = 8
	sessionFixed  = 8 + ClientIDLen
	abandonFixed  = 8 + 8
	greetingFixed = 1 + 1 + NonceLen
	welcomeFixed  = MACLen
	acquiredFixed = 8 + 8 + 4
)

// Frame sizes quoted by the spec; exported so callers can size buffers.
const (
	// MaxRequestFrame is the largest well-formed client frame: KEEP
	// with a 128-byte key.
	MaxRequestFrame = 1 + keepFixed + MaxKeyLen + 1
	// MaxResponseFrame is the largest well-formed server frame: GREETING
	// with a 64-byte node name.
	MaxResponseFrame = 1 + greetingFixed + MaxNodeNameLen + 1
)

// ErrIncomplete means the buffer holds the start of a frame but not all of
// it: read more bytes and decode again from the same offset.
var ErrIncomplete = errors.New("codec: incomplete frame")

// GREETING flags (SPEC §3). A client ignores bits it does not know.
const (
	// GreetingAuthRequired (bit0): HELLO must come first.
	GreetingAuthRequired = 1
	// GreetingAbandon (bit1): the server serves SESSION and ABANDON
	// (SPEC §6a); official clients send them only where it is set.
	GreetingAbandon = 2
)

// Request is one decoded client frame. Key and Tenant alias the decoded
// buffer.
type Request struct {
	Op           byte
	Owner        uint64
	LeaseSeconds uint16
	WaitSeconds  uint8
	Token        uint64
	Key          []byte
	// Target is ABANDON's owner of the ACQUIRE it gives back.
	Target uint64
	// ClientID is SESSION's client_id: a bearer secret that the server
	// never sends back, logs or shows.
	ClientID [ClientIDLen]byte

	Version     uint8
	ClientNonce [NonceLen]byte
	MAC         [MACLen]byte
	Tenant      []byte
}

// Response is one decoded server frame. NodeName aliases the decoded buffer.
type Response struct {
	Op       byte
	Owner    uint64
	Token    uint64
	WaitedMs uint32
	Reason   Reason

	Version     uint8
	Flags       uint8
	ServerNonce [NonceLen]byte
	NodeName    []byte
	ServerMAC   [MACLen]byte
}

// requestFixed returns the fixed size of a request op and whether the op
// is known.
func requestFixed(op byte) (int, bool) {
	switch op {
	case OpHello:
		return helloFixed, true
	case OpAcquire:
		return acquireFixed, true
	case OpRelease:
		return releaseFixed, true
	case OpKeep:
		return keepFixed, true
	case OpPing:
		return ownerFixed, true
	case OpSession:
		return sessionFixed, true
	case OpAbandon:
		return abandonFixed, true
	}
	return 0, false
}

// responseFixed returns the fixed size of a response op and whether the op
// is known.
func responseFixed(op byte) (int, bool) {
	switch op {
	case OpGreeting:
		return greetingFixed, true
	case OpWelcome:
		return welcomeFixed, true
	case OpAcquired:
		return acquiredFixed, true
	case OpTimeout, OpBusy, OpReleased, OpNotHeld, OpPong, OpError:
		return ownerFixed, true
	}
	return 0, false
}

// split finds the frame at the start of buf: it consumes the op and the
// fixed part before it looks for LF in the text, because the fixed part is
// binary and may contain 0x0A. It returns the fixed part, the text and the
// frame length. A frame that cannot end within MaxFrame is Oversized; a
// shorter one that has not ended yet is ErrIncomplete.
func split(buf []byte, fixed int) (fixedPart, text []byte, n int, err error) {
	start := 1 + fixed
	limit := min(len(buf), MaxFrame)
	for i := start; i < limit; i++ {
		if buf[i] == '\n' {
			return buf[1:start], buf[start:i], i + 1, nil
		}
	}
	if len(buf) >= MaxFrame {
		return nil, nil, 0, Oversized
	}
	return nil, nil, 0, ErrIncomplete
}

// DecodeRequest decodes the frame at the start of buf into req.
//
// It returns the frame length and nil for a valid frame. A field error
// (BadKey, BadLease, BadOwner, AuthFailed for a bad HELLO) also returns the
// frame length: the boundary was sound, and req.Owner is set where the
// frame carries one. Structural errors (BadRequest, Oversized) return 0:
// the framing is no longer trusted. ErrIncomplete asks for more bytes.
func DecodeRequest(buf []byte, req *Request) (int, error) {
	if len(buf) == 0 {
		return 0, ErrIncomplete
	}
	op := buf[0]
	fixed, known := requestFixed(op)
	if !known {
		return 0, BadRequest
	}
	f, text, n, err := split(buf, fixed)
	if err != nil {
		return 0, err
	}
	req.Op = op
	req.Key = nil
	req.Tenant = nil
	switch op {
	case OpHello:
		req.Owner = 0
		req.Version = f[0]
		copy(req.ClientNonce[:], f[1:1+NonceLen])
		copy(req.MAC[:], f[1+NonceLen:])
		req.Tenant = text
		if req.Version != Version || !ValidTenant(text) {
			return n, AuthFailed
		}
	case OpAcquire:
		req.Owner = binary.BigEndian.Uint64(f)
		req.LeaseSeconds = binary.BigEndian.Uint16(f[8:])
		req.WaitSeconds = f[10]
		req.Key = text
		if err := checkOwnerKey(req.Owner, text); err != nil {
			return n, err
		}
		if req.LeaseSeconds == 0 || req.LeaseSeconds > MaxLeaseSeconds {
			return n, BadLease
		}
	case OpRelease:
		req.Owner = binary.BigEndian.Uint64(f)
		req.Token = binary.BigEndian.Uint64(f[8:])
		req.Key = text
		if err := checkOwnerKey(req.Owner, text); err != nil {
			return n, err
		}
	case OpKeep:
		req.Owner = binary.BigEndian.Uint64(f)
		req.Token = binary.BigEndian.Uint64(f[8:])
		req.LeaseSeconds = binary.BigEndian.Uint16(f[16:])
		req.Key = text
		if err := checkOwnerKey(req.Owner, text); err != nil {
			return n, err
		}
		if req.LeaseSeconds == 0 || req.LeaseSeconds > MaxLeaseSeconds {
			return n, BadLease
		}
	case OpPing, OpSession:
		req.Owner = binary.BigEndian.Uint64(f)
		if len(text) != 0 {
			return 0, BadRequest
		}
		if op == OpSession {
			copy(req.ClientID[:], f[8:])
		}
		if req.Owner == 0 {
			return n, BadOwner
		}
	case OpAbandon:
		req.Owner = binary.BigEndian.Uint64(f)
		req.Target = binary.BigEndian.Uint64(f[8:])
		req.Key = text
		if err := checkOwnerKey(req.Owner, text); err != nil {
			return n, err
		}
		// The target names an ACQUIRE by its owner, which is never 0.
		if req.Target == 0 {
			return n, BadOwner
		}
	}
	return n, nil
}

func checkOwnerKey(owner uint64, key []byte) error {
	if owner == 0 {
		return BadOwner
	}
	if !ValidKey(key) {
		return BadKey
	}
	return nil
}

// ValidKey reports whether key obeys SPEC §4 as the server sees it: 1..128
// bytes of valid UTF-8 without a space. A frame cannot carry LF, and the
// server treats CR as an opaque byte.
func ValidKey(key []byte) bool {
	return len(key) >= 1 && len(key) <= MaxKeyLen &&
		bytes.IndexByte(key, ' ') < 0 && bytes.IndexByte(key, '\n') < 0 &&
		utf8.Valid(key)
}

// ValidClientKey is the official clients' rule: ValidKey plus a refusal of
// CR and LF, so that "k\r" can never silently name a different key than "k".
func ValidClientKey(key string) bool {
	if len(key) < 1 || len(key) > MaxKeyLen {
		return false
	}
	// One pass over the bytes: keys are almost always ASCII, and only a
	// key that is not needs the UTF-8 check.
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c >= utf8.RuneSelf:
			return !strings.ContainsAny(key, " \r\n") && utf8.ValidString(key)
		case c == ' ', c == '\r', c == '\n':
			return false
		}
	}
	return true
}

// ValidTenant reports whether a tenant name is 1..32 bytes of
// [A-Za-z0-9._-].
func ValidTenant(t []byte) bool {
	if len(t) == 0 || len(t) > MaxTenantLen {
		return false
	}
	for _, c := range t {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// DecodeResponse decodes the server frame at the start of buf. It returns
// the frame length, ErrIncomplete, or BadRequest/Oversized for a frame a
// conforming server never sends (unknown op, text where none is allowed,
// an unknown E reason, a node name over 64 bytes).
func DecodeResponse(buf []byte, resp *Response) (int, error) {
	if len(buf) == 0 {
		return 0, ErrIncomplete
	}
	op := buf[0]
	fixed, known := responseFixed(op)
	if !known {
		return 0, BadRequest
	}
	f, text, n, err := split(buf, fixed)
	if err != nil {
		return 0, err
	}
	resp.Op = op
	resp.NodeName = nil
	resp.Reason = 0
	switch op {
	case OpGreeting:
		resp.Owner = 0
		resp.Version = f[0]
		resp.Flags = f[1]
		copy(resp.ServerNonce[:], f[2:])
		if len(text) > MaxNodeNameLen {
			return 0, BadRequest
		}
		resp.NodeName = text
		return n, nil
	case OpWelcome:
		resp.Owner = 0
		copy(resp.ServerMAC[:], f)
	case OpAcquired:
		resp.Owner = binary.BigEndian.Uint64(f)
		resp.Token = binary.BigEndian.Uint64(f[8:])
		resp.WaitedMs = binary.BigEndian.Uint32(f[16:])
	default:
		resp.Owner = binary.BigEndian.Uint64(f)
	}
	if op == OpError {
		resp.Reason = ParseReason(text)
		if resp.Reason == 0 {
			return 0, BadRequest
		}
		return n, nil
	}
	if len(text) != 0 {
		return 0, BadRequest
	}
	return n, nil
}

func appendOwner(dst []byte, op byte, owner uint64) []byte {
	dst = append(dst, op)
	return binary.BigEndian.AppendUint64(dst, owner)
}

// AppendAcquire appends an ACQUIRE frame. The caller validates the fields.
func AppendAcquire(dst []byte, owner uint64, leaseSeconds uint16, waitSeconds uint8, key string) []byte {
	dst = appendOwner(dst, OpAcquire, owner)
	dst = binary.BigEndian.AppendUint16(dst, leaseSeconds)
	dst = append(dst, waitSeconds)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendRelease appends a RELEASE frame.
func AppendRelease(dst []byte, owner, token uint64, key string) []byte {
	dst = appendOwner(dst, OpRelease, owner)
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendKeep appends a KEEP frame. The caller validates the fields.
func AppendKeep(dst []byte, owner, token uint64, leaseSeconds uint16, key string) []byte {
	dst = appendOwner(dst, OpKeep, owner)
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = binary.BigEndian.AppendUint16(dst, leaseSeconds)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendPing appends a PING frame.
func AppendPing(dst []byte, owner uint64) []byte {
	return append(appendOwner(dst, OpPing, owner), '\n')
}

// AppendSession appends a SESSION frame (SPEC §6a).
func AppendSession(dst []byte, owner uint64, clientID [ClientIDLen]byte) []byte {
	dst = appendOwner(dst, OpSession, owner)
	dst = append(dst, clientID[:]...)
	return append(dst, '\n')
}

// AppendAbandon appends an ABANDON frame (SPEC §6a): owner is this
// request's, target the owner of the ACQUIRE given back. The caller
// validates the fields.
func AppendAbandon(dst []byte, owner, target uint64, key string) []byte {
	dst = appendOwner(dst, OpAbandon, owner)
	dst = binary.BigEndian.AppendUint64(dst, target)
	dst = append(dst, key...)
	return append(dst, '\n')
}

// AppendHello appends a HELLO frame.
func AppendHello(dst []byte, clientNonce [NonceLen]byte, mac [MACLen]byte, tenant string) []byte {
	dst = append(dst, OpHello, Version)
	dst = append(dst, clientNonce[:]...)
	dst = append(dst, mac[:]...)
	dst = append(dst, tenant...)
	return append(dst, '\n')
}

// AppendGreeting appends a GREETING frame; nodeName is cut to 64 bytes.
func AppendGreeting(dst []byte, flags uint8, serverNonce [NonceLen]byte, nodeName string) []byte {
	dst = append(dst, OpGreeting, Version, flags)
	dst = append(dst, serverNonce[:]...)
	if len(nodeName) > MaxNodeNameLen {
		nodeName = nodeName[:MaxNodeNameLen]
	}
	dst = append(dst, nodeName...)
	return append(dst, '\n')
}

// AppendWelcome appends a WELCOME frame.
func AppendWelcome(dst []byte, serverMAC [MACLen]byte) []byte {
	dst = append(dst, OpWelcome)
	dst = append(dst, serverMAC[:]...)
	return append(dst, '\n')
}

// AppendAcquired appends an ACQUIRED frame.
func AppendAcquired(dst []byte, owner, token uint64, waitedMs uint32) []byte {
	dst = appendOwner(dst, OpAcquired, owner)
	dst = binary.BigEndian.AppendUint64(dst, token)
	dst = binary.BigEndian.AppendUint32(dst, waitedMs)
	return append(dst, '\n')
}

// AppendOwnerOnly appends one of the responses that carry only an owner:
// TIMEOUT, BUSY, RELEASED, NOT HELD or PONG.
func AppendOwnerOnly(dst []byte, op byte, owner uint64) []byte {
	return append(appendOwner(dst, op, owner), '\n')
}

// AppendError appends an ERROR frame; owner is 0 when not attributable.
func AppendError(dst []byte, owner uint64, reason Reason) []byte {
	dst = appendOwner(dst, OpError, owner)
	dst = append(dst, reason.String()...)
	return append(dst, '\n')
}
