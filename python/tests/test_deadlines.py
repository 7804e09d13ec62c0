"""Every time bound of docs/protocol.md §6 in both APIs, against scripted
servers: a dial that stalls, a deadline that cuts a dial, an answer that
comes after the deadline, an answer that races the caller giving up, the
bound of the compensation queue, and GREETING flags the client does not
know."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time

import pytest

import lockd
from lockd import _core as core
from conftest import ABANDON_FLAG, greeting, grant_all, owner_only, acquired

# How late a call may end after its deadline.
SLACK = 0.05


def owner_of(fixed):
    return struct.unpack(">Q", fixed[:8])[0]


def trickle_after_first(index, conn):
    """Greets the first connection at once and every later one a byte every
    0.3 s: a greeting of 27 bytes takes 8 s."""
    data = greeting()
    if index == 0:
        conn.sendall(data)
        return
    for i in range(len(data)):
        conn.sendall(data[i:i + 1])
        time.sleep(0.3)


def timed(fn):
    """(elapsed seconds, the exception fn raised or None)."""
    t0 = time.monotonic()
    try:
        fn()
        err = None
    except lockd.LockdError as e:
        err = e
    return time.monotonic() - t0, err


def run_concurrently(calls):
    """Runs each (name, fn) on a thread of its own; {name: (elapsed, err)}."""
    results = {}
    threads = [threading.Thread(target=lambda n=n, f=f: results.__setitem__(n, timed(f))) for n, f in calls]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return results


def check_bounds(results, bounds):
    for name, bound in bounds.items():
        elapsed, err = results[name]
        assert err is not None, f"{name} succeeded against a server that never finished greeting"
        assert bound - 0.01 <= elapsed <= bound + SLACK, f"{name}: {elapsed:.3f} s for a {bound} s bound ({err})"


BOUNDS = {"acquire wait 1": 1.0, "acquire wait 0": 5.0, "release": 5.0, "renew": 5.0}


def test_a_stalled_dial_ends_every_call_at_its_deadline(scripted):
    """Like TestDeadlineWaitingForASessionIsTimeoutNotSent: the blocking
    client bounds the dial of a wait session and the redial of a shared
    session by the caller's deadline, not step by step; a deadline that
    cuts the dial is Timeout, certainly not sent."""
    srv = scripted(grant_all(), greet=trickle_after_first)
    with lockd.Client(srv.addr) as c:
        held = c.acquire("held", min_work_budget=0)
        srv.conns[0].shutdown(socket.SHUT_RDWR)  # every later session trickles
        results = run_concurrently([
            ("acquire wait 1", lambda: c.acquire("k1", wait=1, min_work_budget=0)),
            ("acquire wait 0", lambda: c.acquire("k0", min_work_budget=0)),
            ("release", lambda: c.release_token("r", 7)),
            ("renew", held.renew),
        ])
    check_bounds(results, BOUNDS)
    for name in ("acquire wait 1", "acquire wait 0"):
        err = results[name][1]
        assert isinstance(err, lockd.Timeout) and not isinstance(err, lockd.Indeterminate), (name, err)
    assert srv.requests(b"A") == [srv.requests(b"A")[0]], "nothing sent after the first acquire"


def test_async_a_stalled_dial_ends_every_call_at_its_deadline(scripted):
    """As test_a_stalled_dial_ends_every_call_at_its_deadline, asyncio."""
    srv = scripted(grant_all(), greet=trickle_after_first)

    async def call(name, coro, results):
        t0 = time.monotonic()
        try:
            await coro
            results[name] = (time.monotonic() - t0, None)
        except lockd.LockdError as e:
            results[name] = (time.monotonic() - t0, e)

    async def main():
        async with lockd.AsyncClient(srv.addr) as c:
            held = await c.acquire("held", min_work_budget=0)
            srv.conns[0].shutdown(socket.SHUT_RDWR)
            await asyncio.sleep(0.05)
            results = {}
            await asyncio.gather(
                call("acquire wait 1", c.acquire("k1", wait=1, min_work_budget=0), results),
                call("acquire wait 0", c.acquire("k0", min_work_budget=0), results),
                call("release", c.release_token("r", 7), results),
                call("renew", held.renew(), results))
            return results
    results = asyncio.run(asyncio.wait_for(main(), 30))
    check_bounds(results, BOUNDS)
    for name in ("acquire wait 1", "acquire wait 0"):
        err = results[name][1]
        assert isinstance(err, lockd.Timeout) and not isinstance(err, lockd.Indeterminate), (name, err)


def late_timeout(delay):
    """A script that answers each ACQUIRE with TIMEOUT `delay` seconds after
    its wire wait ran out (from receipt), and PING with PONG."""
    def script(index, conn, frames):
        send = threading.Lock()

        def answer(owner):
            with send, contextlib.suppress(OSError):  # the client may have closed it
                conn.sendall(owner_only(b"T", owner))
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if op == b"A":
                wait = struct.unpack(">QHB", fixed)[2]
                threading.Timer(wait + delay, answer, (owner,)).start()
            elif op in (b"P", b"S"):
                with send:
                    conn.sendall(owner_only(b"P", owner))
    return script


def test_a_timeout_after_the_deadline_is_wait_elapsed(scripted):
    """Like TestDeadlineAfterSendIsIndeterminateAndClosesThatSession: a T
    that arrives 2 ms after the deadline is not taken; the deadline acts
    on time and the acquire ends WaitElapsed, its session closed."""
    srv = scripted(late_timeout(0.002))
    with lockd.Client(srv.addr) as c:
        with pytest.raises(lockd.WaitElapsed):
            c.acquire("k", wait=1, min_work_budget=0)
        assert c.stats.abandoned_sessions == 1


def test_async_a_timeout_after_the_deadline_is_wait_elapsed(scripted):
    """As test_a_timeout_after_the_deadline_is_wait_elapsed, asyncio, where
    data that arrived runs before a timer that fell due meanwhile."""
    srv = scripted(late_timeout(0.002))

    async def main():
        async with lockd.AsyncClient(srv.addr) as c:
            for key in ("a", "b", "c"):
                with pytest.raises(lockd.WaitElapsed):
                    await c.acquire(key, wait=1, min_work_budget=0)
            assert c.stats.abandoned_sessions == 3
    asyncio.run(asyncio.wait_for(main(), 30))


class HookLock:
    """A lock that runs hook() once, right after the first release that
    follows arming: what another thread could do between two holds."""

    def __init__(self):
        self.lock, self.hook = threading.Lock(), None

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()
        hook, self.hook = self.hook, None
        if hook:
            hook()

    def acquire(self, *a):
        return self.lock.acquire(*a)

    def release(self):
        self.lock.release()


def test_an_answer_while_the_caller_gives_up_is_no_protocol_error(scripted):
    """Like TestGiveUpClosesSessionBeforeALateAnswer: the request leaves the
    table and the session closes under one hold of its lock, so an answer
    read in between finds the session closed, not a request missing."""
    answered = threading.Event()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            if op == b"A":
                conn.sendall(owner_only(b"T", owner_of(fixed)))
                answered.set()

    srv = scripted(script)
    with lockd.Client(srv.addr) as c:
        s = c._slots[0].session
        req = core.Request(core.ACQUIRE, c._owners.next(), b"k", time.monotonic() + 5, lease=30)
        req.waiter = threading.Lock()
        req.waiter.acquire()
        s.lock = HookLock()
        s.reading = True  # the answer stays unread until the hook reads it
        assert s.enqueue(req, 10) == 0
        assert answered.wait(5)
        time.sleep(0.05)  # the T is in the socket's buffer
        seen = []

        def read_the_answer():
            try:
                s._read_once(time.monotonic())
            except lockd.Protocol as e:
                seen.append(e)
            except OSError:
                pass  # the session's socket is already closed
        s.lock.hook = read_the_answer
        assert s.abandon(req) == core.LOST
        assert seen == [], "the answer was taken for one without a request"
        assert s.closed


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_compensation_queue_size_follows_the_go_rule(scripted, api):
    """Like TestDialRefusesAnUnusableConfig and
    TestCompensationQueueFullLeavesTheLockToItsLease: a negative size is
    refused, 0 is the default 256, never unbounded. The silence and dial
    timeouts follow the same rule, and a silence timeout below 0.1 s is
    refused, as TestDialRefusesAnUnusableConfig checks in Go."""
    answer_releases = threading.Event()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            if op == b"A":
                conn.sendall(acquired(owner_of(fixed), 7))
            elif op == b"R":
                threading.Thread(target=lambda o=owner_of(fixed): (
                    answer_releases.wait(10), conn.sendall(owner_only(b"R", o)))).start()

    srv = scripted(script)
    n = 300
    if api == "blocking":
        for bad in (dict(compensation_queue=-1), dict(silence_timeout=-1), dict(silence_timeout=0.05), dict(dial_timeout=-0.5)):
            with pytest.raises(lockd.Config):
                lockd.Client(srv.addr, **bad)
        with lockd.Client(srv.addr, compensation_queue=0) as c:
            for i in range(n):  # a 1 s lease never leaves a 1 s budget
                with pytest.raises(lockd.Indeterminate):
                    c.acquire(f"k{i}", lease=1, min_work_budget=1)
            stats = vars(c.stats).copy()
            answer_releases.set()
    else:
        async def main():
            for bad in (dict(compensation_queue=-1), dict(silence_timeout=-1), dict(silence_timeout=0.05), dict(dial_timeout=-0.5)):
                with pytest.raises(lockd.Config):
                    lockd.AsyncClient(srv.addr, **bad)
            async with lockd.AsyncClient(srv.addr, compensation_queue=0) as c:
                for i in range(n):
                    with pytest.raises(lockd.Indeterminate):
                        await c.acquire(f"k{i}", lease=1, min_work_budget=1)
                stats = vars(c.stats).copy()
                answer_releases.set()
                return stats
        stats = asyncio.run(asyncio.wait_for(main(), 30))
    # The workers hold one release each (2), the queue 256 more.
    assert 256 <= stats["compensations_queued"] <= 258
    assert stats["compensations_dropped"] == n - stats["compensations_queued"]


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_unknown_greeting_flags_are_ignored(scripted, api):
    """Like the Go client: a GREETING with bit1 (§6a served) and a bit this
    client does not know is accepted."""
    srv = scripted(grant_all(), flags=ABANDON_FLAG | 8)
    if api == "blocking":
        with lockd.Client(srv.addr) as c:
            assert c.acquire("k", min_work_budget=0).token == 100
    else:
        async def main():
            async with lockd.AsyncClient(srv.addr) as c:
                return (await c.acquire("k", min_work_budget=0)).token
        assert asyncio.run(asyncio.wait_for(main(), 30)) == 100


class BumpClock:
    """time.monotonic() plus an offset a test moves."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self):
        return time.monotonic() + self.offset


