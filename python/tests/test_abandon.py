"""docs/protocol.md §6a in both APIs, against scripted servers: SESSION on
every connection of a server that serves it, an ABANDON for every acquire
that ended Indeterminate with its session closed (and for no other), the
compensation rules it goes under, and the silence timeout with PING."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time

import pytest

import lockd
from conftest import ABANDON_FLAG, acquired, client_of, grant_all, greeting, owner_only

APIS = ["blocking", "asyncio"]


def owner_of(fixed):
    return struct.unpack(">Q", fixed[:8])[0]


def send_later(conn, delay, data):
    """Sends data after delay, unless the client has closed the
    connection meanwhile."""
    def send():
        with contextlib.suppress(OSError):
            conn.sendall(data)
    threading.Timer(delay, send).start()


def serving(on_acquire, x_answer=b"R"):
    """A §6a script: SESSION and PING answered PONG, RELEASE answered
    RELEASED, ABANDON answered x_answer (None: never), and each ACQUIRE
    handed to on_acquire(index, conn, owner, fixed), which returns False
    to stop serving the connection."""
    def script(index, conn, frames):
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if op in (b"S", b"P"):
                conn.sendall(owner_only(b"P", owner))
            elif op == b"R":
                conn.sendall(owner_only(b"R", owner))
            elif op == b"X" and x_answer is not None:
                conn.sendall(owner_only(x_answer, owner))
            elif op == b"A" and on_acquire(index, conn, owner, fixed) is False:
                return
    return script


def cut_the_first(index, conn, owner, fixed):
    """Cuts the connection that carries the first acquire: its answer
    may or may not have been made. Later acquires are granted."""
    if index == 0:
        conn.shutdown(socket.SHUT_RDWR)
        return False
    conn.sendall(acquired(owner, 500))


def frames_on(srv, index):
    with srv.lock:
        return [(op, fixed, text) for i, op, fixed, text in srv.frames if i == index]


@pytest.mark.parametrize("api", APIS)
def test_session_is_declared_on_every_connection_before_any_acquire(scripted, api):
    """Like TestSessionIsSentOncePerConnectionWhenTheGreetingOffersAbandon."""
    srv = scripted(grant_all(), flags=ABANDON_FLAG)
    with client_of(api, srv.addr) as c, client_of(api, srv.addr) as other:
        c.acquire("k", min_work_budget=0)
        c.acquire("w", wait=2, min_work_budget=0)  # on a wait session of its own
        other.acquire("o", min_work_budget=0)
    ids = {}
    for index in range(len(srv.conns)):
        ops = frames_on(srv, index)
        assert ops and ops[0][0] == b"S", f"connection {index} starts with SESSION"
        assert [op for op, _, _ in ops].count(b"S") == 1
        _, fixed, text = ops[0]
        assert len(fixed) == 24 and text == b""
        ids[index] = fixed[8:]
    acquires = {i for i, op, _, _ in srv.frames if op == b"A"}
    assert len(acquires) == 3, "the wait acquire went on a connection of its own"
    assert len(set(ids.values())) == 2, "one client_id per client, the same on all its connections"
    assert all(len(v) == 16 for v in ids.values())


@pytest.mark.parametrize("api", APIS)
def test_no_session_nor_abandon_where_the_server_does_not_serve_them(scripted, api):
    """Like TestNoSessionOrAbandonWithoutTheGreetingBit."""
    srv = scripted(serving(cut_the_first))
    with client_of(api, srv.addr) as c:
        with pytest.raises(lockd.Indeterminate):
            c.acquire("k", min_work_budget=0)
        c.acquire("k2", min_work_budget=0)  # a later session is up: an X would have gone first
        stats = vars(c.stats).copy()
    assert srv.requests(b"S") == [] and srv.requests(b"X") == []
    assert stats["abandons_sent"] == stats["abandons_given_up"] == 0


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("answer,counter", [(b"R", "abandons_released"), (b"N", "abandons_not_held")])
def test_an_acquire_cut_after_sending_is_abandoned_on_another_connection(scripted, api, answer, counter):
    """Like TestAcquireCutAfterSendingIsAbandonedOnAnotherConnection and
    TestAbandonAnsweredNotHeldIsCounted; the caller's result stays
    Indeterminate."""
    srv = scripted(serving(cut_the_first, x_answer=answer), flags=ABANDON_FLAG)
    with client_of(api, srv.addr) as c:
        with pytest.raises(lockd.Indeterminate) as e:
            c.acquire("k", min_work_budget=0)
        assert not isinstance(e.value, lockd.WaitElapsed)
        assert "ABANDON" in str(e.value)
        deadline = time.monotonic() + 10
        while getattr(c.stats, counter) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = vars(c.stats).copy()
    assert stats["abandons_sent"] == 1 and stats[counter] == 1 and stats["abandons_given_up"] == 0
    (a_conn, _, a_fixed, _), = srv.requests(b"A")
    (x_conn, _, x_fixed, x_text), = srv.requests(b"X")
    assert x_conn != a_conn, "on another connection"
    x_owner, target = struct.unpack(">QQ", x_fixed)
    assert (target, x_text) == (owner_of(a_fixed), b"k")
    assert x_owner not in (0, target)
    assert frames_on(srv, x_conn)[0][0] == b"S", "the connection declared its SESSION first"


@pytest.mark.parametrize("api", APIS)
def test_definitive_and_unsent_acquires_are_never_abandoned(scripted, api):
    """Like TestNoAbandonForAnUnsentAcquireOrAnAnsweredOne."""
    def answers(index, conn, owner, fixed):
        conn.sendall(owner_only(b"T" if index == 0 else b"B", owner))

    def trickle_wait_sessions(index, conn):
        data = greeting(flags=ABANDON_FLAG)
        if index < 1:
            conn.sendall(data)
            return
        for i in range(len(data)):
            conn.sendall(data[i:i + 1])
            time.sleep(0.3)

    srv = scripted(serving(answers), greet=trickle_wait_sessions)
    with client_of(api, srv.addr) as c:
        with pytest.raises(lockd.Timeout) as e:
            c.acquire("t", min_work_budget=0)  # answered T
        assert not isinstance(e.value, lockd.Indeterminate)
        with pytest.raises(lockd.Timeout) as e:
            c.acquire("w", wait=1, min_work_budget=0)  # its session never got ready
        assert not isinstance(e.value, lockd.Indeterminate)
        stats = vars(c.stats).copy()
    assert srv.requests(b"X") == []
    assert stats["abandons_sent"] == stats["abandons_given_up"] == 0


class BumpClock:
    """time.monotonic() plus an offset the server's script can move."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self):
        return time.monotonic() + self.offset


