"""lockd.fence: the SQL fence on sqlite3 and on a real PostgreSQL through
psycopg 3, the Memory store, and the WSGI and ASGI middlewares.

PostgreSQL is Debian's postgresql, started here in a temporary data
directory on a free port of 127.0.0.1 (as the postgres user when the tests
run as root). Where it or psycopg is missing the PostgreSQL tests fail
when CI is set, and are skipped, saying why, elsewhere."""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

import pytest

# The python/ directory, for lockd.fence, whichever conftest runs beside.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lockd import fence  # noqa: E402


def _missing(what):
    msg = f"{what} is not installed"
    if os.environ.get("CI"):
        pytest.fail(msg + " — CI is set, so this test fails instead of skipping")
    pytest.skip(msg)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    """The conninfo of a throwaway PostgreSQL."""
    try:
        import psycopg
    except ImportError:
        _missing("psycopg 3 (apt-get install python3-psycopg)")
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]), reverse=True)
    if not found:
        _missing("PostgreSQL (apt-get install postgresql)")
    bindir = os.path.dirname(found[0])
    tmp = tempfile.mkdtemp(prefix="lockd-pgtest-")
    as_user = {}
    if os.geteuid() == 0:  # PostgreSQL refuses root
        pw = pwd.getpwnam("postgres")
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
        as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    data = os.path.join(tmp, "data")
    subprocess.run([os.path.join(bindir, "initdb"), "--no-sync", "--auth=trust", "--username=postgres",
                    "--encoding=UTF8", "--locale=C", "-D", data],
                   check=True, capture_output=True, **as_user)
    port = _free_port()
    log = open(os.path.join(tmp, "postgres.log"), "w")
    proc = subprocess.Popen([os.path.join(bindir, "postgres"), "-D", data, "-h", "127.0.0.1", "-p", str(port),
                             "-k", tmp, "-c", "fsync=off", "-c", "synchronous_commit=off"],
                            stdout=log, stderr=log, **as_user)
    conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(conninfo, connect_timeout=1).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("PostgreSQL did not start:\n" + open(log.name).read()[-3000:])
                time.sleep(0.05)
        yield conninfo
    finally:
        proc.send_signal(signal.SIGINT)  # fast shutdown
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


class Database:
    """A database of a dialect with the fences table and account(id,
    balance, writer)."""

    def __init__(self, dialect, connect):
        self.connect, self.sql = connect, fence.SQL(dialect, connect)
        self.p = "%s" if dialect == "postgres" else "?"
        conn = connect()
        self.sql.init(conn)
        self.sql.init(conn)  # twice: the table exists, and that is fine
        cur = conn.cursor()
        cur.execute("DROP TABLE IF EXISTS account")
        cur.execute("CREATE TABLE account (id integer PRIMARY KEY, balance integer NOT NULL, writer bigint NOT NULL)")
        cur.execute("INSERT INTO account VALUES (1, 0, 0)")
        cur.execute("DELETE FROM lockd_fences")
        conn.commit()
        conn.close()

    def deposit(self, key, token):
        """One deposit to account 1 by the holder of token, fenced on key."""
        conn = self.connect()
        try:
            cur = conn.cursor()
            self.sql.check(cur, key, token)
            cur.execute(f"UPDATE account SET balance = balance + 1, writer = {self.p} WHERE id = 1", (token,))
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def query(self, q, args=()):
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(q.replace("?", self.p), args)
            return cur.fetchone()
        finally:
            conn.close()

    def account(self):
        return tuple(self.query("SELECT balance, writer FROM account WHERE id = 1"))

    def mark(self, key):
        row = self.query("SELECT token FROM lockd_fences WHERE key = ?", (key,))
        return row[0] if row else None


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    if request.param == "sqlite":
        path = str(tmp_path / "fence.db")
        return Database("sqlite", lambda: sqlite3.connect(path, timeout=5))
    import psycopg
    conninfo = request.getfixturevalue("postgres")
    return Database("postgres", lambda: psycopg.connect(conninfo))


def test_tokens_in_order_and_equal_ones_pass(db):
    for token in (3, 3, 7, 7, 8):
        db.deposit("order", token)
    assert db.account() == (5, 8)
    assert db.mark("order") == 8


def test_a_stale_token_is_refused_with_the_mark_and_writes_nothing(db):
    db.deposit("order", 8)
    with pytest.raises(fence.StaleToken) as e:
        db.deposit("order", 5)
    assert (e.value.key, e.value.token, e.value.mark) == ("order", 5, 8)
    assert "token 5 is stale, a holder with token 8 came after it" in str(e.value)
    assert db.account() == (1, 8)


def test_keys_are_fenced_apart(db):
    db.deposit("a", 9)
    db.deposit("b", 1)
    assert (db.mark("a"), db.mark("b")) == (9, 1)


def test_a_rolled_back_check_leaves_the_mark(db):
    db.deposit("order", 8)
    conn = db.connect()
    db.sql.check(conn.cursor(), "order", 100)
    conn.rollback()
    conn.close()
    assert db.mark("order") == 8
    db.deposit("order", 9)


def test_fence_commits_on_its_own(db):
    db.sql.fence("order", 10)
    with pytest.raises(fence.StaleToken):
        db.deposit("order", 9)


@pytest.mark.parametrize("key,token", [
    ("", 1), ("a b", 1), ("a\r", 1), ("k" * 129, 1), ("\ud800", 1), (b"k", 1),
    ("k", 0), ("k", 2**63), ("k", -1), ("k", True), ("k", "5")])
def test_bad_input_is_refused_before_the_database(db, key, token):
    with pytest.raises(fence.BadFence):
        db.sql.fence(key, token)
    assert db.mark("k") is None


