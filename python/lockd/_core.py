"""The protocol core shared by the blocking and the asyncio client.

It owns bytes and rules, never sockets: frame encoding and decoding, the
handshake MACs, the range checks of durations and keys, the owner counter,
the wire wait, the delivery gate's arithmetic, and the mapping of answers to
errors (docs/protocol.md §2-§7, the Go client's rules in §6). The transports
in sync.py and aio.py decide when bytes move; what they mean is decided here.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import math
import os
import re
import secrets
import struct
import threading

from . import errors

# docs/protocol.md §4 and §6.
MAX_KEY_BYTES = 128
MAX_LEASE_SECONDS = 3600
MAX_WAIT_SECONDS = 255
MAX_WORK_BUDGET_SECONDS = 250
DEFAULT_LEASE_SECONDS = 30
# An acquire with wait 0, and every release and renewal, has this many
# seconds from the call, retries and reconnects included.
IO_DEADLINE = 5.0
# The drift margin subtracted from a Ticket's validity: 100 ms plus 1 ms per
# second of the span (1000 ppm, far above real oscillators' drift).
DRIFT_FLOOR = 0.1
DRIFT_RATIO = 1000
MAX_OWNER = (1 << 64) - 1
# docs/protocol.md §6a: a session with a request in flight that hears
# nothing for the silence timeout is closed like one whose deadline came;
# PING goes out after a third of it without a word from the server.
DEFAULT_SILENCE_TIMEOUT = 2.0
# The shortest silence_timeout, as in the Go client: a shorter one would
# close a session on a scheduling hiccup, and PING many times a second.
MIN_SILENCE_TIMEOUT = 0.1
# The Go client's defaults for the same options.
DEFAULT_COMPENSATION_QUEUE = 256
DEFAULT_DIAL_TIMEOUT = 5.0
# Backoff between release retries that every session refused at once.
RELEASE_BACKOFF_MIN = 0.02
RELEASE_BACKOFF_MAX = 0.5
# Bounds the attempts of one call; real calls reach their deadline first.
MAX_ATTEMPTS = 32

PROTOCOL_VERSION = 1
CLIENT_LABEL = b"lockd-v1-client"
SERVER_LABEL = b"lockd-v1-server"
_TENANT = re.compile(rb"[A-Za-z0-9._-]{1,32}\Z")

# Request kinds. ABANDON gives back an acquire that ended Indeterminate
# (§6a); PING keeps a live server audible while a request waits.
ACQUIRE, RELEASE, KEEP, ABANDON, PING = 1, 2, 3, 4, 5
# GREETING flags (§3).
FLAG_AUTH, FLAG_ABANDON = 1, 2

# Outcomes of one request on one session.
ACQUIRED = "acquired"
TIMED_OUT = "timed_out"
BUSY = "busy"
RELEASED = "released"
NOT_HELD = "not_held"
PONG = "pong"
REJECTED = "rejected"  # an E for this owner; reason set
UNSENT = "unsent"  # the session failed before a byte of the frame left
EXPIRED = "expired"  # the deadline came before a byte of the frame left
LOST = "lost"  # the session failed or was abandoned after a byte may have left

# Request states within a session.
QUEUED, SENT, DONE = 1, 2, 3

# Reasons after which the server closes the connection (§9).
CLOSING_REASONS = frozenset(
    {"bad_request", "oversized", "auth_required", "auth_failed", "shutting_down"}
)

_ACQUIRE = struct.Struct(">cQHB")
_RELEASE = struct.Struct(">cQQ")
_KEEP = struct.Struct(">cQQH")
_OWNER = struct.Struct(">Q")
_ACQUIRED = struct.Struct(">QQI")

# Fixed part length of each server op (§3).
_FIXED = {b"G"[0]: 18, b"W"[0]: 32, b"A"[0]: 20, b"T"[0]: 8, b"B"[0]: 8,
          b"R"[0]: 8, b"N"[0]: 8, b"P"[0]: 8, b"E"[0]: 8}
_MAX_TEXT = 64


def to_ns(name: str, value) -> int:
    """A duration (seconds as int or float, or a timedelta) in whole
    nanoseconds, the Go client's resolution."""
    if isinstance(value, datetime.timedelta):
        return (value.days * 86400 + value.seconds) * 1_000_000_000 + value.microseconds * 1000
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.UnsupportedDuration(f"{name} {value!r} is not a number of seconds or a timedelta")
    if isinstance(value, float) and not math.isfinite(value):
        raise errors.UnsupportedDuration(f"{name} {value!r} is not finite")
    if isinstance(value, int):
        return value * 1_000_000_000
    return math.ceil(value * 1_000_000_000)