@pytest.mark.parametrize("api", APIS)
def test_an_abandon_without_answer_is_given_up_after_its_5s(scripted, api):
    """Like TestAbandonHasFiveSecondsFromEnqueueRetriesIncluded."""
    clock = BumpClock()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if op in (b"S", b"P"):
                conn.sendall(owner_only(b"P", owner))
            elif op == b"A":
                conn.shutdown(socket.SHUT_RDWR)
                return
            elif op == b"X":
                clock.offset += 6  # the ABANDON's 5 s from enqueue are spent

    srv = scripted(script, flags=ABANDON_FLAG)
    with client_of(api, srv.addr, _clock=clock) as c:
        with pytest.raises(lockd.Indeterminate):
            c.acquire("k", min_work_budget=0)
        deadline = time.monotonic() + 10
        while c.stats.abandons_given_up == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = vars(c.stats).copy()
    assert stats["abandons_given_up"] == 1 and stats["abandons_sent"] >= 1
    assert stats["abandons_released"] == stats["abandons_not_held"] == 0


@pytest.mark.parametrize("api", APIS)
def test_a_silent_session_is_closed_and_its_acquire_abandoned(scripted, api):
    """Like TestSilenceTimeoutClosesTheSessionOfASilentServer."""
    def mute_first(index, conn, frames):
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if index == 0 and op != b"S":
                continue  # the first connection goes silent after SESSION: no answer, no PONG
            if op in (b"S", b"P"):
                conn.sendall(owner_only(b"P", owner))
            elif op == b"X":
                conn.sendall(owner_only(b"R", owner))

    srv = scripted(mute_first, flags=ABANDON_FLAG)
    with client_of(api, srv.addr, silence_timeout=0.6) as c:
        t0 = time.monotonic()
        with pytest.raises(lockd.Indeterminate) as e:
            c.acquire("k", min_work_budget=0)
        elapsed = time.monotonic() - t0
        assert not isinstance(e.value, lockd.WaitElapsed)
        deadline = time.monotonic() + 10
        while c.stats.abandons_released == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = vars(c.stats).copy()
    assert 0.6 <= elapsed < 0.6 + 0.1, "closed after the silence timeout, long before the 5 s I/O deadline"
    assert stats["silent_sessions"] == 1 and stats["abandons_released"] == 1
    ops = [op for op, _, _ in frames_on(srv, 0)]
    assert ops[:2] == [b"S", b"A"] and b"P" in ops[2:], "a PING went out before the session was given up"
    (_, _, a_fixed, _), = srv.requests(b"A")
    (_, _, x_fixed, _), = srv.requests(b"X")
    assert struct.unpack(">QQ", x_fixed)[1] == owner_of(a_fixed)


