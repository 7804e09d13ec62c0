package codec

// Reason is the reason code of an ERROR frame (SPEC §9). It is also the
// error value the decoders return, so callers compare with ==.
type Reason uint8

// The reasons of SPEC §9. The zero value is not a reason.
const (
	BadRequest Reason = iota + 1
	Oversized
	AuthRequired
	AuthFailed
	BadKey
	BadLease
	BadOwner
	DupOwner
	TokenExhausted
	Unavailable
	ShuttingDown
)

var reasonText = [...]string{
	BadRequest:     "bad_request",
	Oversized:      "oversized",
	AuthRequired:   "auth_required",
	AuthFailed:     "auth_failed",
	BadKey:         "bad_key",
	BadLease:       "bad_lease",
	BadOwner:       "bad_owner",
	DupOwner:       "dup_owner",
	TokenExhausted: "token_exhausted",
	Unavailable:    "unavailable",
	ShuttingDown:   "shutting_down",
}

// String returns the wire text of the reason.
func (r Reason) String() string {
	if r == 0 || int(r) >= len(reasonText) {
		return "invalid_reason"
	}
	return reasonText[r]
}

func (r Reason) Error() string { return "lockd: " + r.String() }

// ClosesConnection reports whether the server closes the connection after
// answering with this reason: the framing is no longer trusted, the peer
// is not authenticated, or the server is draining.
func (r Reason) ClosesConnection() bool {
	switch r {
	case BadRequest, Oversized, AuthRequired, AuthFailed, ShuttingDown:
		return true
	}
	return false
}

// ParseReason maps wire text to a Reason; 0 when it is not one.
func ParseReason(text []byte) Reason {
	for r := BadRequest; int(r) < len(reasonText); r++ {
		if string(text) == reasonText[r] {
			return r
		}
	}
	return 0
}
