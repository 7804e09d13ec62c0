package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/lockd/lockd/codec"
)

// Errors of the client. Compare with errors.Is: most are returned wrapped
// with context. Each says whether the lock may be held afterwards.
var (
	// ErrBadKey: the key is not 1..128 bytes of UTF-8 free of space, CR
	// and LF, or the server answered bad_key. Nothing was acquired or
	// released by this call; after Acquire the lock is not held. Its text
	// states the rule.
	ErrBadKey = errors.New("lockd client: bad key (want 1..128 bytes of UTF-8 without spaces or line breaks)")

	// ErrUnsupportedDuration: a duration is negative, or out of range
	// after rounding up to whole seconds (lease 1..3600 s, wait 0..255 s,
	// MinWorkBudget 0..250 s and required), or the server answered
	// bad_lease. Nothing was sent; the lock is not held.
	ErrUnsupportedDuration = errors.New("lockd client: unsupported duration")

	// ErrInsufficientLease: MinWorkBudget exceeds the lease, so no grant
	// could ever leave enough time. Nothing was sent; the lock is not held.
	ErrInsufficientLease = errors.New("lockd client: work budget exceeds the lease")

	// ErrTimeout: the wait elapsed without the lock — the server answered
	// TIMEOUT, or the operation deadline (or the context) ended while the
	// request was still queued in the client, certainly not sent. A
	// definitive non-acquisition: the lock is not held.
	ErrTimeout = errors.New("lockd client: timed out without the lock")

	// ErrBusy: admission was refused, by the server (BUSY) or by the
	// client's in-flight limit before sending. A definitive
	// non-acquisition: the lock is not held.
	ErrBusy = errors.New("lockd client: busy, admission refused")

	// ErrUnavailable: the server could not reach its key's replication
	// group in time (E unavailable). After Acquire a definitive
	// non-acquisition — the server releases a late grant itself: the lock
	// is not held. Release never returns it: a release answered so may
	// still apply, so it ends ErrIndeterminate.
	ErrUnavailable = errors.New("lockd client: unavailable")

	// ErrTokenExhausted: the key's token counter would overflow (E
	// token_exhausted). The lock is not held.
	ErrTokenExhausted = errors.New("lockd client: token counter exhausted")

	// ErrShuttingDown: the server refused this request because it is
	// draining (E shutting_down). The lock is not held; a release answered
	// so did not release.
	ErrShuttingDown = errors.New("lockd client: server shutting down")

	// ErrIndeterminate: the outcome is unknown. After Acquire the caller
	// does not hold the lock, but the server may have granted it to the
	// request, unseen. The client gives back whatever the server did:
	// where it knew the token it queued a compensating release; where the
	// request's session was closed after it may have left, it queues an
	// ABANDON (SPEC §6a) on another session. The error says which. A full
	// compensation queue, an answer that does not come within 5 s, or a
	// server that does not take ABANDON leaves such a grant to its lease,
	// held by nobody. After Release the lock may still be held until its
	// lease expires.
	ErrIndeterminate = errors.New("lockd client: outcome indeterminate")

	// ErrWaitElapsed accompanies ErrIndeterminate (both match errors.Is)
	// when an acquire with a wait ends because that wait ran out after its
	// request may have reached the server. The server's wait is never
	// shorter than the caller's, so a queued acquire that waits its whole
	// time ends so, never with a TIMEOUT. The client then gives back
	// whatever the server did: its ABANDON releases a grant made at the
	// last instant, or drops the waiter, so the next waiter is not held
	// up; on a server that does not take ABANDON such a grant lapses with
	// its lease, unseen. Code that only asks "do I hold it?" may treat it
	// like ErrTimeout; the lock is not held by this caller.
	ErrWaitElapsed = errors.New("lockd client: the wait ran out")

	// ErrNotHeld: the server answered NOT HELD to a release — the key is
	// absent, the lease expired or the token is no longer current. The
	// caller does not hold the lock (and may not have held it for a while:
	// fence writes with the token).
	ErrNotHeld = errors.New("lockd client: lock not held")

	// ErrOwnerExhausted: the client-wide owner counter would wrap; the
	// client fails closed and sends nothing more. After Acquire the lock
	// is not held; a Release did not happen, so its lock still is.
	ErrOwnerExhausted = errors.New("lockd client: owner ids exhausted")

	// ErrNotConnected: no session could take the request — every attempt
	// failed before a byte of it left. Certainly not sent: after Acquire
	// the lock is not held, after Release it is still held.
	ErrNotConnected = errors.New("lockd client: no session could send the request")

	// ErrClosed: the client is closed; nothing was sent by this call.
	// After Acquire the lock is not held; a Release did not happen.
	ErrClosed = errors.New("lockd client: closed")

	// ErrAuth: the handshake failed — the server refused the tenant or
	// MAC, the server's MAC did not verify, or client and server disagree
	// on whether authentication is on. No session, nothing held.
	ErrAuth = errors.New("lockd client: authentication failed")

	// ErrTLS: the TLS handshake failed — the server's certificate did not
	// verify against Config.TLS, the server refused this client's
	// certificate (or its absence), or the other end does not speak TLS.
	// No session, nothing held.
	ErrTLS = errors.New("lockd client: TLS handshake failed")

	// ErrProtocol: the server broke the protocol (an answer for an unknown
	// owner, a malformed frame, a refusal a valid request never earns).
	// The session that saw it is closed. Returned for a request the server
	// refused with bad_owner, dup_owner or bad_request: that request did
	// not take effect (after Acquire the lock is not held, after Release it
	// still is). Requests in flight on the closed session end
	// Indeterminate.
	ErrProtocol = errors.New("lockd client: protocol violation")

	// ErrConfig: Dial was given an unusable Config. Nothing was sent.
	ErrConfig = errors.New("lockd client: invalid config")
)

