"""The client's exceptions, named like the Go client's errors. Each says
whether the lock may be held afterwards. Where a standard exception means
the same, they subclass it too: Timeout and WaitElapsed are TimeoutErrors,
input errors ValueErrors, NotConnected a ConnectionError."""


class LockdError(Exception):
    """Every error of the client. `reason` is the server's E reason when the
    server gave one."""
    reason = ""


class BadKey(LockdError, ValueError):
    """The key is not 1..128 bytes of UTF-8 free of space, CR and LF, or the
    server answered bad_key. Nothing was acquired or released."""


class UnsupportedDuration(LockdError, ValueError):
    """A duration is negative, not a number, or out of range after rounding
    up to whole seconds (lease 1..3600, wait 0..255, min_work_budget
    0..250), or the server answered bad_lease. Nothing was sent."""


class InsufficientLease(LockdError, ValueError):
    """min_work_budget exceeds the lease. Nothing was sent."""


class Timeout(LockdError, TimeoutError):
    """The wait elapsed without the lock: a TIMEOUT answer, or the deadline
    came while the request was still in the client, certainly unsent. The
    lock is not held."""


class Busy(LockdError):
    """Admission refused (BUSY, or every session at its in-flight limit
    before sending). The lock is not held."""


class Unavailable(LockdError):
    """Cluster: the key's group had no leader in time (E unavailable). After
    acquire the lock is not held: the server releases a late grant itself."""


class TokenExhausted(LockdError):
    """The key's token counter would overflow. The lock is not held."""


class ShuttingDown(LockdError):
    """The server is draining and refused the request. Nothing happened."""


class Indeterminate(LockdError):
    """The outcome is unknown. After acquire the lock may be held, by nobody
    who knows its token, until its lease ends: where the client knew the
    token it queued a compensating release, and where the request's
    session closed on a server that serves ABANDON (docs/protocol.md §6a)
    it queued an ABANDON, which frees a grant at once when it gets through
    (Stats counts both). After release the lock may still be held until
    its lease ends."""


class WaitElapsed(Indeterminate, TimeoutError):
    """An acquire with a wait ended because that wait ran out after its
    request may have reached the server (an Indeterminate too). The server's
    wait is never shorter than the caller's, so a queued acquire that waits
    its whole time ends so, never with a TIMEOUT. Where the server serves
    ABANDON (docs/protocol.md §6a) the client has queued one that gives
    back whatever the server made of the request; otherwise a grant made
    just before the end lives out its lease. Either way the caller does not
    hold the lock: it never got the token."""


class NotHeld(LockdError):
    """NOT HELD: the key is absent, the lease expired or the token is no
    longer current."""


class OwnerExhausted(LockdError):
    """The client-wide owner counter would wrap; the client fails closed and
    sends nothing more."""


class NotConnected(LockdError, ConnectionError):
    """No session could take the request: every attempt failed before a byte
    of it left. Certainly not sent."""


class Closed(LockdError):
    """The client is closed; nothing was sent by this call."""


class Auth(LockdError):
    """The handshake failed: tenant or MAC refused, the server's MAC did not
    verify, or client and server disagree on whether auth is on."""


class TLS(LockdError):
    """The TLS handshake failed."""


class Protocol(LockdError):
    """The server broke the protocol, or refused a request with bad_owner,
    dup_owner or bad_request; the session that saw it is closed."""


class Config(LockdError, ValueError):
    """The client was given an unusable configuration."""
