"""The asyncio client: the same sessions and rules as the blocking client,
on one event loop.

Sessions (_aio_session.py) are asyncio Protocols. Waiting acquires get
sessions of their own, as in the blocking client. Cancelling a call is like
its deadline: a request still queued is withdrawn, unsent; one that may have
left closes its session; a grant already correlated is released as
compensation, and one whose session closed is given back with an ABANDON
where the server serves it (§6a); then the CancelledError propagates.

Bytes handed to the transport count as possibly sent: asyncio does not say
which of them reached the kernel, so a failed write is never retried as
certainly unsent here (the blocking client tracks the bytes each send got
out).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time

from . import _core as core
from . import errors
from ._aio_session import ENQUEUED, FULL, Session
from .ticket import Ticket

_RECONNECT_MIN, _RECONNECT_MAX = 0.05, 2.0


class _Slot:
    def __init__(self, next_addr):
        self.session = None
        self.next_addr = next_addr
        self.dialing = False
        self.retry_at = 0.0
        self.delay = _RECONNECT_MIN


class _WaitPool:
    def __init__(self, client, limit):
        self.client, self.limit = client, limit
        self.cond = asyncio.Condition()
        self.idle: list[Session] = []
        self.open = 0
        self.next_addr = 0

    async def take(self, req):
        clock = self.client._clock
        async with self.cond:
            while True:
                if self.client._stopped:
                    raise errors.Closed("client closed")
                while self.idle:
                    s = self.idle.pop()
                    if not s.closed:
                        return s
                if self.open < self.limit:
                    self.open += 1
                    break
                left = req.deadline - clock()
                if left <= 0:
                    req.expired = True
                    raise core.Deadline("no wait session came free before the deadline")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cond.wait(), left)
        try:
            return await self.client._dial_any(req, self)
        except BaseException:
            self.open -= 1
            self._notify()
            raise

    def _notify(self):
        async def notify():
            async with self.cond:
                self.cond.notify()
        asyncio.get_running_loop().create_task(notify())

    def put(self, s):
        if not s.closed:
            self.idle.append(s)
            self._notify()

    def died(self, s):
        if s in self.idle:
            self.idle.remove(s)
        self.open -= 1
        with contextlib.suppress(RuntimeError):
            self._notify()

    def close_all(self):
        idle, self.idle = self.idle, []
        for s in idle:
            s.fail("client closed")


class AsyncTicket(Ticket):
    """A held lock, as Ticket; renew and keep_alive are coroutines and lost
    returns an asyncio.Event."""

    def lost(self) -> asyncio.Event:
        return self._client._watches.lost(self)

    async def renew(self, lease=None):
        await self._client._renew(self, self.lease if lease is None else lease)

    async def keep_alive(self, interval):
        """Renews every `interval` seconds until cancelled. Raises when the
        lock is lost: NotHeld at once, or the first failed renewal's error
        when the validity ran out before one was confirmed."""
        if core.to_ns("interval", interval) <= 0:
            raise errors.UnsupportedDuration(f"keep-alive interval {interval!r}")
        interval = core.to_ns("interval", interval) / 1e9
        failed = None
        while True:
            await asyncio.sleep(min(interval, self.remaining()) if failed else interval)
            if failed and self.remaining() == 0:
                raise errors.NotHeld(f"the lease of {self.key!r} lapsed without a confirmed renewal: {failed}") from failed
            try:
                await self.renew()
                failed = None
            except errors.NotHeld:
                raise
            except errors.LockdError as e:
                failed = failed or e


class _Watches:
    def __init__(self, client):
        self.client = client
        self.by_grant: dict[tuple[bytes, int], list] = {}

    def lost(self, t):
        k = (t._key, t.token)
        w = self.by_grant.get(k)
        if w:
            return w[0]
        ev = asyncio.Event()
        left = t.valid_until - self.client._clock()
        if left <= 0:
            ev.set()
            return ev
        w = [ev, asyncio.get_running_loop().call_later(left, self.end, *k)]
        self.by_grant[k] = w
        return ev

    def renew(self, key, token, left):
        w = self.by_grant.get((key, token))
        if w:
            w[1].cancel()
            w[1] = asyncio.get_running_loop().call_later(left, self.end, key, token)

    def end(self, key, token):
        w = self.by_grant.pop((key, token), None)
        if w:
            w[1].cancel()
            w[0].set()


class AsyncClient:
    """The asyncio client: `async with AsyncClient(addrs, ...) as c:` (or
    `c = await AsyncClient(...).connect()` ... `await c.close()`). Arguments
    as for lockd.Client."""

    def __init__(self, addrs, tenant=None, secret=None, tls=None, *, sessions=None,
                 max_in_flight=4096, wait_sessions=64, dial_timeout=5.0,
                 compensation_queue=256, silence_timeout=core.DEFAULT_SILENCE_TIMEOUT,
                 _clock=time.monotonic, _first_owner=0):
        self.addrs = [addrs] if isinstance(addrs, str) else list(addrs)
        if not self.addrs:
            raise errors.Config("no server address")
        for a in self.addrs:
            core.split_addr(a)
        self._secret = core.secret_bytes(secret)
        self._tenant = core.tenant_bytes(tenant, self._secret)
        if tls is True:
            tls = ssl.create_default_context()
        self._tls = tls
        compensation_queue, self._silence, self._dial_timeout = core.check_options(
            compensation_queue, silence_timeout, dial_timeout)
        self._client_id = core.ClientID()
        self._clock = _clock
        self._owners = core.Owners(_first_owner)
        self._max_in_flight = max_in_flight
        self._release_limit = max_in_flight + max(max_in_flight // 4, 1)
        self.stats = core.Stats()
        self._watches = _Watches(self)
        self._closing = False
        self._stopped = False
        self._rr = 0
        self._slots = [_Slot(i % len(self.addrs)) for i in range(sessions or len(self.addrs))]
        self._wait_limit = wait_sessions
        self._comp_size = compensation_queue
        self._waits = None
        self._comp = None
        self._comp_workers = []

    async def connect(self):
        self._waits = _WaitPool(self, self._wait_limit)
        self._comp = asyncio.Queue(self._comp_size)
        errs = []
        for slot in self._slots:
            try:
                slot.session = await self._dial_slot(slot, self._clock() + self._dial_timeout, len(self.addrs))
            except (errors.Auth, errors.TLS):
                await self.close()
                raise
            except errors.LockdError as e:
                errs.append(e)
        if all(slot.session is None for slot in self._slots):
            await self.close()
            raise errors.NotConnected("; ".join(map(str, errs)))
        loop = asyncio.get_running_loop()
        self._comp_workers = [loop.create_task(self._run_compensations()) for _ in range(2)]
        return self

    async def __aenter__(self):
        return await self.connect()

    async def __aexit__(self, *exc):
        await self.close()

    # Connecting.

    async def _connect(self, addr, deadline, pool):
        """As Client._connect: one bound over the dial, TLS, the handshake
        and SESSION; a caller's deadline that cuts it is core.Deadline."""
        timeout = min(self._dial_timeout, deadline - self._clock())
        if timeout <= 0:
            raise core.Deadline("the deadline came before a session was ready")
        host, port = core.split_addr(addr)
        loop = asyncio.get_running_loop()
        s = Session(self, addr, pool)
        try:
            async with asyncio.timeout(timeout):
                try:
                    await loop.create_connection(lambda: s, host, port, ssl=self._tls,
                                                 server_hostname=host if self._tls else None)
                except ssl.SSLError as e:
                    raise errors.TLS(f"TLS handshake with {addr}: {e}") from None
                hs = core.Handshake(self._tenant, self._secret)
                hello = hs.greeting(await s.next_handshake_frame())
                if hello is not None:
                    s.transport.write(hello)
                    hs.welcome(await s.next_handshake_frame())
                if hs.serves_abandon:
                    owner = self._owners.next()
                    s.transport.write(self._client_id.session_frame(owner))
                    core.session_answer(await s.next_handshake_frame(), owner)
        except BaseException as e:
            s.pool = None
            s.fail("handshake failed")
            if isinstance(e, errors.LockdError):
                raise
            if isinstance(e, OSError):
                if self._clock() >= deadline:
                    raise core.Deadline(f"the deadline came while connecting to {addr}") from None
                raise errors.NotConnected(f"connect to {addr}: {e!r}") from None
            raise
        s.serves_abandon = hs.serves_abandon
        s.ready = True
        return s

    async def _dial_slot(self, slot, deadline, tries=1):
        errs = []
        for _ in range(tries):
            addr = self.addrs[slot.next_addr]
            try:
                return await self._connect(addr, deadline, None)
            except (errors.Auth, errors.TLS, core.Deadline):
                raise
            except errors.LockdError as e:
                errs.append(e)
                slot.next_addr = (slot.next_addr + 1) % len(self.addrs)
        raise errors.NotConnected("; ".join(map(str, errs)))

    async def _dial_any(self, req, pool):
        errs = []
        for _ in range(len(self.addrs)):
            addr = self.addrs[pool.next_addr]
            try:
                s = await self._connect(addr, req.deadline, pool)
                self.stats.reconnects += 1
                return s
            except core.Deadline:
                req.expired = True
                raise
            except (errors.Auth, errors.TLS):
                raise
            except errors.LockdError as e:
                errs.append(e)
                pool.next_addr = (pool.next_addr + 1) % len(self.addrs)
        raise errors.NotConnected("; ".join(map(str, errs)))

    async def _slot_session(self, slot, deadline):
        s = slot.session
        if s is not None and not s.closed:
            return s
        now = self._clock()
        if now < slot.retry_at or slot.dialing:
            return None
        slot.dialing = True
        try:
            try:
                s = await self._dial_slot(slot, min(deadline, now + self._dial_timeout))
            except (errors.NotConnected, core.Deadline):
                slot.retry_at = self._clock() + slot.delay
                slot.delay = min(2 * slot.delay, _RECONNECT_MAX)
                return None
            slot.delay = _RECONNECT_MIN
            slot.session = s
            self.stats.reconnects += 1
            return s
        finally:
            slot.dialing = False

    # Sending.

    async def _pick(self, req, limit):
        n = len(self._slots)
        while True:
            if self._stopped:
                raise errors.Closed("client closed")
            self._rr += 1
            start, full = self._rr, False
            for i in range(n):
                slot = self._slots[(start + i) % n]
                s = slot.session
                if s is None or s.closed:
                    s = await self._slot_session(slot, req.deadline)
                if s is None:
                    continue
                r = s.enqueue(req, limit)
                if r == ENQUEUED:
                    return s
                if r == FULL:
                    full = True
            if full:
                raise core.PoolFull("every session is at its in-flight limit")
            left = req.deadline - self._clock()
            if left <= 0:
                req.expired = True
                raise core.Deadline("no session was ready before the deadline")
            await asyncio.sleep(min(left, _RECONNECT_MIN))

    async def _pick_wait(self, req):
        while True:
            s = await self._waits.take(req)
            if s.enqueue(req, 1) == ENQUEUED:
                return s

    async def _await(self, s, req):
        left = req.deadline - self._clock()
        if left <= 0:
            return s.abandon(req)
        handle = asyncio.get_running_loop().call_later(left, self._on_deadline, s, req)
        try:
            return await req.waiter
        except asyncio.CancelledError:
            out = s.abandon(req)
            if req.kind == core.ACQUIRE:
                if out == core.ACQUIRED:
                    self._compensate(req.key, req.granted)
                elif out == core.LOST and req.abandonable:
                    self._give_back(req.key, req.owner)
            raise
        finally:
            handle.cancel()

    @staticmethod
    def _on_deadline(s, req):
        if not req.waiter.done():
            req.waiter.set_result(s.abandon(req))

    async def _exchange(self, req, limit, retry_sent):
        loop = asyncio.get_running_loop()
        waiting = req.kind == core.ACQUIRE and not req.immediate
        backoff = core.RELEASE_BACKOFF_MIN
        out = None
        for _ in range(core.MAX_ATTEMPTS):
            req.waiter = loop.create_future()
            try:
                s = await (self._pick_wait(req) if waiting else self._pick(req, limit))
            except core.PoolFull:
                if retry_sent and await self._pause(req, backoff):
                    backoff = min(2 * backoff, core.RELEASE_BACKOFF_MAX)
                    continue
                raise
            try:
                out = await self._await(s, req)
            finally:
                if waiting:
                    self._waits.put(s)
            step = core.next_step(req, out, retry_sent)
            if step == core.DONE_:
                return out
            core.reset_for_retry(req)
            if step == core.PAUSE:
                if not await self._pause(req, backoff):
                    return out
                backoff = min(2 * backoff, core.RELEASE_BACKOFF_MAX)
        if out == core.UNSENT:
            raise errors.NotConnected("every attempt failed before a byte left")
        return out

    async def _pause(self, req, backoff):
        left = req.deadline - self._clock()
        if left > 0:
            await asyncio.sleep(min(backoff, left))
        return self._clock() < req.deadline

    # The API.

    async def acquire(self, key, lease=None, wait=0, *, min_work_budget) -> AsyncTicket:
        """As Client.acquire."""
        now = self._clock()
        kb = core.key_bytes(key)
        p = core.acquire_params(lease, wait, min_work_budget)
        if self._closing:
            raise errors.Closed("client closed")
        owner = self._owners.next()
        bound = p.wait if p.wait else core.IO_DEADLINE
        req = core.Request(core.ACQUIRE, owner, kb, now + bound, lease=p.lease, immediate=p.wait == 0)
        try:
            out = await self._exchange(req, self._max_in_flight, False)
        except core.Deadline as e:
            raise errors.Timeout(f"acquire of {key!r}, not sent: {e}") from None
        except core.PoolFull as e:
            raise errors.Busy(f"acquire of {key!r}, not sent: {e}") from None
        if out != core.ACQUIRED:
            err = core.acquire_failure(req, out, self._clock())
            if out == core.LOST and req.abandonable:
                raise type(err)(f"{err}; {self._give_back(kb, req.owner)}")
            raise err
        valid_until, err = core.gate(req, p, self._clock())
        if err is not None:
            raise type(err)(f"{err}; {self._compensate(kb, req.granted)}")
        return AsyncTicket(self, kb, req.granted, p.lease, valid_until)

    @contextlib.asynccontextmanager
    async def lock(self, key, lease=None, wait=0, *, min_work_budget):
        """As Client.lock: `async with client.lock(key, ...) as ticket:`."""
        t = await self.acquire(key, lease, wait, min_work_budget=min_work_budget)
        try:
            yield t
        except BaseException:
            with contextlib.suppress(errors.LockdError):
                await self.release(t)
            raise
        await self.release(t)

    async def release(self, ticket: Ticket):
        """As Client.release."""
        await self.release_token(ticket._key, ticket.token)

    async def release_token(self, key, token: int):
        now = self._clock()
        kb = core.key_bytes(key)
        if token == 0:
            raise errors.NotHeld("token 0 is never issued")
        if self._closing:
            raise errors.Closed("client closed")
        await self._release(kb, token, now + core.IO_DEADLINE)

    async def _release(self, kb, token, deadline):
        req = core.Request(core.RELEASE, self._owners.next(), kb, deadline, token=token)
        try:
            out = await self._exchange(req, self._release_limit, True)
        except errors.LockdError as e:
            raise core.token_call_failure("release", kb, token, req, None, e) from None
        if out in (core.RELEASED, core.NOT_HELD):
            self._watches.end(kb, token)
        if out == core.RELEASED:
            return
        if out == core.NOT_HELD:
            raise errors.NotHeld(f"release of {kb.decode()!r} token {token}")
        raise core.token_call_failure("release", kb, token, req, out, None)

    async def _renew(self, t, lease):
        now = self._clock()
        seconds = core.whole_seconds("lease", lease, 1, core.MAX_LEASE_SECONDS)
        if self._closing:
            raise errors.Closed("client closed")
        req = core.Request(core.KEEP, self._owners.next(), t._key, now + core.IO_DEADLINE,
                           lease=seconds, token=t.token)
        try:
            out = await self._exchange(req, self._release_limit, True)
        except errors.LockdError as e:
            raise core.token_call_failure("renewal", t._key, t.token, req, None, e) from None
        if out == core.ACQUIRED:
            t.lease = seconds
            t.valid_until = core.validity(req.sent_at, 0, seconds)
            self._watches.renew(t._key, t.token, t.valid_until - self._clock())
            return
        if out == core.NOT_HELD:
            t.valid_until = 0.0
            self._watches.end(t._key, t.token)
            raise errors.NotHeld(f"renewal of {t.key!r} token {t.token}")
        raise core.token_call_failure("renewal", t._key, t.token, req, out, None)

    # Compensation.

    def _compensate(self, kb, token):
        if self._enqueue_compensation(core.RELEASE, kb, token):
            self.stats.compensations_queued += 1
            return "its release is queued as compensation"
        self.stats.compensations_dropped += 1
        return "the compensation queue was full: it is left to its lease"

    def _give_back(self, kb, owner):
        if self._enqueue_compensation(core.ABANDON, kb, owner):
            return "whatever the server made of it is being given back (ABANDON)"
        self.stats.abandons_given_up += 1
        return "the compensation queue was full: a grant, if any, is left to its lease"

    def _enqueue_compensation(self, kind, kb, value):
        if self._closing or self._comp is None:
            return False
        try:
            self._comp.put_nowait((kind, kb, value, self._clock() + core.IO_DEADLINE))
            return True
        except asyncio.QueueFull:
            return False

    async def _run_compensations(self):
        while True:
            item = await self._comp.get()
            if item is None:
                return
            kind, kb, value, deadline = item
            if kind == core.ABANDON:
                await self._abandon(kb, value, deadline)
                continue
            try:
                await self._release(kb, value, deadline)
                self.stats.compensations_done += 1
            except errors.NotHeld:
                self.stats.compensations_done += 1
            except errors.LockdError:
                self.stats.compensations_failed += 1

    async def _abandon(self, kb, target, deadline):
        """As Client._abandon."""
        req, out = None, None
        try:
            req = core.Request(core.ABANDON, self._owners.next(), kb, deadline, token=target)
            out = await self._exchange(req, self._release_limit, True)
        except errors.LockdError:
            pass
        if req is not None and req.sent_at:
            self.stats.abandons_sent += 1
        if out == core.RELEASED:
            self.stats.abandons_released += 1
        elif out == core.NOT_HELD:
            self.stats.abandons_not_held += 1
        else:
            self.stats.abandons_given_up += 1

    async def close(self):
        """As Client.close."""
        if self._stopped:
            return
        self._closing = True
        for _ in self._comp_workers:
            await self._comp.put(None)
        for w in self._comp_workers:
            await w
        self._stopped = True
        for slot in self._slots:
            if slot.session is not None:
                slot.session.fail("client closed")
        if self._waits is not None:
            self._waits.close_all()