class StallingSocket:
    """Lets the first RELEASE frame of the client through and calls
    on_first(); every later send of a RELEASE stalls (SO_SNDTIMEO ran out),
    and the first stall moves the clock 3 s on."""

    def __init__(self, sock, state):
        self.sock, self.state = sock, state

    def send(self, data):
        if bytes(data[:1]) != b"R":
            return self.sock.send(data)
        st = self.state
        if not st["first_done"]:
            st["first_done"] = True
            n = self.sock.send(data)
            st["on_first"]()
            return n
        if not st["stalled_at"]:
            st["clock"].offset += 3
            st["stalled_at"] = time.monotonic()
        time.sleep(0.05)
        raise TimeoutError("the send buffer stays full")

    def __getattr__(self, name):
        return getattr(self.sock, name)


def test_the_writer_of_a_shared_session_is_bounded_by_its_own_deadline(scripted):
    """Like TestDeadlineAfterSendIsIndeterminateAndClosesThatSession: the
    caller that writes a shared session goes on to write frames queued by
    others; when one of those later sends stalls, the writer's own
    request, sent in an earlier batch, is checked against its deadline
    too, so its call ends on time."""
    clock = BumpClock()
    srv = scripted(lambda index, conn, frames: [None for _ in frames])  # reads, never answers
    c = None
    state = {"first_done": False, "stalled_at": 0.0, "clock": clock, "on_first": None}
    other = {}

    def on_first():
        # A's frame is out; 3 s later (on the client's clock) B queues its
        # own release behind the writer, with a later deadline than A's.
        clock.offset += 3
        th = threading.Thread(target=lambda: other.__setitem__("b", timed(lambda: c.release_token("b", 8))))
        th.start()
        other["thread"] = th
        deadline = time.monotonic() + 5
        while not c._slots[0].session.queue and time.monotonic() < deadline:
            time.sleep(0.001)
    state["on_first"] = on_first

    def dial(addr, timeout):
        host, port = addr.rsplit(":", 1)
        return StallingSocket(socket.create_connection((host, int(port)), timeout), state)

    with lockd.Client(srv.addr, dialer=dial, silence_timeout=3600, _clock=clock) as c:
        with pytest.raises(lockd.Indeterminate):
            c.release_token("a", 7)
        ended = time.monotonic()
        other["thread"].join(10)
    assert state["stalled_at"], "the second batch stalled"
    assert ended - state["stalled_at"] < 0.3, f"A ended {ended - state['stalled_at']:.3f} s into the stall"
    assert isinstance(other["b"][1], lockd.Indeterminate)
