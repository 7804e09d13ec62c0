"""Fixtures: lockd built from the tree (or LOCKD_BIN), started on free
loopback ports with its data in a temporary directory, and scripted servers
for the cases a real server cannot produce on demand."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import lockd  # noqa: E402  (after the path above)


@pytest.fixture(scope="session")
def lockd_bin(tmp_path_factory):
    """The lockd binary: LOCKD_BIN, or built from this tree. A missing one
    fails the tests; it never skips them."""
    path = os.environ.get("LOCKD_BIN")
    if path:
        assert os.access(path, os.X_OK), f"LOCKD_BIN={path} is not an executable"
        return path
    path = str(tmp_path_factory.mktemp("bin") / "lockd")
    subprocess.run(["go", "build", "-o", path, "./cmd/lockd"], cwd=ROOT, check=True)
    return path


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_listening(port, proc, log, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"lockd exited with {proc.returncode}:\n{open(log).read()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"lockd did not listen on {port} within {timeout} s")


class Server:
    """One lockd process."""

    def __init__(self, bin_path, workdir, name, args, port):
        self.port = port
        self.addr = f"127.0.0.1:{port}"
        self.log = os.path.join(workdir, f"{name}.log")
        self.proc = subprocess.Popen([bin_path, "serve", *args], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start_single(bin_path, workdir, extra=(), name="single"):
    port, = free_ports(1)
    s = Server(bin_path, workdir, name, ["--listen", f"127.0.0.1:{port}", "--admin", "",
                                          "--data-dir", os.path.join(workdir, name + ".data"),
                                          "--log-level", "warn", *extra], port)
    wait_listening(port, s.proc, s.log)
    return s


@pytest.fixture(scope="module")
def server(lockd_bin, tmp_path_factory):
    s = start_single(lockd_bin, str(tmp_path_factory.mktemp("single")))
    yield s
    s.kill()


_keys = iter(range(10**9))


@pytest.fixture
def key(request):
    """A key of this test's own."""
    return f"py/{request.node.name[:60]}/{next(_keys)}"


def wait_until(cond, timeout=10.0, what="condition"):
    """Waits for cond() to hold, failing the test after timeout."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.01)


# Scripted servers.

_FIXED = {b"H": 49, b"A": 11, b"R": 16, b"K": 18, b"P": 8, b"S": 24, b"X": 16}


def read_frame(conn, buf):
    """One client frame from conn: (op, fixed, text), buffering in buf;
    None at EOF."""
    while True:
        if buf:
            n = _FIXED.get(bytes(buf[:1]))
            assert n is not None, f"unknown op {bytes(buf[:1])!r}"
            end = buf.find(b"\n", 1 + n)
            if end >= 0:
                op, fixed, text = bytes(buf[:1]), bytes(buf[1:1 + n]), bytes(buf[1 + n:end])
                del buf[:end + 1]
                return op, fixed, text
        data = conn.recv(4096)
        if not data:
            return None
        buf += data


def greeting(auth=False, flags=0):
    return b"G\x01" + bytes([flags | (1 if auth else 0)]) + bytes(16) + b"scripted\n"


ABANDON_FLAG = 2  # GREETING flags bit1: the server serves SESSION and ABANDON


def acquired(owner, token, waited_ms=0):
    return b"A" + struct.pack(">QQI", owner, token, waited_ms) + b"\n"


def owner_only(op, owner):
    return op + struct.pack(">Q", owner) + b"\n"


class Scripted:
    """A server on a free loopback port that greets each connection, then
    hands it to script(conn_index, conn, frames) where frames() yields the
    client's frames. Every frame received is also recorded in .frames as
    (conn_index, op, fixed, text)."""

    def __init__(self, script, greet_delay=0.0, flags=0, greet=None):
        self.script, self.greet_delay, self.flags = script, greet_delay, flags
        self.greet = greet or (lambda index, conn: conn.sendall(greeting(flags=flags)))
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.frames = []
        self.conns = []
        self.errors = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                index = len(self.conns)
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(index, conn), daemon=True).start()

    def _serve(self, index, conn):
        try:
            if self.greet_delay:
                time.sleep(self.greet_delay)
            self.greet(index, conn)
            buf = bytearray()

            def frames():
                while True:
                    f = read_frame(conn, buf)
                    if f is None:
                        return
                    with self.lock:
                        self.frames.append((index,) + f)
                    yield f
            self.script(index, conn, frames())
        except OSError:
            pass
        except Exception as e:  # surfaced by close()
            self.errors.append(e)

    def requests(self, op):
        with self.lock:
            return [f for f in self.frames if f[1] == op]

    def close(self):
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
        assert not self.errors, self.errors


def grant_all(token_start=100):
    """A script that grants every ACQUIRE, releases every RELEASE, renews
    every KEEP, answers PING and SESSION with PONG and ABANDON with NOT
    HELD."""
    tokens = iter(range(token_start, 10**9))

    def script(index, conn, frames):
        for op, fixed, text in frames:
            owner = struct.unpack(">Q", fixed[:8])[0]
            if op == b"A":
                conn.sendall(acquired(owner, next(tokens)))
            elif op == b"R":
                conn.sendall(owner_only(b"R", owner))
            elif op == b"K":
                conn.sendall(acquired(owner, struct.unpack(">Q", fixed[8:16])[0]))
            elif op in (b"P", b"S"):
                conn.sendall(owner_only(b"P", owner))
            elif op == b"X":
                conn.sendall(owner_only(b"N", owner))
    return script


def silent(index, conn, frames):
    """A live server stuck on every request: it answers PING and SESSION
    (PONG), and nothing else."""
    for op, fixed, text in frames:
        if op in (b"P", b"S"):
            conn.sendall(owner_only(b"P", struct.unpack(">Q", fixed[:8])[0]))


def mute(index, conn, frames):
    """A server that reads everything and answers nothing, PING included."""
    for _ in frames:
        pass


@pytest.fixture
def scripted():
    made = []

    def make(script, **kw):
        s = Scripted(script, **kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


class AsyncAdapter:
    """An AsyncClient on an event loop of its own thread, called like the
    blocking client, so that one test covers both APIs."""

    def __init__(self, *args, **kwargs):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        try:
            self.client = self.run(lockd.AsyncClient(*args, **kwargs).connect())
        except BaseException:
            self._stop()
            raise

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def stats(self):
        return self.client.stats

    def acquire(self, *args, **kwargs):
        return self.run(self.client.acquire(*args, **kwargs))

    def release(self, ticket):
        return self.run(self.client.release(ticket))

    def close(self):
        try:
            self.run(self.client.close())
        finally:
            self._stop()

    def _stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def client_of(api, *args, **kwargs):
    """A blocking lockd.Client, or an AsyncClient behind AsyncAdapter."""
    return lockd.Client(*args, **kwargs) if api == "blocking" else AsyncAdapter(*args, **kwargs)