def whole_seconds(name: str, value, lo: int, hi: int) -> int:
    """value rounded up to whole seconds, then checked against lo..hi:
    never clamped (§6)."""
    ns = to_ns(name, value)
    if ns < 0:
        raise errors.UnsupportedDuration(f"{name} {value!r} is negative")
    s = -(-ns // 1_000_000_000)
    if not lo <= s <= hi:
        raise errors.UnsupportedDuration(
            f"{name} {value!r} is {s} s after rounding up, outside {lo}..{hi} s")
    return s


class AcquireParams:
    __slots__ = ("lease", "wait", "budget")

    def __init__(self, lease: int, wait: int, budget: int):
        self.lease, self.wait, self.budget = lease, wait, budget


_params_cache: dict = {}


def acquire_params(lease, wait, min_work_budget) -> AcquireParams:
    """The rounded, range-checked durations of one acquire (§6). Valid
    combinations are remembered: callers repeat the same few."""
    k = (type(lease), lease, type(wait), wait, type(min_work_budget), min_work_budget)
    p = _params_cache.get(k)
    if p is None:
        p = _check_params(lease, wait, min_work_budget)
        if len(_params_cache) < 1024:
            _params_cache[k] = p
    return p


def _check_params(lease, wait, min_work_budget) -> AcquireParams:
    lease_s = whole_seconds("lease", DEFAULT_LEASE_SECONDS if lease is None else lease, 1, MAX_LEASE_SECONDS)
    wait_s = whole_seconds("wait", wait, 0, MAX_WAIT_SECONDS)
    if min_work_budget is None:
        raise errors.UnsupportedDuration(
            f"min_work_budget is required (0..{MAX_WORK_BUDGET_SECONDS} s): the time you need once you hold the lock")
    budget_s = whole_seconds("min_work_budget", min_work_budget, 0, MAX_WORK_BUDGET_SECONDS)
    if budget_s > lease_s:
        raise errors.InsufficientLease(f"min_work_budget {budget_s} s > lease {lease_s} s")
    return AcquireParams(lease_s, wait_s, budget_s)


def key_bytes(key) -> bytes:
    """The key's wire bytes, or BadKey: 1..128 bytes of UTF-8 without
    space, CR or LF (§4, the official clients' rule)."""
    if isinstance(key, str):
        try:
            b = key.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.BadKey(f"{key!r} is not valid UTF-8") from None
    elif isinstance(key, (bytes, bytearray)):
        b = bytes(key)
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            raise errors.BadKey(f"{key!r} is not valid UTF-8") from None
    else:
        raise errors.BadKey(f"{key!r} is not a str")
    if not 1 <= len(b) <= MAX_KEY_BYTES or b" " in b or b"\r" in b or b"\n" in b:
        raise errors.BadKey(f"{key!r}: a key is 1..{MAX_KEY_BYTES} bytes without space, CR or LF")
    return b


def tenant_bytes(tenant: str | None, secret: bytes | None) -> bytes | None:
    if tenant is None or tenant == "":
        if secret:
            raise errors.Config("a secret needs a tenant")
        return None
    b = tenant.encode("ascii", "replace")
    if not _TENANT.match(b):
        raise errors.Config(f"tenant {tenant!r} is not 1..32 bytes of [A-Za-z0-9._-]")
    return b


def drift_margin(span: float) -> float:
    return DRIFT_FLOOR + span / DRIFT_RATIO


def validity(sent_at: float, waited_ms: int, lease_s: int) -> float:
    """The instant until which a grant is surely held, on the monotonic
    clock: send instant + waited_ms + lease, minus the drift margin (§6)."""
    span = waited_ms / 1000 + lease_s
    return sent_at + span - drift_margin(span)


def wire_wait(immediate: bool, deadline: float, now: float) -> int:
    """The wait written just before the send: 0 only for an original wait
    of 0, otherwise ceil(remaining seconds), so a late send never restarts
    the server's wait (§6)."""
    if immediate:
        return 0
    return min(max(math.ceil(deadline - now), 1), MAX_WAIT_SECONDS)


class Owners:
    """The client-wide owner counter: distinct, non-zero, and failing closed
    (OwnerExhausted) instead of reaching 0 again or wrapping (§6)."""

    def __init__(self, last: int = 0):
        self._lock = threading.Lock()
        self._last = last

    def next(self) -> int:
        with self._lock:
            if self._last >= MAX_OWNER:
                raise errors.OwnerExhausted("the owner counter would wrap; the client sends nothing more")
            self._last += 1
            return self._last


def encode(kind: int, owner: int, key: bytes, lease: int, wait: int, token: int) -> bytes:
    """One request frame. An ABANDON's target travels in token's place."""
    if kind == ACQUIRE:
        return _ACQUIRE.pack(b"A", owner, lease, wait) + key + b"\n"
    if kind == RELEASE:
        return _RELEASE.pack(b"R", owner, token) + key + b"\n"
    if kind == KEEP:
        return _KEEP.pack(b"K", owner, token, lease) + key + b"\n"
    if kind == ABANDON:
        return _RELEASE.pack(b"X", owner, token) + key + b"\n"
    return b"P" + _OWNER.pack(owner) + b"\n"


class ClientID:
    """The 16 random bytes that name a client instance on all its
    connections (§6a): a bearer secret. It shows only as a placeholder in
    repr and str, so that printing a client, its vars or a traceback's
    locals never reveals it; the bytes leave only in a SESSION frame."""

    __slots__ = ("_secret",)

    def __init__(self):
        self._secret = secrets.token_bytes(16)

    def __repr__(self):
        return "ClientID(<secret>)"

    __str__ = __repr__

    def session_frame(self, owner: int) -> bytes:
        return b"S" + _OWNER.pack(owner) + self._secret + b"\n"


def session_answer(f: Frame, owner: int):
    """Checks the answer to SESSION: PONG with its owner."""
    if f.op == "E":
        raise refusal(f.text.decode("ascii", "replace"), "session")
    if f.op != "P" or f.owner != owner or f.text:
        raise errors.Protocol(f"handshake: SESSION answered {f.op!r} for owner {f.owner}, not PONG for {owner}")


def client_mac(secret: bytes, server_nonce: bytes, client_nonce: bytes, tenant: bytes) -> bytes:
    return hmac.new(secret, CLIENT_LABEL + server_nonce + client_nonce + tenant, hashlib.sha256).digest()


def server_mac(secret: bytes, client_nonce: bytes, server_nonce: bytes, tenant: bytes) -> bytes:
    return hmac.new(secret, SERVER_LABEL + client_nonce + server_nonce + tenant, hashlib.sha256).digest()


class Frame:
    """One server frame: op (a one-byte str), owner, token, waited_ms, and
    the raw fixed part and text."""
    __slots__ = ("op", "owner", "token", "waited_ms", "fixed", "text")

    def __init__(self, op, owner=0, token=0, waited_ms=0, fixed=b"", text=b""):
        self.op, self.owner, self.token, self.waited_ms = op, owner, token, waited_ms
        self.fixed, self.text = fixed, text


class Decoder:
    """Splits a byte stream into server frames: the op, exactly the op's
    fixed bytes (which may contain LF), then text up to LF (§2)."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data) -> list[Frame]:
        buf = self.buf
        buf += data
        frames = []
        pos = 0
        n = len(buf)
        while pos < n:
            fixed = _FIXED.get(buf[pos])
            if fixed is None:
                raise errors.Protocol(f"unknown frame op {bytes(buf[pos:pos + 1])!r}")
            start = pos + 1 + fixed
            if n <= start:
                break
            end = buf.find(b"\n", start, start + _MAX_TEXT + 1)
            if end < 0:
                if n > start + _MAX_TEXT:
                    raise errors.Protocol("a server frame without LF within its limit")
                break
            op = buf[pos]
            if op == 65:  # A
                owner, token, waited = _ACQUIRED.unpack_from(buf, pos + 1)
                frames.append(Frame("A", owner, token, waited))
            elif fixed == 8:
                frames.append(Frame(chr(op), _OWNER.unpack_from(buf, pos + 1)[0],
                                    text=bytes(buf[start:end])))
            else:
                frames.append(Frame(chr(op), fixed=bytes(buf[pos + 1:start]), text=bytes(buf[start:end])))
            pos = end + 1
        if pos:
            del buf[:pos]
        return frames


def check_text(f: Frame):
    """Only E, and G's node name, carry text (§3)."""
    if f.text and f.op not in ("E", "G"):
        raise errors.Protocol(f"{f.op!r} frame with text")


class Handshake:
    """The client side of §7, without I/O: greeting(frame) returns the bytes
    to send (or None), welcome(frame) checks the server's proof."""

    def __init__(self, tenant: bytes | None, secret: bytes | None):
        self.tenant, self.secret = tenant, secret or b""
        self.client_nonce = b""
        self.server_nonce = b""
        self.serves_abandon = False

    def greeting(self, f: Frame) -> bytes | None:
        if f.op == "E":
            raise refusal(f.text.decode("ascii", "replace"), "handshake")
        if f.op != "G" or len(f.fixed) != 18 or f.fixed[0] != PROTOCOL_VERSION:
            raise errors.Protocol(f"handshake: expected a version 1 GREETING, got {f.op!r}")
        # Flags this client does not know are ignored: a later server may
        # announce more than it serves.
        auth = f.fixed[1] & FLAG_AUTH
        self.serves_abandon = bool(f.fixed[1] & FLAG_ABANDON)
        self.server_nonce = f.fixed[2:18]
        if auth and not self.secret:
            raise errors.Auth("the server requires authentication and the client has no secret")
        if self.secret and not auth:
            raise errors.Auth("the client has a secret and the server does not authenticate: refusing an unproven server")
        if self.tenant is None:
            return None
        self.client_nonce = os.urandom(16)
        mac = client_mac(self.secret, self.server_nonce, self.client_nonce, self.tenant) if self.secret else bytes(32)
        return b"H" + bytes([PROTOCOL_VERSION]) + self.client_nonce + mac + self.tenant + b"\n"

    def welcome(self, f: Frame):
        if f.op == "E":
            raise refusal(f.text.decode("ascii", "replace"), "handshake")
        if f.op != "W" or len(f.fixed) != 32:
            raise errors.Protocol(f"handshake: expected WELCOME, got {f.op!r}")
        if self.secret:
            want = server_mac(self.secret, self.client_nonce, self.server_nonce, self.tenant)
            if not hmac.compare_digest(want, f.fixed):
                raise errors.Auth("the server's WELCOME does not prove the secret")


def refusal(reason: str, what: str) -> errors.LockdError:
    """The error of an E the server attributed to one request."""
    cls = {
        "bad_key": errors.BadKey,
        "bad_lease": errors.UnsupportedDuration,
        "token_exhausted": errors.TokenExhausted,
        "unavailable": errors.Unavailable,
        "shutting_down": errors.ShuttingDown,
        "auth_required": errors.Auth,
        "auth_failed": errors.Auth,
    }.get(reason, errors.Protocol)
    err = cls(f"{what}: server answered E {reason}")
    err.reason = reason
    return err


def answers(kind: int, out: str) -> bool:
    if out == ACQUIRED:
        return kind in (ACQUIRE, KEEP)
    if out in (TIMED_OUT, BUSY):
        return kind == ACQUIRE
    if out == RELEASED:
        return kind in (RELEASE, ABANDON)
    if out == NOT_HELD:
        return kind in (RELEASE, KEEP, ABANDON)
    if out == PONG:
        return kind == PING
    return True


OUTCOME_OF_OP = {"A": ACQUIRED, "T": TIMED_OUT, "B": BUSY, "R": RELEASED, "N": NOT_HELD, "E": REJECTED,
                 "P": PONG}


class Request:
    """The state of one call's request: set by the caller, then guarded by
    the session it is enqueued on until its outcome is set."""
    __slots__ = ("kind", "owner", "key", "lease", "immediate", "token", "deadline",
                 "state", "sent_at", "out", "reason", "granted", "waited_ms", "cause",
                 "expired", "may_have_left", "waiter", "woken", "abandonable")

    def __init__(self, kind, owner, key, deadline, lease=0, immediate=False, token=0):
        self.kind, self.owner, self.key, self.deadline = kind, owner, key, deadline
        self.lease, self.immediate, self.token = lease, immediate, token
        self.state = 0
        self.sent_at = 0.0
        self.out = None
        self.reason = ""
        self.granted = 0
        self.waited_ms = 0
        self.cause = None
        self.expired = False
        self.may_have_left = False
        self.waiter = None
        self.woken = False
        # Sent on a session that declared the client's SESSION (§6a), so
        # the server can be asked to give back what it made of it.
        self.abandonable = False


def token_call_failure(op: str, key: bytes, token: int, req: Request, out, cause) -> errors.LockdError:
    """The error of a release or renewal that ended other than with R, N or
    its A: both are retried after a byte may have left, so the same rules
    decide what the caller can rely on."""
    what = f"{op} of {key.decode()!r} token {token}"
    if cause is not None:
        if not req.may_have_left and isinstance(cause, (errors.Closed, errors.NotConnected)):
            return type(cause)(f"{what}: {cause}")
        return errors.Indeterminate(f"{what}: {cause}")
    if out == REJECTED:
        if req.may_have_left or req.reason == "unavailable":
            return errors.Indeterminate(f"{what}: last answer E {req.reason}")
        return refusal(req.reason, what)
    if out in (UNSENT, EXPIRED):
        return errors.Indeterminate(f"{what}: the deadline came before it was sent")
    return errors.Indeterminate(f"{what} got no answer: {req.cause}")


def secret_bytes(secret) -> bytes | None:
    """A secret as bytes; a str is the hex of the auth file's line."""
    if secret is None or isinstance(secret, (bytes, bytearray)):
        return bytes(secret) if secret else None
    try:
        return bytes.fromhex(secret.strip())
    except ValueError:
        raise errors.Config("a str secret is the hex of the auth file (openssl rand -hex 32)") from None


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise errors.Config(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


# What exchange does after an attempt's outcome.
DONE_, RETRY, PAUSE = 0, 1, 2


def next_step(req: Request, out: str, retry_sent: bool) -> int:
    """Whether an attempt's outcome ends the call, is retried at once on
    another session (certainly unsent), or retried after a backoff (a
    release or renewal that was lost — its repeat cannot grant anything —
    or refused by a draining or leaderless server)."""
    if out == LOST:
        req.may_have_left = True
    if req.expired:
        return DONE_
    if out == UNSENT:
        return RETRY
    if retry_sent and (out == LOST or out == REJECTED and req.reason in ("shutting_down", "unavailable")):
        return PAUSE
    return DONE_


def reset_for_retry(req: Request):
    req.state, req.out, req.cause = 0, None, None


def acquire_failure(req: Request, out: str, now: float) -> errors.LockdError:
    """The error of an acquire that ended other than ACQUIRED."""
    what = f"acquire of {req.key.decode()!r}"
    if out == TIMED_OUT:
        return errors.Timeout(f"{what}: TIMEOUT, not acquired")
    if out == BUSY:
        return errors.Busy(f"{what}: BUSY, admission refused")
    if out == REJECTED:
        return refusal(req.reason, what)
    if out in (UNSENT, EXPIRED):
        return errors.Timeout(f"{what}: the deadline came before the request was sent")
    if not req.immediate and now >= req.deadline:
        return errors.WaitElapsed(f"{what}: the wait ran out after the request may have reached the server; "
                                  f"its session was closed ({req.cause})")
    return errors.Indeterminate(f"{what} may have reached the server: {req.cause}")


def gate(req: Request, p: AcquireParams, now: float, cancelled: bool = False):
    """The Ticket delivery gate (§6): (valid_until, None) for a grant that
    may be handed out, or (None, error) for one that must be released as
    compensation — found after the call's deadline (or its cancellation),
    or with less validity left than the work budget."""
    what = f"{req.key.decode()!r} was granted (token {req.granted})"
    valid_until = validity(req.sent_at, req.waited_ms, p.lease)
    if now >= req.deadline or cancelled:
        cls = errors.WaitElapsed if not req.immediate and now >= req.deadline else errors.Indeterminate
        return None, cls(f"{what} but the call had ended")
    left = valid_until - now
    if left < p.budget:
        return None, errors.Indeterminate(
            f"{what} with {left:.3f} s of validity left, below the work budget {p.budget} s")
    return valid_until, None


class PoolFull(errors.Busy):
    """A pick that found every session at its in-flight limit: unsent."""


class Deadline(errors.Timeout):
    """The call's deadline came while it waited in the client: unsent."""


class Due(errors.LockdError):
    """An answer arrived for a request whose deadline had already come: the
    deadline is acted on first, as if the answer had not arrived (§6)."""


class Silent(errors.LockdError):
    """The server said nothing for the silence timeout while a request was
    in flight (§6a)."""


ABANDONED = "session closed: a call ended after its request may have been sent"
SILENT = "session closed: the server was silent for the silence timeout"
INF = float("inf")


def check_options(compensation_queue, silence_timeout, dial_timeout):
    """The Go client's rule for its options: 0 means the default, a
    negative value is refused, and so is a silence_timeout below
    MIN_SILENCE_TIMEOUT. Returns (compensation_queue, silence_timeout,
    dial_timeout) with the defaults in place."""
    if isinstance(compensation_queue, bool) or not isinstance(compensation_queue, int):
        raise errors.Config(f"compensation_queue {compensation_queue!r} is not an int")
    if compensation_queue < 0:
        raise errors.Config(f"compensation_queue {compensation_queue} is negative")
    for name, v in (("silence_timeout", silence_timeout), ("dial_timeout", dial_timeout)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < INF:
            raise errors.Config(f"{name} {v!r} is not a non-negative number of seconds")
    if 0 < silence_timeout < MIN_SILENCE_TIMEOUT:
        raise errors.Config(f"silence_timeout {silence_timeout!r} is below {MIN_SILENCE_TIMEOUT} s")
    return (compensation_queue or DEFAULT_COMPENSATION_QUEUE, silence_timeout or DEFAULT_SILENCE_TIMEOUT,
            dial_timeout or DEFAULT_DIAL_TIMEOUT)


class Stats:
    """Counters of a client's life: sessions dialled to replace closed ones
    (reconnects), sessions closed because a call ended after its request
    may have left (abandoned_sessions: a waiting acquire that ran out, on
    its own session), sessions closed for a protocol violation, and the
    compensating releases of the delivery gate — queued, answered
    (RELEASED or NOT HELD), without an answer in 5 s, or dropped because
    the queue was full and left to their lease. Sessions closed because
    the server was silent for the silence timeout (silent_sessions), and
    the ABANDONs of acquires that ended Indeterminate with their session
    closed (§6a): sent, answered RELEASED (a grant given back), answered
    NOT HELD (a waiter dropped, or nothing to give back), and given up
    (queue full, or no answer within 5 s: left to the lease)."""

    def __init__(self):
        self.reconnects = 0
        self.abandoned_sessions = 0
        self.protocol_errors = 0
        self.compensations_queued = 0
        self.compensations_done = 0
        self.compensations_failed = 0
        self.compensations_dropped = 0
        self.silent_sessions = 0
        self.abandons_sent = 0
        self.abandons_released = 0
        self.abandons_not_held = 0
        self.abandons_given_up = 0

    def __repr__(self):
        return f"Stats({vars(self)})"