@pytest.mark.parametrize("api", APIS)
def test_ping_keeps_a_live_server_audible_through_a_long_wait(scripted, api):
    """Like TestPingKeepsASlowButLiveServersSessionOpen."""
    def late_grant(index, conn, owner, fixed):
        send_later(conn, 1.5, acquired(owner, 9))

    srv = scripted(serving(late_grant), flags=ABANDON_FLAG)
    with client_of(api, srv.addr, silence_timeout=0.6) as c:
        t = c.acquire("k", wait=3, min_work_budget=0)
        assert t.token == 9
        stats = vars(c.stats).copy()
    assert stats["silent_sessions"] == 0 and stats["abandoned_sessions"] == 0
    (a_conn, _, _, _), = srv.requests(b"A")
    pings = [op for op, _, _ in frames_on(srv, a_conn)].count(b"P")
    assert pings >= 3, f"{pings} PINGs in 1.5 s with a 0.6 s silence timeout"


def test_a_pong_left_unread_is_no_silence(scripted):
    """The blocking client reads a session only while a caller waits: a
    PONG that came after the caller left sits unread, and the next call
    must not take the session for silent."""
    def script(index, conn, frames):
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if op == b"S":
                conn.sendall(owner_only(b"P", owner))
            elif op == b"P":
                send_later(conn, 0.3, owner_only(b"P", owner))
            elif op == b"A":
                send_later(conn, 0.3, acquired(owner, 5))

    srv = scripted(script, flags=ABANDON_FLAG)
    with lockd.Client(srv.addr, silence_timeout=0.6) as c:
        c.acquire("a", min_work_budget=0)  # a PING went out at 0.2 s, its PONG comes at 0.5 s
        time.sleep(1)
        assert c.acquire("b", min_work_budget=0).token == 5
        assert c.stats.silent_sessions == 0
    assert srv.requests(b"P"), "a PING was sent while the first acquire waited"


@pytest.mark.parametrize("api", APIS)
def test_a_full_queue_gives_the_abandon_up(scripted, api):
    """Like TestAbandonQueueFullIsGivenUp: with both workers busy and the
    queue of 1 taken, the next ABANDON is given up, left to the lease."""
    answer = threading.Event()

    def script(index, conn, frames):
        for op, fixed, text in frames:
            owner = owner_of(fixed)
            if op in (b"S", b"P"):
                conn.sendall(owner_only(b"P", owner))
            elif op == b"A":  # on a wait session: cut after sending
                conn.shutdown(socket.SHUT_RDWR)
                return
            elif op == b"X":
                threading.Thread(target=lambda o=owner: (
                    answer.wait(10), conn.sendall(owner_only(b"N", o)))).start()

    srv = scripted(script, flags=ABANDON_FLAG)
    with client_of(api, srv.addr, compensation_queue=1) as c:
        messages = []
        for i in range(4):
            with pytest.raises(lockd.Indeterminate) as e:
                c.acquire(f"k{i}", wait=2, min_work_budget=0)
            messages.append(str(e.value))
            if i < 2:  # a worker has taken it
                deadline = time.monotonic() + 5
                while len(srv.requests(b"X")) <= i and time.monotonic() < deadline:
                    time.sleep(0.01)
        assert c.stats.abandons_given_up == 1
        assert "left to its lease" in messages[3]
        answer.set()
        deadline = time.monotonic() + 10
        while c.stats.abandons_not_held < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.stats.abandons_not_held == 3 and c.stats.abandons_sent == 3


@pytest.mark.parametrize("api", APIS)
def test_a_release_on_a_silent_session_is_retried_elsewhere(scripted, api):
    """Like TestReleaseOnASilentSessionIsRetriedElsewhere."""
    def mute_after_session(index, conn, frames):
        for op, fixed, text in frames:
            if op == b"S":
                conn.sendall(owner_only(b"P", owner_of(fixed)))

    a = scripted(mute_after_session, flags=ABANDON_FLAG)
    b = scripted(grant_all(), flags=ABANDON_FLAG)
    with client_of(api, [a.addr, b.addr], silence_timeout=0.6) as c:
        (c if api == "blocking" else c.client)._rr = -1  # the first pick tries a's session first
        t0 = time.monotonic()
        if api == "blocking":
            c.release_token("k", 7)
        else:
            c.run(c.client.release_token("k", 7))
        elapsed = time.monotonic() - t0
        assert c.stats.silent_sessions == 1
    assert 0.6 <= elapsed < 2, "moved on after the silence timeout, not the 5 s of the release"
    assert len(a.requests(b"R")) == 1 and len(b.requests(b"R")) == 1


