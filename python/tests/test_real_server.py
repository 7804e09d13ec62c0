"""The rules of docs/protocol.md §6, §6a and §7, against lockd built from the
tree in single mode, through the blocking and the asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import threading
import time

import pytest

import lockd
from conftest import client_of, free_ports, start_single, wait_listening, wait_until


@pytest.fixture
def client(server):
    with lockd.Client(server.addr) as c:
        yield c


def test_acquire_renew_release(client, key):
    t = client.acquire(key, lease=10, min_work_budget=1)
    assert t.token > 0 and t.key == key
    # Validity: send instant + lease - (100 ms + 1 ms per second of it).
    assert 9.0 < t.remaining() <= 10 - 0.11
    t.renew(20)
    assert 19.0 < t.remaining() <= 20 - 0.12
    assert t.lease == 20
    client.release(t)
    with pytest.raises(lockd.NotHeld):
        client.release(t)
    again = client.acquire(key, min_work_budget=0)
    assert again.token > t.token, "tokens only grow per key"
    client.release(again)


def test_durations_rounded_up_not_clamped(client, key):
    t = client.acquire(key, lease=0.2, min_work_budget=0)  # 1 s after rounding up
    assert 0.5 < t.remaining() <= 1 - 0.1
    client.release(t)
    for kwargs, err in [
        (dict(lease=3600.001, min_work_budget=0), lockd.UnsupportedDuration),
        (dict(lease=0, min_work_budget=0), lockd.UnsupportedDuration),
        (dict(wait=255.001, min_work_budget=0), lockd.UnsupportedDuration),
        (dict(wait=-1, min_work_budget=0), lockd.UnsupportedDuration),
        (dict(min_work_budget=250.5, lease=300), lockd.UnsupportedDuration),
        (dict(min_work_budget=None), lockd.UnsupportedDuration),
        (dict(lease=10, min_work_budget=10.5), lockd.InsufficientLease),
    ]:
        with pytest.raises(err):
            client.acquire(key, **kwargs)
    with pytest.raises(TypeError):
        client.acquire(key)  # min_work_budget is required
    with pytest.raises(lockd.UnsupportedDuration):
        t = client.acquire(key, min_work_budget=0)
        try:
            t.renew(3601)
        finally:
            client.release(t)


def test_keys_are_bytes_of_utf8_without_space_cr_lf(client):
    for bad in ["", "a b", "k\r", "k\n", "x" * 129, "한" * 43, "\ud800"]:
        with pytest.raises(lockd.BadKey):
            client.acquire(bad, min_work_budget=0)
    for good in ["é" * 64, "한" * 42, "ж/é"]:
        client.release(client.acquire(good, min_work_budget=0))


def test_wait_zero_on_held_key_is_a_definite_timeout(client, key):
    t = client.acquire(key, min_work_budget=0)
    with pytest.raises(lockd.Timeout) as e:
        client.acquire(key, min_work_budget=0)
    assert not isinstance(e.value, lockd.Indeterminate)
    client.release(t)


def test_waiting_acquire_gets_the_lock_on_release(client, key):
    t = client.acquire(key, min_work_budget=0)
    got = []
    th = threading.Thread(target=lambda: got.append(client.acquire(key, wait=10, min_work_budget=1)))
    th.start()
    time.sleep(0.3)  # let it queue; the assertion below holds either way
    client.release(t)
    th.join(15)
    assert got and got[0].token > t.token
    client.release(got[0])


def test_wait_that_runs_out_is_indeterminate_and_closes_only_its_session(client, key):
    holder = client.acquire(key, lease=30, min_work_budget=0)
    stop = threading.Event()
    cycles, failures = [0], []

    def traffic():  # requests in flight on the shared session meanwhile
        n = 0
        while not stop.is_set() and n < 100000:
            n += 1
            try:
                client.release(client.acquire(f"{key}/other/{n}", min_work_budget=0))
                cycles[0] += 1
            except lockd.LockdError as e:
                failures.append(e)
    th = threading.Thread(target=traffic)
    th.start()
    before = client.stats.abandoned_sessions
    t0 = time.monotonic()
    with pytest.raises((lockd.WaitElapsed, lockd.Timeout)) as e:
        client.acquire(key, wait=1, min_work_budget=0)
    elapsed = time.monotonic() - t0
    stop.set()
    th.join()
    assert 1.0 <= elapsed < 3.0
    assert_wait_ran_out(e.value, client.stats.abandoned_sessions - before)
    assert failures == [] and cycles[0] > 0, "the shared session's calls were not affected"
    client.release(holder)


def assert_wait_ran_out(err, abandoned):
    """A wait that runs out on a held key closes its own session and ends
    WaitElapsed (an Indeterminate). The server's wait ends a moment after
    the caller's, so only a caller descheduled across its deadline sees the
    server's TIMEOUT first: correlated, a definite non-acquisition, and then
    no session is closed."""
    if isinstance(err, lockd.WaitElapsed):
        assert isinstance(err, lockd.Indeterminate)
        assert abandoned == 1
    else:
        assert isinstance(err, lockd.Timeout) and not isinstance(err, lockd.Indeterminate)
        assert abandoned == 0


def test_delivery_gate_releases_a_grant_below_the_work_budget(client, key):
    # A 1 s lease leaves 1 s - drift margin: below a 1 s budget, always.
    with pytest.raises(lockd.Indeterminate) as e:
        client.acquire(key, lease=1, min_work_budget=1)
    assert "compensation" in str(e.value)
    wait_until(lambda: client.stats.compensations_done == 1, what="the compensating release")
    client.release(client.acquire(key, min_work_budget=0))  # free at once: it was released


def test_renew_answered_not_held_ends_validity_and_fires_lost(client, key):
    t = client.acquire(key, lease=5, min_work_budget=0)
    lost = t.lost()
    assert not lost.is_set()
    client.release_token(key, t.token)
    assert lost.is_set(), "a RELEASED ends the watch"
    with pytest.raises(lockd.NotHeld):
        t.renew()
    assert t.remaining() == 0


def test_lost_fires_at_the_end_of_validity(client, key):
    t = client.acquire(key, lease=1, min_work_budget=0)
    assert t.lost().wait(3), "lost at valid_until"
    assert t.remaining() == 0


def test_keep_alive_keeps_a_short_lease(client, key):
    t = client.acquire(key, lease=1, min_work_budget=0)
    first_until = t.valid_until
    stop = threading.Event()
    th = threading.Thread(target=t.keep_alive, args=(0.3, stop))
    th.start()
    time.sleep(1.6)  # longer than the lease: only renewals keep it
    stop.set()
    th.join(6)
    assert t.valid_until > first_until
    client.release(t)  # RELEASED: still held after its first lease


def test_with_lock_releases(client, key):
    with client.lock(key, min_work_budget=0) as t:
        assert t.token > 0
        with pytest.raises(lockd.Timeout):
            client.acquire(key, min_work_budget=0)
    client.release(client.acquire(key, min_work_budget=0))


def test_owners_fail_closed_before_wrapping(server, key):
    # The session's SESSION takes owner 2**64 - 2 (§6a), the acquire the last.
    with lockd.Client(server.addr, _first_owner=2**64 - 3) as c:
        t = c.acquire(key, min_work_budget=0)  # owner 2**64 - 1, the last
        with pytest.raises(lockd.OwnerExhausted):
            c.release(t)
        with pytest.raises(lockd.OwnerExhausted):
            c.acquire(key + "/2", min_work_budget=0)
    with lockd.Client(server.addr) as c:
        c.release_token(key, t.token)


def test_several_addresses_skip_a_dead_one(server, key):
    dead, = free_ports(1)
    with lockd.Client([f"127.0.0.1:{dead}", server.addr]) as c:
        for i in range(3):
            c.release(c.acquire(f"{key}/{i}", min_work_budget=0))


def test_no_server_is_not_connected():
    dead, = free_ports(1)
    with pytest.raises(lockd.NotConnected):
        lockd.Client(f"127.0.0.1:{dead}", dial_timeout=1)


SECRET = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"


@pytest.fixture(scope="module")
def auth_server(lockd_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    path = d / "auth"
    path.write_text(f"billing:{SECRET}\n")
    os.chmod(path, 0o600)
    s = start_single(lockd_bin, str(d), ["--auth-file", str(path)], name="auth")
    yield s
    s.kill()


def test_hmac_hello_is_mutual(auth_server, server, key):
    with lockd.Client(auth_server.addr, tenant="billing", secret=SECRET) as c:
        c.release(c.acquire(key, min_work_budget=0))
    with lockd.Client(auth_server.addr, tenant="billing", secret=bytes.fromhex(SECRET)) as c:
        c.release(c.acquire(key, min_work_budget=0))
    with pytest.raises(lockd.Auth):
        lockd.Client(auth_server.addr, tenant="billing", secret="00" * 32)
    with pytest.raises(lockd.Auth):
        lockd.Client(auth_server.addr)
    with pytest.raises(lockd.Auth):  # a server that cannot prove the secret
        lockd.Client(server.addr, tenant="billing", secret=SECRET)
    with pytest.raises(lockd.Config):
        lockd.Client(server.addr, tenant="no spaces")


@pytest.fixture(scope="module")
def tls_server(lockd_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    goroot = subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["go", "run", os.path.join(goroot, "src/crypto/tls/generate_cert.go"),
                    "--host", "127.0.0.1", "--ecdsa-curve", "P256"], cwd=d, check=True, capture_output=True)
    os.chmod(d / "key.pem", 0o600)
    tls_port, = free_ports(1)
    s = start_single(lockd_bin, str(d), ["--tls-listen", f"127.0.0.1:{tls_port}",
                                         "--tls-cert", str(d / "cert.pem"), "--tls-key", str(d / "key.pem")],
                     name="tls")
    wait_listening(tls_port, s.proc, s.log)  # the TLS listener may come up after the plain one
    s.tls_addr = f"127.0.0.1:{tls_port}"
    s.ca = str(d / "cert.pem")
    yield s
    s.kill()


def test_tls(tls_server, key):
    import ssl
    ctx = ssl.create_default_context(cafile=tls_server.ca)
    with lockd.Client(tls_server.tls_addr, tls=ctx) as c:
        c.release(c.acquire(key, min_work_budget=0))

    async def main():
        async with lockd.AsyncClient(tls_server.tls_addr, tls=ctx) as c:
            await c.release(await c.acquire(key, min_work_budget=0))
    asyncio.run(main())
    with pytest.raises(lockd.TLS):  # a certificate no CA we trust signed
        lockd.Client(tls_server.tls_addr, tls=True)


# The asyncio client: the same rules.

def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_async_acquire_renew_release(server, key):
    async def main():
        async with lockd.AsyncClient(server.addr) as c:
            t = await c.acquire(key, lease=10, min_work_budget=1)
            assert 9.0 < t.remaining() <= 9.9
            await t.renew(20)
            assert 19.0 < t.remaining() <= 19.9
            with pytest.raises(lockd.Timeout):
                await c.acquire(key, min_work_budget=0)
            await c.release(t)
            with pytest.raises(lockd.NotHeld):
                await c.release(t)
            with pytest.raises(lockd.BadKey):
                await c.acquire("a b", min_work_budget=0)
            with pytest.raises(lockd.InsufficientLease):
                await c.acquire(key, lease=2, min_work_budget=3)
            async with c.lock(key, min_work_budget=0) as held:
                assert held.token > t.token
    run(main())


def test_async_wait_that_runs_out_closes_only_its_session(server, key):
    async def main():
        async with lockd.AsyncClient(server.addr) as c:
            holder = await c.acquire(key, min_work_budget=0)

            async def traffic():
                for n in range(200):
                    await c.release(await c.acquire(f"{key}/o/{n}", min_work_budget=0))
            other = asyncio.ensure_future(traffic())
            with pytest.raises((lockd.WaitElapsed, lockd.Timeout)) as e:
                await c.acquire(key, wait=1, min_work_budget=0)
            await other  # no failure on the shared session
            assert_wait_ran_out(e.value, c.stats.abandoned_sessions)
            await c.release(holder)
    run(main())


def test_async_waiter_granted_and_gate(server, key):
    async def main():
        async with lockd.AsyncClient(server.addr) as c:
            t = await c.acquire(key, min_work_budget=0)
            waiter = asyncio.ensure_future(c.acquire(key, wait=10, min_work_budget=1))
            await asyncio.sleep(0.2)
            await c.release(t)
            t2 = await waiter
            assert t2.token > t.token
            await c.release(t2)
            with pytest.raises(lockd.Indeterminate):
                await c.acquire(key, lease=1, min_work_budget=1)
            for _ in range(500):
                if c.stats.compensations_done:
                    break
                await asyncio.sleep(0.01)
            assert c.stats.compensations_done == 1
            await c.release(await c.acquire(key, min_work_budget=0))
    run(main())


def test_async_cancelled_wait_closes_its_session(server, key):
    async def main():
        async with lockd.AsyncClient(server.addr) as c:
            holder = await c.acquire(key, min_work_budget=0)
            task = asyncio.ensure_future(c.acquire(key, wait=30, min_work_budget=0))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert c.stats.abandoned_sessions == 1
            await c.release(holder)
            # The server dropped that waiter with its connection: the key is free.
            await c.release(await c.acquire(key, min_work_budget=0))
    run(main())


def test_async_keep_alive_and_lost(server, key):
    async def main():
        async with lockd.AsyncClient(server.addr) as c:
            t = await c.acquire(key, lease=1, min_work_budget=0)
            lost = t.lost()
            keeper = asyncio.ensure_future(t.keep_alive(0.3))
            await asyncio.sleep(1.6)
            assert not lost.is_set()
            keeper.cancel()
            await c.release(t)
            assert lost.is_set()
    run(main())


class CuttingProxy:
    """A loopback TCP proxy to `target`. On its first connection, once the
    client has sent an ACQUIRE, it drops the server's next bytes (the
    answer) and cuts both sides: the request reached the server, and the
    client never hears what became of it. Later connections pass."""

    def __init__(self, target):
        self.target = target
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.cut = threading.Event()
        self.socks = []
        self.first = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            host, port = self.target.rsplit(":", 1)
            server = socket.create_connection((host, int(port)))
            self.socks += [client, server]
            cutting, self.first = self.first, False
            sent_acquire = threading.Event()
            threading.Thread(target=self._pump, args=(client, server, sent_acquire, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None, sent_acquire if cutting else None),
                             daemon=True).start()

    def _pump(self, src, dst, mark, cut_after):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if cut_after is not None and cut_after.is_set():
                    self.cut.set()  # the answer to the ACQUIRE is dropped
                    break
                if mark is not None and data[:1] == b"A":
                    mark.set()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self):
        self.sock.close()
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_an_acquire_cut_after_sending_is_given_back_and_the_key_freed(server, key, api):
    """§6a end to end: the grant whose answer was lost is released by the
    client's ABANDON, so the key is free at once, not after its 30 s."""
    proxy = CuttingProxy(server.addr)
    try:
        with client_of(api, proxy.addr) as c, lockd.Client(server.addr) as other:
            with pytest.raises(lockd.Indeterminate):
                c.acquire(key, lease=30, min_work_budget=0)
            seen = time.monotonic()
            assert proxy.cut.is_set(), "the server answered, and the answer was dropped"
            lock = lockd.Lock(other, key, min_work_budget=0)
            while not lock.acquire(blocking=False):
                assert time.monotonic() - seen < 1, "the key is still held a second after the cut"
                time.sleep(0.02)
            lock.release()
            wait_until(lambda: c.stats.abandons_released == 1, what="the ABANDON answered RELEASED")
            assert c.stats.abandons_sent == 1 and c.stats.abandons_given_up == 0
    finally:
        proxy.close()
