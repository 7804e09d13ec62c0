"""lockd.fence: make a resource refuse the writes of a lock holder whose
lease has lapsed.

A lease alone cannot: a holder paused past its lease (a GC pause, a stopped
VM) wakes up believing it still holds the lock while the next holder is
already writing. lockd's fencing token grows strictly per key, across
restarts and leader changes, so the resource keeps, per key, the highest
token it has seen (the mark) and refuses any token below it.

``SQL`` does that inside the caller's own DB-API transaction (psycopg 3 on
PostgreSQL, sqlite3), so the mark moves and the guarded writes commit
together or not at all. ``WSGIMiddleware`` and ``ASGIMiddleware`` do it for
an HTTP service, reading the ``Lockd-Key`` and ``Lockd-Token`` request
headers, against a store (``SQL`` or ``Memory``); ``set_ticket`` puts a
ticket's key and token on a client's request headers.

An equal token is accepted: a token names one grant, so a token equal to the
mark is the same holder writing again within its lease, never another one.
A token below the mark raises ``StaleToken``.

This is the Python twin of the Go package client/fence: the same table,
the same statement, the same headers and answers.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["HEADER_KEY", "HEADER_TOKEN", "ASGIMiddleware", "BadFence", "Memory", "SQL",
           "StaleToken", "WSGIMiddleware", "set_headers", "set_ticket"]

HEADER_KEY = "Lockd-Key"
HEADER_TOKEN = "Lockd-Token"

_MAX_TOKEN = 2**63 - 1  # a SQL bigint


class StaleToken(Exception):
    """A token refused because the key's mark is above it. ``mark`` is the
    token it lost to (0 when it could not be read after the refusal)."""

    def __init__(self, key: str, token: int, mark: int):
        self.key, self.token, self.mark = key, token, mark
        if mark:
            msg = f"fence: key {key!r}: token {token} is stale, a holder with token {mark} came after it"
        else:
            msg = f"fence: key {key!r}: token {token} is stale"
        super().__init__(msg)


class BadFence(ValueError):
    """A key lockd would not have locked (empty, over 128 bytes of UTF-8,
    with a space, CR or LF) or a token it never issues (not 1..2**63-1)."""


def _validate(key, token):
    if not isinstance(key, str):
        raise BadFence(f"fence: bad key {key!r}: not a str")
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        raise BadFence(f"fence: bad key {key!r}: not UTF-8") from None
    if not 1 <= len(raw) <= 128 or any(c in raw for c in b" \r\n"):
        raise BadFence(f"fence: bad key {key!r} (1..128 bytes of UTF-8, no space, CR or LF)")
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= _MAX_TOKEN:
        raise BadFence(f"fence: bad token {token!r} (1..2**63-1)")


_CREATE = ("CREATE TABLE IF NOT EXISTS lockd_fences "
           "(key text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0))")
# One statement decides: it inserts the key's first mark or raises the mark
# to a token at or above it, returning the row; a token below the mark
# returns no row. The row stays locked until the transaction ends.
_RAISE = ("INSERT INTO lockd_fences (key, token) VALUES ({p}, {p}) ON CONFLICT (key) DO UPDATE "
          "SET token = excluded.token WHERE lockd_fences.token <= excluded.token RETURNING token")
_MARK = "SELECT token FROM lockd_fences WHERE key = {p}"
_PLACEHOLDERS = {"postgres": "%s", "sqlite": "?"}


class SQL:
    """The marks in a table of the guarded database::

        CREATE TABLE IF NOT EXISTS lockd_fences (
            key   text PRIMARY KEY,
            token bigint NOT NULL CHECK (token > 0))

    ``dialect`` is "postgres" (psycopg 3, %s placeholders) or "sqlite"
    (sqlite3, ? placeholders). ``connect`` makes a new DB-API connection;
    only ``fence`` (the middleware's store call) needs it. One table serves
    one lockd tenant: another tenant's keys are other locks with their own
    tokens."""

    def __init__(self, dialect: str, connect=None):
        if dialect not in _PLACEHOLDERS:
            raise ValueError(f"fence: dialect {dialect!r}: want one of {sorted(_PLACEHOLDERS)}")
        p = _PLACEHOLDERS[dialect]
        self.dialect = dialect
        self._raise, self._mark = _RAISE.format(p=p), _MARK.format(p=p)
        self._connect = connect

    def init(self, conn) -> None:
        """Create the fences table if it does not exist, and commit."""
        cur = conn.cursor()
        try:
            cur.execute(_CREATE)
        finally:
            cur.close()
        conn.commit()

    def check(self, cursor, key: str, token: int) -> None:
        """Raise key's mark to token in the cursor's transaction, the one that
        makes the guarded writes, or raise StaleToken when the mark is above
        token (then roll back). The mark moves only if it commits. One
        statement, one round trip."""
        _validate(key, token)
        cursor.execute(self._raise, (key, token))
        if cursor.fetchall():
            return
        # Refused. The mark is read only to say what the token lost to.
        cursor.execute(self._mark, (key,))
        row = cursor.fetchone()
        raise StaleToken(key, token, row[0] if row else 0)

    def fence(self, key: str, token: int) -> None:
        """check in a connection and transaction of its own, committed at
        once: the store call of the middlewares. It orders requests as they
        arrive; a service whose writes can be delayed past a newer holder's
        should check inside the transaction of those writes instead."""
        if self._connect is None:
            raise ValueError("fence: SQL.fence needs SQL(dialect, connect=...)")
        conn = self._connect()
        try:
            cur = conn.cursor()
            try:
                self.check(cur, key, token)
            finally:
                cur.close()
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()


class Memory:
    """The marks in this process's memory, for a resource that lives and
    dies with it; lost on restart. A mark is kept for every key fenced."""

    def __init__(self):
        self._lock = threading.Lock()
        self._marks: dict[str, int] = {}

    def fence(self, key: str, token: int) -> None:
        """Raise key's mark to token, or raise StaleToken."""
        _validate(key, token)
        with self._lock:
            mark = self._marks.get(key, 0)
            if mark > token:
                raise StaleToken(key, token, mark)
            self._marks[key] = token

    async def afence(self, key: str, token: int) -> None:
        """fence, for the ASGI middleware: it never blocks."""
        self.fence(key, token)


def set_headers(headers, key: str, token: int) -> None:
    """Put a key and a token on a mapping of request headers (a dict for
    urllib, requests or httpx), e.g. lockctl exec's LOCKD_KEY and
    LOCKD_TOKEN."""
    headers[HEADER_KEY] = key
    headers[HEADER_TOKEN] = str(token)


def set_ticket(headers, ticket) -> None:
    """Put a lockd Ticket's key and token on a mapping of request headers."""
    set_headers(headers, ticket.key, ticket.token)


_STALE = b"lockd fence: stale token: a newer lock holder came first"
_MISSING = b"lockd fence: want one Lockd-Key and one Lockd-Token header"
_NOT_DECIMAL = b"lockd fence: Lockd-Token is not a decimal token"
_FAILED = b"lockd fence: the fence store failed"


def _parse(keys, tokens):
    """From the raw header values (bytes): (status, body) of a refusal, or
    (key, token) of a request to fence."""
    if len(keys) != 1 or len(tokens) != 1:
        return 400, _MISSING
    if not tokens[0].isdigit():  # bytes: ASCII digits only
        return 400, _NOT_DECIMAL
    try:
        key = keys[0].decode("utf-8")
    except UnicodeDecodeError:
        return 400, b"lockd fence: bad key (1..128 bytes of UTF-8, no space, CR or LF)"
    return key, int(tokens[0])


def _answer(err):
    if isinstance(err, StaleToken):
        return 409, _STALE
    if isinstance(err, BadFence):
        return 400, b"lockd " + str(err).encode()
    return 503, _FAILED


_REASONS = {400: "Bad Request", 409: "Conflict", 503: "Service Unavailable"}


class WSGIMiddleware:
    """Fence every request before the WSGI app sees it: pass it on only if
    the store accepts its Lockd-Token for its Lockd-Key. Otherwise answer
    with a one-line text/plain body and without calling the app: 400 (a
    header missing, repeated or malformed), 409 Conflict (a stale token),
    503 (the store failed; the request is not fenced).

    WSGI joins a repeated header with ", " (and hands headers over as
    latin-1 strings), so a repeated header reaches the middleware as one
    value that is not a key or a token, and is refused."""

    def __init__(self, app, store):
        self.app, self.store = app, store

    def __call__(self, environ, start_response):
        keys, tokens = (
            [v.encode("latin-1")] if (v := environ.get(name)) is not None else []
            for name in ("HTTP_LOCKD_KEY", "HTTP_LOCKD_TOKEN"))
        parsed = _parse(keys, tokens)
        if isinstance(parsed[0], int):
            return self._refuse(start_response, *parsed)
        try:
            self.store.fence(*parsed)
        except Exception as err:  # the store's failure is the client's 503, never a crash
            return self._refuse(start_response, *_answer(err))
        return self.app(environ, start_response)

    @staticmethod
    def _refuse(start_response, status, body):
        body += b"\n"
        start_response(f"{status} {_REASONS[status]}", [("Content-Type", "text/plain; charset=utf-8"),
                                                       ("Content-Length", str(len(body)))])
        return [body]


class ASGIMiddleware:
    """WSGIMiddleware for ASGI: HTTP requests are fenced the same way, other
    scopes (lifespan, websocket) pass through. A store with an ``afence``
    coroutine (Memory) is awaited; any other store's blocking ``fence`` runs
    in a worker thread."""

    def __init__(self, app, store):
        self.app, self.store = app, store

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        keys, tokens = [], []
        for name, value in scope.get("headers", ()):
            name = name.lower()
            if name == b"lockd-key":
                keys.append(value)
            elif name == b"lockd-token":
                tokens.append(value)
        parsed = _parse(keys, tokens)
        if isinstance(parsed[0], int):
            return await self._refuse(send, *parsed)
        try:
            afence = getattr(self.store, "afence", None)
            if afence is not None:
                await afence(*parsed)
            else:
                await asyncio.to_thread(self.store.fence, *parsed)
        except Exception as err:
            return await self._refuse(send, *_answer(err))
        return await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(send, status, body):
        body += b"\n"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