def test_a_cancelled_acquire_that_may_have_left_is_abandoned(scripted):
    """Cancelling an asyncio acquire acts like its deadline: its session
    closes, and what the server made of it is given back."""
    srv = scripted(serving(lambda index, conn, owner, fixed: None, x_answer=b"R"), flags=ABANDON_FLAG)

    async def main():
        async with lockd.AsyncClient(srv.addr) as c:
            task = asyncio.get_running_loop().create_task(c.acquire("k", wait=5, min_work_budget=0))
            while not srv.requests(b"A"):
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(500):
                if c.stats.abandons_released:
                    break
                await asyncio.sleep(0.01)
            return vars(c.stats).copy()
    stats = asyncio.run(asyncio.wait_for(main(), 30))
    assert stats["abandoned_sessions"] == 1 and stats["abandons_released"] == 1
    (_, _, a_fixed, _), = srv.requests(b"A")
    (_, _, x_fixed, x_text), = srv.requests(b"X")
    assert (struct.unpack(">QQ", x_fixed)[1], x_text) == (owner_of(a_fixed), b"k")


@pytest.mark.parametrize("api", APIS)
def test_printing_a_client_does_not_show_its_client_id(scripted, api):
    """Like TestPrintingAClientDoesNotShowItsClientID: the client_id is a
    bearer secret; the client, its attributes and their values print
    without it, as a debugging caller or a traceback's locals would."""
    srv = scripted(grant_all(), flags=ABANDON_FLAG)
    with client_of(api, srv.addr) as c:
        c.acquire("k", min_work_budget=0)
        client = c if api == "blocking" else c.client
        attrs = vars(client)
        printed = " ".join([repr(client), str(client), repr(attrs), str(attrs)]
                           + [f"{v!r} {v!s}" for v in attrs.values()])
    (_, fixed, _), = [f for f in frames_on(srv, 0) if f[0] == b"S"]
    client_id = fixed[8:]
    for form in (repr(client_id), client_id.hex(), client_id.hex().upper(), str(list(client_id))):
        assert form not in printed, f"printing the client shows its client_id as {form}"


@pytest.mark.parametrize("api", APIS)
def test_an_abandon_is_sent_only_to_a_server_that_offers_it(scripted, api):
    """Like TestAbandonIsSentOnlyToAServerThatOffersIt: in a pool where one
    server sets GREETING bit1 and another does not (a rolling upgrade),
    SESSION and ABANDON go only where the bit is set; elsewhere they are
    unknown ops that would close a session other calls share."""
    offers = scripted(serving(cut_the_first), flags=ABANDON_FLAG)
    plain = scripted(grant_all())
    with client_of(api, [offers.addr, plain.addr]) as c:
        for _ in range(10):  # round-robin: the first to reach `offers` is cut
            try:
                c.acquire("k", min_work_budget=0)
            except lockd.Indeterminate as e:
                assert "ABANDON" in str(e)
                break
        else:
            pytest.fail("no acquire reached the server that offers ABANDON")
        deadline = time.monotonic() + 10
        while c.stats.abandons_released == 0 and not plain.requests(b"X") and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = vars(c.stats).copy()
    assert plain.requests(b"S") == [] and plain.requests(b"X") == []
    assert len(offers.requests(b"X")) == 1 and stats["abandons_released"] == 1


def down_on_acquire(holder):
    """A §6a script that goes down at the first ACQUIRE it gets: it cuts
    that connection and stops accepting, a node killed after the request
    may have reached it. ABANDON is answered RELEASED."""
    def on_acquire(index, conn, owner, fixed):
        srv = holder[0]
        with contextlib.suppress(OSError):
            srv.sock.shutdown(socket.SHUT_RDWR)
        conn.shutdown(socket.SHUT_RDWR)
        return False
    return serving(on_acquire)


@pytest.mark.parametrize("api", APIS)
def test_an_abandon_goes_to_another_node_when_one_is_down(scripted, api):
    """Like TestAbandonGoesToAnotherNodeWhenOneIsDown: the ABANDON of an
    acquire whose node went down is sent to another node of the client."""
    a_holder, b_holder = [], []
    a = scripted(down_on_acquire(a_holder), flags=ABANDON_FLAG)
    b = scripted(down_on_acquire(b_holder), flags=ABANDON_FLAG)
    a_holder.append(a)
    b_holder.append(b)
    with client_of(api, [a.addr, b.addr]) as c:
        with pytest.raises(lockd.Indeterminate) as e:
            c.acquire("k", min_work_budget=0)
        assert "ABANDON" in str(e.value)
        deadline = time.monotonic() + 10
        while c.stats.abandons_released == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = vars(c.stats).copy()
    down, up = (a, b) if a.requests(b"A") else (b, a)
    (_, _, a_fixed, _), = down.requests(b"A")
    assert up.requests(b"A") == [] and down.requests(b"X") == []
    (_, _, x_fixed, x_text), = up.requests(b"X")
    assert struct.unpack(">QQ", x_fixed)[1] == owner_of(a_fixed) and x_text == b"k"
    assert stats["abandons_released"] == 1 and stats["abandons_given_up"] == 0
