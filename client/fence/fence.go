// Package fence makes a resource refuse the writes of a lock holder whose
// lease has lapsed. A lease alone cannot: a holder paused past its lease
// (a GC pause, a stopped VM, a slow disk) wakes up believing it still
// holds the lock while the next holder is already writing. lockd's
// fencing token grows strictly per key, across restarts and leader
// changes, so the resource can keep, per key, the highest token it has
// seen — the mark — and refuse any token below it.
//
// SQL does that inside the caller's own database transaction, so the mark
// moves and the guarded writes commit together or not at all. Handler does
// it for an HTTP service, against a Store (SQL, or Memory for one
// process), and SetTicket puts a Ticket's key and token on the requests of
// its client.
//
// An equal token is accepted: a token names one grant, so a token equal
// to the mark is the same holder writing again within its lease (a holder
// may commit many transactions under one token), never a different one.
// A token below the mark is stale, and refused with a *StaleError
// (errors.Is(err, ErrStale)).
package fence

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// ErrStale matches every *StaleError.
var ErrStale = errors.New("fence: stale token")

// ErrBadKey is a key lockd would not have locked: empty, over 128 bytes,
// invalid UTF-8, or containing a space, CR or LF.
var ErrBadKey = errors.New("fence: bad key (1..128 bytes of UTF-8, no space, CR or LF)")

// ErrBadToken is a token lockd never issues: 0, or one a SQL bigint
// cannot hold (over 2^63-1).
var ErrBadToken = errors.New("fence: bad token (1..2^63-1)")

// StaleError is a token refused because the key's mark is above it.
type StaleError struct {
	Key   string
	Token uint64
	// Mark is the token it lost to, the key's mark; 0 when the mark could
	// not be read after the refusal.
	Mark uint64
}

func (e *StaleError) Error() string {
	if e.Mark == 0 {
		return fmt.Sprintf("fence: key %q: token %d is stale", e.Key, e.Token)
	}
	return fmt.Sprintf("fence: key %q: token %d is stale, a holder with token %d came after it", e.Key, e.Token, e.Mark)
}

// Is makes errors.Is(err, ErrStale) hold.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// validate applies lockd's key rules and the token's range. It returns
// only predeclared errors: it is on Memory's allocation-free path.
func validate(key string, token uint64) error {
	if len(key) == 0 || len(key) > 128 || !utf8.ValidString(key) {
		return ErrBadKey
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == ' ' || c == '\r' || c == '\n' {
			return ErrBadKey
		}
	}
	if token == 0 || token > math.MaxInt64 {
		return ErrBadToken
	}
	return nil
}