def test_concurrent_holders_the_newest_commits_and_writes_last(db):
    results = {}

    def holder(token):
        try:
            db.deposit("race", token)
            results[token] = None
        except fence.StaleToken as e:
            results[token] = e
    threads = [threading.Thread(target=holder, args=(100 + i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 6
    assert results[105] is None
    for token, err in results.items():
        assert err is None or err.mark > token
    assert db.account()[1] == 105


def test_sql_rejects_an_unknown_dialect():
    with pytest.raises(ValueError):
        fence.SQL("oracle")


def test_memory():
    m = fence.Memory()
    m.fence("k", 2)
    m.fence("k", 2)
    with pytest.raises(fence.StaleToken) as e:
        m.fence("k", 1)
    assert e.value.mark == 2
    m.fence("j", 1)
    with pytest.raises(fence.BadFence):
        m.fence("k", 0)


class Ticket:
    """What set_ticket reads from a lockd Ticket."""
    key, token = "invoice/42", 18446744073709551615


def test_set_ticket():
    headers = {}
    fence.set_ticket(headers, Ticket())
    assert headers == {"Lockd-Key": "invoice/42", "Lockd-Token": "18446744073709551615"}


# (name, headers, status, part of the body); in order, on one store.
HTTP_CASES = [
    ("no headers", [], 400, b"Lockd-Key"),
    ("no token", [("Lockd-Key", "k")], 400, b"Lockd-Token"),
    ("token not a number", [("Lockd-Key", "k"), ("Lockd-Token", "5x")], 400, b"decimal"),
    ("token negative", [("Lockd-Key", "k"), ("Lockd-Token", "-5")], 400, b"decimal"),
    ("token 0", [("Lockd-Key", "k"), ("Lockd-Token", "0")], 400, b"bad token"),
    ("token too large", [("Lockd-Key", "k"), ("Lockd-Token", str(2**64))], 400, b"bad token"),
    ("key with a space", [("Lockd-Key", "a b"), ("Lockd-Token", "5")], 400, b"bad key"),
    ("first token", [("Lockd-Key", "k"), ("Lockd-Token", "5")], 204, b""),
    ("the same holder again", [("Lockd-Key", "k"), ("Lockd-Token", "5")], 204, b""),
    ("an older holder", [("Lockd-Key", "k"), ("Lockd-Token", "4")], 409, b"stale token"),
    ("a UTF-8 key", [("Lockd-Key", "ключ"), ("Lockd-Token", "1")], 204, b""),
    ("a newer holder", [("Lockd-Key", "k"), ("Lockd-Token", "6")], 204, b""),
    ("the holder before it", [("Lockd-Key", "k"), ("Lockd-Token", "5")], 409, b"stale token"),
]


class Failing:
    def fence(self, key, token):
        raise ConnectionError("connection refused")


def wsgi_call(app, headers):
    """Call a WSGI app with headers as a server would pass them (latin-1
    strings of the raw bytes); return (status, body, app called)."""
    environ = {"REQUEST_METHOD": "PUT", "PATH_INFO": "/invoice/42"}
    for name, value in headers:
        environ["HTTP_" + name.upper().replace("-", "_")] = value.encode().decode("latin-1")
    got = {}

    def start_response(status, hdrs):
        got["status"] = int(status.split()[0])
    body = b"".join(app(environ, start_response))
    return got["status"], body


def test_wsgi_middleware():
    served = []

    def app(environ, start_response):
        served.append(environ["HTTP_LOCKD_TOKEN"])
        start_response("204 No Content", [])
        return [b""]
    mw = fence.WSGIMiddleware(app, fence.Memory())
    for name, headers, status, body in HTTP_CASES:
        before = len(served)
        got_status, got_body = wsgi_call(mw, headers)
        assert (got_status, body in got_body) == (status, True), name
        assert (len(served) > before) == (status == 204), name
    status, body = wsgi_call(fence.WSGIMiddleware(app, Failing()), [("Lockd-Key", "k"), ("Lockd-Token", "9")])
    assert status == 503 and b"refused" not in body


def asgi_call(app, headers, scope_type="http"):
    scope = {"type": scope_type, "method": "PUT", "path": "/invoice/42",
             "headers": [(n.lower().encode(), v.encode()) for n, v in headers]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


def test_asgi_middleware():
    served = []

    async def app(scope, receive, send):
        served.append(scope["type"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    mw = fence.ASGIMiddleware(app, fence.Memory())
    for name, headers, status, body in HTTP_CASES:
        before = len(served)
        got_status, got_body = asgi_call(mw, headers)
        assert (got_status, body in got_body) == (status, True), name
        assert (len(served) > before) == (status == 204), name
    status, body = asgi_call(fence.ASGIMiddleware(app, Failing()), [("Lockd-Key", "k"), ("Lockd-Token", "9")])
    assert status == 503 and b"refused" not in body
    # A repeated header is refused, and other scopes pass through unfenced.
    assert asgi_call(mw, [("Lockd-Key", "k"), ("Lockd-Token", "7"), ("Lockd-Token", "8")])[0] == 400
    assert asgi_call(mw, [], scope_type="websocket")[0] == 204


def test_asgi_middleware_on_sql(tmp_path):
    """A store without afence (SQL) runs in a worker thread."""
    path = str(tmp_path / "fence.db")
    store = fence.SQL("sqlite", lambda: sqlite3.connect(path, timeout=5))
    conn = sqlite3.connect(path)
    store.init(conn)
    conn.close()

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    mw = fence.ASGIMiddleware(app, store)
    assert asgi_call(mw, [("Lockd-Key", "k"), ("Lockd-Token", "3")])[0] == 204
    assert asgi_call(mw, [("Lockd-Key", "k"), ("Lockd-Token", "2")])[0] == 409
