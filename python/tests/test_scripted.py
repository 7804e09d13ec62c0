"""Cases a real server cannot produce on demand — a late answer, a send that
fails part-way, an answer for nobody, a release that keeps getting lost —
played by scripted servers and sockets."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

import pytest

import lockd
from conftest import acquired, grant_all, owner_only, silent, wait_until


def owner_of(fixed):
    return struct.unpack(">Q", fixed[:8])[0]


def test_nothing_is_sent_before_the_checks_pass(scripted):
    srv = scripted(grant_all())
    with lockd.Client(srv.addr) as c:
        for kwargs in [dict(lease=0, min_work_budget=0), dict(wait=256, min_work_budget=0),
                       dict(lease=5, min_work_budget=6), dict(min_work_budget=None)]:
            with pytest.raises((lockd.UnsupportedDuration, lockd.InsufficientLease)):
                c.acquire("k", **kwargs)
        with pytest.raises(lockd.BadKey):
            c.acquire("k\r", min_work_budget=0)
        t = c.acquire("k", lease=2.5, wait=0, min_work_budget=0.5)
        assert t.token == 100
    (_, op, fixed, text), = srv.requests(b"A")
    owner, lease, wait = struct.unpack(">QHB", fixed)
    assert (owner, lease, wait, text) == (1, 3, 0, b"k"), "the first frame sent, rounded up"


def test_wire_wait_is_the_remaining_time_just_before_the_send(scripted):
    slow = scripted(grant_all(), greet_delay=1.3)
    with lockd.Client(slow.addr) as c:
        # The wait session is dialled within the call's deadline: 3 s at
        # entry, ceil(3 - 1.3) = 2 s left at the send.
        t = c.acquire("w", wait=3, min_work_budget=0)
        assert t.token == 100
    (_, _, fixed, _), = slow.requests(b"A")
    assert struct.unpack(">QHB", fixed)[2] == 2


class FlakySocket:
    """A socket whose first request frame gets `passes` bytes out (one send
    returning that count, as a partial send does) before the connection
    fails."""

    def __init__(self, sock, passes):
        self.sock, self.passes, self.state = sock, passes, "fresh"

    def send(self, data):
        if self.state == "fresh" and bytes(data[:1]) in (b"A", b"R"):
            self.state = "failing"
            if self.passes:
                return self.sock.send(bytes(data[:self.passes]))
        if self.state == "failing":
            self.state = "failed"
            raise ConnectionResetError("connection reset")
        return self.sock.send(data)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def flaky_dialer(first_addr, passes):
    def dial(addr, timeout):
        host, port = addr.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout)
        return FlakySocket(sock, passes) if addr == first_addr else sock
    return dial


def test_a_certainly_unsent_immediate_acquire_moves_to_another_connection(scripted):
    a, b = scripted(grant_all(100)), scripted(grant_all(200))
    with lockd.Client([a.addr, b.addr], dialer=flaky_dialer(a.addr, 0)) as c:
        c._rr = -1  # the first pick tries a's session first
        t = c.acquire("k", min_work_budget=0)
    assert t.token == 200, "granted by the second server"
    assert a.requests(b"A") == []
    (_, _, fixed, _), = b.requests(b"A")
    owner, _, wait = struct.unpack(">QHB", fixed)
    assert (owner, wait) == (1, 0), "the same owner, still an immediate attempt"


def test_an_acquire_that_may_have_left_is_never_retransmitted(scripted):
    a, b = scripted(silent), scripted(grant_all(200))
    with lockd.Client([a.addr, b.addr], dialer=flaky_dialer(a.addr, 3)) as c:
        c._rr = -1
        with pytest.raises(lockd.Indeterminate) as e:
            c.acquire("k", min_work_budget=0)
        assert not isinstance(e.value, lockd.WaitElapsed)
    assert b.requests(b"A") == [], "not sent again anywhere"


def test_wait_zero_has_its_own_5s_io_deadline(scripted):
    srv = scripted(silent)
    with lockd.Client(srv.addr) as c:
        t0 = time.monotonic()
        with pytest.raises(lockd.Indeterminate) as e:
            c.acquire("k", min_work_budget=0)
        elapsed = time.monotonic() - t0
    assert not isinstance(e.value, lockd.WaitElapsed)
    assert 5.0 <= elapsed < 6.5


class LateClock:
    """time.monotonic() until `late` is set, then 6 s ahead: the caller
    reaches the gate after its 5 s, as if it had been descheduled."""

    def __init__(self):
        self.late = threading.Event()

    def __call__(self):
        return time.monotonic() + (6 if self.late.is_set() else 0)


class LateSocket:
    """Sets clock.late as soon as a recv brings the ACQUIRED in: the grant
    is correlated in time, and the caller reaches the gate late."""

    def __init__(self, sock, clock):
        self.sock, self.clock = sock, clock

    def recv_into(self, buf):
        n = self.sock.recv_into(buf)
        if bytes(buf[:1]) == b"A":
            self.clock.late.set()
        return n

    def __getattr__(self, name):
        return getattr(self.sock, name)


def test_a_grant_found_after_the_deadline_is_released_on_the_same_session(scripted):
    clock = LateClock()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if op == b"A":
                conn.sendall(acquired(owner, 4242))
            elif op == b"R":
                conn.sendall(owner_only(b"R", owner))

    def dial(addr, timeout):
        host, port = addr.rsplit(":", 1)
        return LateSocket(socket.create_connection((host, int(port)), timeout), clock)

    srv = scripted(script)
    with lockd.Client(srv.addr, dialer=dial, _clock=clock) as c:
        with pytest.raises(lockd.Indeterminate) as e:
            c.acquire("k", min_work_budget=0)
        assert "compensation" in str(e.value)
        wait_until(lambda: c.stats.compensations_done == 1, what="the compensating release")
        assert c.stats.reconnects == 0, "the session stayed open"
    (conn_a, _, _, _), = srv.requests(b"A")
    (conn_r, _, fixed, text), = srv.requests(b"R")
    assert (conn_r, struct.unpack(">QQ", fixed)[1], text) == (conn_a, 4242, b"k")


def test_release_is_retried_and_bounded_by_5s(scripted):
    attempts = []

    def drop_releases(index, conn, frames):
        for op, fixed, text in frames:
            if op == b"R":
                attempts.append(time.monotonic())
                conn.shutdown(socket.SHUT_RDWR)  # lost: no answer
                return

    srv = scripted(drop_releases)
    with lockd.Client(srv.addr) as c:
        t0 = time.monotonic()
        with pytest.raises(lockd.Indeterminate):
            c.release_token("k", 7)
        elapsed = time.monotonic() - t0
    assert 4.9 <= elapsed < 5.6, "5 s absolute, retries included"
    assert len(attempts) >= 2, "a lost release is sent again"
    owners = {owner_of(f[2]) for f in srv.requests(b"R")}
    assert len(owners) == 1, "one call, one owner"


def test_a_lost_release_answered_on_retry_succeeds(scripted):
    first = threading.Event()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            if op == b"R":
                if not first.is_set():
                    first.set()
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                conn.sendall(owner_only(b"R", owner_of(fixed)))

    srv = scripted(script)
    with lockd.Client(srv.addr) as c:
        c.release_token("k", 7)
    assert len(srv.requests(b"R")) == 2


def test_an_answer_for_nobody_closes_the_session(scripted):
    def script(index, conn, frames):
        for op, fixed, text in frames:
            conn.sendall(acquired(owner_of(fixed) + 1000, 5))

    srv = scripted(script)
    with lockd.Client(srv.addr) as c:
        with pytest.raises(lockd.Indeterminate):
            c.acquire("k", min_work_budget=0)
        assert c.stats.protocol_errors == 1


def test_refusals_are_typed(scripted):
    reasons = iter([b"bad_key", b"token_exhausted", b"unavailable", b"bad_lease"])

    def script(index, conn, frames):
        for op, fixed, text in frames:
            conn.sendall(b"E" + fixed[:8] + next(reasons) + b"\n")

    srv = scripted(script)
    with lockd.Client(srv.addr) as c:
        for err in (lockd.BadKey, lockd.TokenExhausted, lockd.Unavailable, lockd.UnsupportedDuration):
            with pytest.raises(err):
                c.acquire("k", min_work_budget=0)


def test_busy_is_a_definite_non_acquisition(scripted):
    def script(index, conn, frames):
        for op, fixed, text in frames:
            conn.sendall(owner_only(b"B", owner_of(fixed)))

    srv = scripted(script)
    with lockd.Client(srv.addr) as c:
        with pytest.raises(lockd.Busy) as e:
            c.acquire("k", min_work_budget=0)
        assert not isinstance(e.value, lockd.Indeterminate)


class JumpClock:
    """time.monotonic(); once armed, the reading after the next one and all
    later ones are `jump` seconds ahead: an answer correlated in time whose
    caller reaches the gate late."""

    def __init__(self):
        self.lock = threading.Lock()
        self.offset, self.pending, self.armed = 0.0, 0.0, False

    def arm(self, jump):
        with self.lock:
            self.pending, self.armed = jump, True

    def __call__(self):
        with self.lock:
            now = time.monotonic() + self.offset
            if self.armed:
                self.armed, self.offset = False, self.offset + self.pending
            return now


def test_async_wire_wait_and_late_grant(scripted):
    """The delivery gate of TestGrantFoundAfterTheDeadlineIsCompensated."""
    clock = JumpClock()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if op == b"A" and text == b"late":
                clock.arm(6)
                conn.sendall(acquired(owner, 77))
            elif op == b"A":
                conn.sendall(acquired(owner, 5))
            elif op == b"R":
                conn.sendall(owner_only(b"R", owner))

    slow = scripted(script, greet_delay=1.3)

    async def main():
        async with lockd.AsyncClient(slow.addr, _clock=clock) as c:
            t = await c.acquire("w", wait=3, min_work_budget=0)
            assert t.token == 5
            with pytest.raises(lockd.Indeterminate):
                await c.acquire("late", min_work_budget=0)
            for _ in range(500):
                if c.stats.compensations_done:
                    break
                await asyncio.sleep(0.01)
            assert c.stats.compensations_done == 1
    asyncio.run(asyncio.wait_for(main(), 30))
    waits = [struct.unpack(">QHB", f[2])[2] for f in slow.requests(b"A")]
    assert waits == [2, 0]
    (_, _, fixed, text), = slow.requests(b"R")
    assert (struct.unpack(">QQ", fixed)[1], text) == (77, b"late")


def test_owners_are_distinct_and_non_zero_across_threads(scripted):
    srv = scripted(grant_all())
    with lockd.Client(srv.addr) as c:
        def work(i):
            for n in range(50):
                c.release(c.acquire(f"k{i}/{n}", min_work_budget=0))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
    owners = [owner_of(f[2]) for f in srv.frames]
    assert len(owners) == 800 and 0 not in owners
    assert len(set(owners)) == 800, "one counter for the whole client"


class SteppingClock:
    """time.monotonic(), plus a second more at each reading once `on`."""

    def __init__(self):
        self.on, self.offset = False, 0.0

    def __call__(self):
        if self.on:
            self.offset += 1
        return time.monotonic() + self.offset


def test_an_unanswered_renewal_leaves_the_validity_as_it_was(scripted):
    def script(index, conn, frames):
        for op, fixed, text in frames:
            if op == b"A":
                conn.sendall(acquired(owner_of(fixed), 9))
            elif op == b"K":
                conn.shutdown(socket.SHUT_RDWR)  # lost: no answer
                return

    clock = SteppingClock()
    srv = scripted(script)
    # A silence timeout the stepping clock cannot reach: the session is
    # ended by the server, not by the silence rule.
    with lockd.Client(srv.addr, silence_timeout=3600, _clock=clock) as c:
        t = c.acquire("k", lease=30, min_work_budget=0)
        before = t.valid_until
        clock.on = True  # the renewal's 5 s pass in a few readings
        with pytest.raises(lockd.Indeterminate):
            t.renew(60)
        assert t.valid_until == before and t.lease == 30, "never assumed extended"
    wait_until(lambda: srv.requests(b"K"), what="the KEEP reaching the server")
    leases = {struct.unpack(">QQH", f[2])[2] for f in srv.requests(b"K")}
    assert leases == {60} and len(srv.requests(b"K")) >= 1


def test_async_wait_zero_has_its_own_5s_io_deadline(scripted):
    srv = scripted(silent)

    async def main():
        async with lockd.AsyncClient(srv.addr) as c:
            t0 = time.monotonic()
            with pytest.raises(lockd.Indeterminate) as e:
                await c.acquire("k", min_work_budget=0)
            assert not isinstance(e.value, lockd.WaitElapsed)
            return time.monotonic() - t0
    elapsed = asyncio.run(asyncio.wait_for(main(), 30))
    assert 5.0 <= elapsed < 6.5


def test_a_session_the_server_closed_while_idle_is_not_used(scripted):
    closed = threading.Event()

    def close_first(index, conn, frames):
        if index == 0:
            conn.shutdown(socket.SHUT_RDWR)
            closed.set()
            return
        grant_all(100)(index, conn, frames)

    a, b = scripted(close_first), scripted(grant_all(200))
    with lockd.Client([a.addr, b.addr]) as c:
        assert closed.wait(10)
        c._rr = -1  # the first pick tries a's session first
        t = c.acquire("k", min_work_budget=0)  # not Indeterminate: certainly unsent
    assert t.token == 200
    assert a.requests(b"A") == []


def test_the_compensation_queue_is_bounded(scripted):
    answer_releases = threading.Event()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            if op == b"A":
                conn.sendall(acquired(owner_of(fixed), 7))
            elif op == b"R":
                threading.Thread(target=lambda o=owner_of(fixed): (
                    answer_releases.wait(10), conn.sendall(owner_only(b"R", o)))).start()

    srv = scripted(script)
    with lockd.Client(srv.addr, compensation_queue=1) as c:
        errors_seen = []
        for i in range(6):  # a 1 s lease never leaves a 1 s budget
            with pytest.raises(lockd.Indeterminate) as e:
                c.acquire(f"k{i}", lease=1, min_work_budget=1)
            errors_seen.append(str(e.value))
        # Two workers hold at most two releases, the queue one more.
        assert c.stats.compensations_dropped >= 3
        assert sum("left to its lease" in m for m in errors_seen) == c.stats.compensations_dropped
        answer_releases.set()


def test_async_owners_fail_closed_before_wrapping(scripted):
    srv = scripted(grant_all())

    async def main():
        async with lockd.AsyncClient(srv.addr, _first_owner=2**64 - 2) as c:
            t = await c.acquire("k", min_work_budget=0)
            with pytest.raises(lockd.OwnerExhausted):
                await c.release(t)
            with pytest.raises(lockd.OwnerExhausted):
                await c.acquire("k2", min_work_budget=0)
    asyncio.run(asyncio.wait_for(main(), 30))
    (_, _, fixed, _), = srv.requests(b"A")
    assert owner_of(fixed) == 2**64 - 1