// reasonError maps a refusal the server attributed to one request to the
// client's error. The codec reason stays in the chain for errors.Is.
func reasonError(r codec.Reason) error {
	var sentinel error
	switch r {
	case codec.BadKey:
		sentinel = ErrBadKey
	case codec.BadLease:
		sentinel = ErrUnsupportedDuration
	case codec.TokenExhausted:
		sentinel = ErrTokenExhausted
	case codec.Unavailable:
		sentinel = ErrUnavailable
	case codec.ShuttingDown:
		sentinel = ErrShuttingDown
	case codec.AuthRequired, codec.AuthFailed:
		sentinel = ErrAuth
	default:
		sentinel = ErrProtocol
	}
	return fmt.Errorf("%w (server: %w)", sentinel, r)
}

// withContextEnd adds ctx's error to err's chain when ctx has ended and
// err does not carry it yet, so that a call its context ended satisfies
// errors.Is(err, context.Canceled) or context.DeadlineExceeded beside
// the error that says what became of the lock (ErrIndeterminate,
// ErrWaitElapsed, ErrTimeout …). A context whose deadline has passed
// counts as ended even if its own timer has not fired yet: that deadline
// was the call's. The message is made readable. nil stays nil, without
// allocating.
func (c *Client) withContextEnd(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	ended := ctx.Err()
	if deadline, ok := ctx.Deadline(); ended == nil && ok && !c.clock.Now().Before(deadline) {
		ended = context.DeadlineExceeded
	}
	if ended == nil || errors.Is(err, ended) {
		return readable(err)
	}
	return readable(&contextEnded{err: err, ctx: ended})
}

// errPrefix begins the text of every error of the package.
const errPrefix = "lockd client: "

// readable gives err a message that says errPrefix once, at its start,
// however many of the package's errors its chain holds (ErrIndeterminate
// and ErrWaitElapsed, a refusal inside a failed release …); the chain is
// kept for errors.Is. A message without the prefix is left alone, and so
// is one that has it once at its start, without allocating.
func readable(err error) error {
	msg := err.Error()
	n := strings.Count(msg, errPrefix)
	if n == 0 || (n == 1 && strings.HasPrefix(msg, errPrefix)) {
		return err
	}
	return &rewordedError{msg: errPrefix + strings.ReplaceAll(msg, errPrefix, ""), err: err}
}

// rewordedError is err with the message readable made.
type rewordedError struct {
	msg string
	err error
}

func (e *rewordedError) Error() string { return e.msg }
func (e *rewordedError) Unwrap() error { return e.err }

// contextEnded is an error of a call whose context had ended.
type contextEnded struct{ err, ctx error }

func (e *contextEnded) Error() string   { return e.err.Error() + " (" + e.ctx.Error() + ")" }
func (e *contextEnded) Unwrap() []error { return []error{e.err, e.ctx} }
