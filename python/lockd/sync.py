"""The blocking client: threads and sockets around the protocol core.

Sessions are authenticated connections. Shared sessions (one per address by
default) carry releases, renewals and acquires with wait 0, pipelined: the
caller that finds a session's writer idle becomes its writer and sends every
frame queued meanwhile in one send, and one caller waiting for an answer
reads for all of them (leader/follower), correlating answers by owner and
waking their callers. No thread of the client's own sits between a caller
and its answer: with the GIL, every such hand-off costs context switches.
Waiting acquires (wait > 0) each get a session of their own from the wait
pool, because one that waits its whole time ends with its session closed
(docs/protocol.md §6), and alone on it that costs only the one call. The
session itself is in _session.py; this module picks, dials and retries.
"""

from __future__ import annotations

import _thread
import contextlib
import queue
import socket
import ssl
import threading
import time

from . import _core as core
from . import errors
from ._session import ENQUEUED, FULL, SOCKTIMEO, Session
from .ticket import Ticket, _Watches

_RECONNECT_MIN, _RECONNECT_MAX = 0.05, 2.0


class _Slot:
    def __init__(self, next_addr):
        self.session = None
        self.next_addr = next_addr
        self.dialing = threading.Lock()
        self.retry_at = 0.0
        self.delay = _RECONNECT_MIN


class _WaitPool:
    """Sessions that carry one waiting acquire each; closed ones are replaced
    on demand, at most `limit` open; a caller that finds none waits in the
    client, certainly unsent, until one is free or its deadline comes."""

    def __init__(self, client, limit):
        self.client, self.limit = client, limit
        self.cond = threading.Condition()
        self.idle: list[Session] = []
        self.open = 0
        self.next_addr = 0

    def take(self, req):
        clock = self.client._clock
        with self.cond:
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
                self.cond.wait(left)
        try:
            return self.client._dial_any(req, self)
        except BaseException:
            with self.cond:
                self.open -= 1
                self.cond.notify()
            raise

    def put(self, s):
        with self.cond:
            if not s.closed:
                self.idle.append(s)
                self.cond.notify()

    def died(self, s):
        with self.cond:
            if s in self.idle:
                self.idle.remove(s)
            self.open -= 1
            self.cond.notify()

    def close_all(self):
        with self.cond:
            idle, self.idle = self.idle, []
        for s in idle:
            s.fail("client closed")

class Client:
    """A pool of sessions to lockd; safe for use by many threads.

    addrs: "host:port" or a list of them; tenant and secret (bytes, or the
    auth file's hex) authenticate with HMAC HELLO; tls: an ssl.SSLContext
    (or True for the default one) for the server's TLS port.
    compensation_queue bounds the compensating releases and ABANDONs
    waiting to be sent; silence_timeout closes a session that hears
    nothing for that long while a request is in flight (docs/protocol.md
    §6a); for these and dial_timeout, 0 means the default and a negative
    value is errors.Config, as in the Go client.
    """

    def __init__(self, addrs, tenant=None, secret=None, tls=None, *, sessions=None,
                 max_in_flight=4096, wait_sessions=64, dial_timeout=5.0,
                 compensation_queue=256, silence_timeout=core.DEFAULT_SILENCE_TIMEOUT, dialer=None,
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
        self._dialer = dialer
        compensation_queue, self._silence, self._dial_timeout = core.check_options(
            compensation_queue, silence_timeout, dial_timeout)
        self._client_id = core.ClientID()
        self._clock = _clock
        self._owners = core.Owners(_first_owner)
        self._max_in_flight = max_in_flight
        self._release_limit = max_in_flight + max(max_in_flight // 4, 1)
        self.stats = core.Stats()
        self._watches = _Watches(self)
        self._closing = False  # refuses new calls
        self._stopped = False  # refuses every send, once compensations are done
        self._rr = 0
        n = sessions or len(self.addrs)
        self._slots = [_Slot(i % len(self.addrs)) for i in range(n)]
        self._waits = _WaitPool(self, wait_sessions)
        self._comp = queue.Queue(compensation_queue)
        errs = []
        for slot in self._slots:
            try:
                slot.session = self._dial_slot(slot, self._clock() + self._dial_timeout, tries=len(self.addrs))
            except (errors.Auth, errors.TLS):
                self.close()
                raise
            except errors.LockdError as e:
                errs.append(e)
        if all(slot.session is None for slot in self._slots):
            self.close()
            raise errors.NotConnected("; ".join(map(str, errs)))
        self._comp_workers = [threading.Thread(target=self._run_compensations, daemon=True,
                                               name="lockd-compensation") for _ in range(2)]
        for w in self._comp_workers:
            w.start()

    # Connecting.

    def _connect(self, addr, deadline, pool):
        """A new session to addr, ready for requests: dialled, TLS, the
        handshake and SESSION (§6a) where the server serves it, all within
        one bound, the dial timeout or the caller's deadline, whichever
        comes first. A caller's deadline that cuts the dial short is
        core.Deadline: nothing of its request was sent."""
        clock = self._clock
        bound = min(clock() + self._dial_timeout, deadline)

        def left():
            t = bound - clock()
            if t <= 0:
                raise TimeoutError("the dial ran out of time")
            return t

        host, port = core.split_addr(addr)
        sock = None
        try:
            t = left()
            sock = self._dialer(addr, t) if self._dialer else socket.create_connection((host, port), t)
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock.settimeout(left())
                try:
                    sock = self._tls.wrap_socket(sock, server_hostname=host)
                except ssl.SSLError as e:
                    raise errors.TLS(f"TLS handshake with {addr}: {e}") from None
            decoder = core.Decoder()
            hs = core.Handshake(self._tenant, self._secret)
            hello = hs.greeting(self._read_frame(sock, decoder, addr, left))
            if hello is not None:
                sock.settimeout(left())
                sock.sendall(hello)
                hs.welcome(self._read_frame(sock, decoder, addr, left))
            if hs.serves_abandon:
                owner = self._owners.next()
                sock.settimeout(left())
                sock.sendall(self._client_id.session_frame(owner))
                core.session_answer(self._read_frame(sock, decoder, addr, left), owner)
            # Blocking from here, but a send or a recv gives up its turn
            # after POLL (SO_SNDTIMEO, SO_RCVTIMEO) to look at deadlines.
            sock.settimeout(None)
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, SOCKTIMEO)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, SOCKTIMEO)
            return Session(self, sock, addr, decoder, pool, hs.serves_abandon, self._tls is not None)
        except BaseException as e:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
            if isinstance(e, errors.LockdError):
                raise
            if isinstance(e, OSError):
                if clock() >= deadline:
                    raise core.Deadline(f"the deadline came while connecting to {addr}") from None
                raise errors.NotConnected(f"connect to {addr}: {e}") from None
            raise

    @staticmethod
    def _read_frame(sock, decoder, addr, left):
        while True:
            sock.settimeout(left())
            data = sock.recv(4096)
            if not data:
                raise errors.NotConnected(f"handshake with {addr}: connection closed")
            frames = decoder.feed(data)
            if len(frames) > 1:
                raise errors.Protocol(f"handshake with {addr}: unexpected frames")
            if frames:
                return frames[0]

    def _dial_slot(self, slot, deadline, tries=1):
        errs = []
        for _ in range(tries):
            addr = self.addrs[slot.next_addr]
            try:
                return self._connect(addr, deadline, None)
            except (errors.Auth, errors.TLS, core.Deadline):
                raise
            except errors.LockdError as e:
                errs.append(e)
                slot.next_addr = (slot.next_addr + 1) % len(self.addrs)
        raise errors.NotConnected("; ".join(map(str, errs)))

    def _dial_any(self, req, pool):
        """A new wait session, through the addresses in turn, within req's
        deadline; its errors mean req was never sent."""
        errs = []
        for _ in range(len(self.addrs)):
            addr = self.addrs[pool.next_addr]
            try:
                s = self._connect(addr, req.deadline, pool)
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

    def _slot_session(self, slot, deadline):
        s = slot.session
        if s is not None and not s.closed:
            return s
        now = self._clock()
        if now < slot.retry_at or not slot.dialing.acquire(blocking=False):
            return None
        try:
            s = slot.session
            if s is not None and not s.closed:
                return s
            try:
                s = self._dial_slot(slot, min(deadline, now + self._dial_timeout))
            except (errors.NotConnected, core.Deadline):
                slot.retry_at = self._clock() + slot.delay
                slot.delay = min(2 * slot.delay, _RECONNECT_MAX)
                return None
            slot.delay = _RECONNECT_MIN
            slot.session = s
            self.stats.reconnects += 1
            return s
        finally:
            slot.dialing.release()

    # Sending.

    def _pick(self, req, limit):
        """Enqueues req on a shared session, round-robin, waiting in the
        client — certainly unsent — while none is ready."""
        n = len(self._slots)
        while True:
            if self._stopped:
                raise errors.Closed("client closed")
            self._rr += 1
            start, full = self._rr, False
            for i in range(n):
                s = self._slot_session(self._slots[(start + i) % n], req.deadline)
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
            time.sleep(min(left, _RECONNECT_MIN))

    def _pick_wait(self, req):
        while True:
            s = self._waits.take(req)
            if s.enqueue(req, 1) == ENQUEUED:
                return s

    def _await(self, s, req):
        out = s.wait(req, self._clock)
        return s.abandon(req) if out is None else out

    def _exchange(self, req, limit, retry_sent):
        """Runs req until it has an outcome no retry may change (§6)."""
        req.waiter = _thread.allocate_lock()
        req.waiter.acquire()
        waiting = req.kind == core.ACQUIRE and not req.immediate
        backoff = core.RELEASE_BACKOFF_MIN
        out = None
        for _ in range(core.MAX_ATTEMPTS):
            try:
                s = self._pick_wait(req) if waiting else self._pick(req, limit)
            except core.PoolFull:
                if retry_sent and self._pause(req, backoff):
                    backoff = min(2 * backoff, core.RELEASE_BACKOFF_MAX)
                    continue
                raise
            out = self._await(s, req)
            if waiting:
                self._waits.put(s)
            step = core.next_step(req, out, retry_sent)
            if step == core.DONE_:
                return out
            core.reset_for_retry(req)
            if step == core.PAUSE:
                if not self._pause(req, backoff):
                    return out
                backoff = min(2 * backoff, core.RELEASE_BACKOFF_MAX)
        if out == core.UNSENT:
            raise errors.NotConnected("every attempt failed before a byte left")
        return out

    def _pause(self, req, backoff):
        """Waits out backoff in the client; False when the deadline comes
        first."""
        left = req.deadline - self._clock()
        if left > 0:
            time.sleep(min(backoff, left))
        return self._clock() < req.deadline

    # The API.

    def acquire(self, key, lease=None, wait=0, *, min_work_budget) -> Ticket:
        """Takes the lock on key. lease (default 30 s), wait (default 0: one
        immediate attempt) and min_work_budget (required: the time you need
        once you hold the lock) are seconds or timedeltas, rounded up.
        Returns a Ticket; every exception says whether the lock may be held
        (errors.Indeterminate) or certainly is not. An Indeterminate whose
        session closed is given back with an ABANDON where the server
        serves it (docs/protocol.md §6a); the result stays Indeterminate.
        For a lock object that answers True or False, see lockd.Lock."""
        now = self._clock()
        kb = core.key_bytes(key)
        p = core.acquire_params(lease, wait, min_work_budget)
        if self._closing:
            raise errors.Closed("client closed")
        owner = self._owners.next()
        bound = p.wait if p.wait else core.IO_DEADLINE
        req = core.Request(core.ACQUIRE, owner, kb, now + bound, lease=p.lease, immediate=p.wait == 0)
        try:
            out = self._exchange(req, self._max_in_flight, False)
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
        return Ticket(self, kb, req.granted, p.lease, valid_until)

    @contextlib.contextmanager
    def lock(self, key, lease=None, wait=0, *, min_work_budget):
        """`with client.lock(key, ...) as ticket:` acquires, and releases
        at the end. When the body raised, its exception wins; otherwise a
        release that finds the lock gone raises (NotHeld, Indeterminate), so
        the body's writes are known to have run under a lock that may have
        lapsed."""
        t = self.acquire(key, lease, wait, min_work_budget=min_work_budget)
        try:
            yield t
        except BaseException:
            with contextlib.suppress(errors.LockdError):
                self.release(t)
            raise
        self.release(t)

    def release(self, ticket: Ticket):
        """Releases the lock: None means RELEASED; NotHeld means it was
        already gone; Indeterminate means no answer came within 5 s
        (retries included), and the lock may be held until its lease ends."""
        self.release_token(ticket._key, ticket.token)

    def release_token(self, key, token: int):
        now = self._clock()
        kb = core.key_bytes(key)
        if token == 0:
            raise errors.NotHeld("token 0 is never issued")
        if self._closing:
            raise errors.Closed("client closed")
        self._release(kb, token, now + core.IO_DEADLINE)

    def _release(self, kb, token, deadline):
        req = core.Request(core.RELEASE, self._owners.next(), kb, deadline, token=token)
        try:
            out = self._exchange(req, self._release_limit, True)
        except errors.LockdError as e:
            raise core.token_call_failure("release", kb, token, req, None, e) from None
        if out in (core.RELEASED, core.NOT_HELD):
            self._watches.end(kb, token)
        if out == core.RELEASED:
            return
        if out == core.NOT_HELD:
            raise errors.NotHeld(f"release of {kb.decode()!r} token {token}")
        raise core.token_call_failure("release", kb, token, req, out, None)

    def _renew(self, t: Ticket, lease):
        now = self._clock()
        seconds = core.whole_seconds("lease", lease, 1, core.MAX_LEASE_SECONDS)
        if self._closing:
            raise errors.Closed("client closed")
        req = core.Request(core.KEEP, self._owners.next(), t._key, now + core.IO_DEADLINE,
                           lease=seconds, token=t.token)
        try:
            out = self._exchange(req, self._release_limit, True)
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
        """Queues the release of a grant the caller will never see; when
        the bounded queue is full the lock is left to its lease."""
        if self._enqueue_compensation(core.RELEASE, kb, token):
            self.stats.compensations_queued += 1
            return "its release is queued as compensation"
        self.stats.compensations_dropped += 1
        return "the compensation queue was full: it is left to its lease"

    def _give_back(self, kb, owner):
        """Queues the ABANDON of an acquire that ended Indeterminate with its
        session closed (§6a), through the same bounded queue."""
        if self._enqueue_compensation(core.ABANDON, kb, owner):
            return "whatever the server made of it is being given back (ABANDON)"
        self.stats.abandons_given_up += 1
        return "the compensation queue was full: a grant, if any, is left to its lease"

    def _enqueue_compensation(self, kind, kb, value):
        if self._closing:
            return False
        try:
            self._comp.put_nowait((kind, kb, value, self._clock() + core.IO_DEADLINE))
            return True
        except queue.Full:
            return False

    def _run_compensations(self):
        while True:
            item = self._comp.get()
            if item is None:
                return
            kind, kb, value, deadline = item
            if kind == core.ABANDON:
                self._abandon(kb, value, deadline)
                continue
            try:
                self._release(kb, value, deadline)
                self.stats.compensations_done += 1
            except errors.NotHeld:
                self.stats.compensations_done += 1
            except errors.LockdError:
                self.stats.compensations_failed += 1

    def _abandon(self, kb, target, deadline):
        """Sends one ABANDON, retried on other sessions until its 5 s from
        enqueue are spent; RELEASED and NOT HELD both end it."""
        req, out = None, None
        try:
            req = core.Request(core.ABANDON, self._owners.next(), kb, deadline, token=target)
            out = self._exchange(req, self._release_limit, True)
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

    def close(self):
        """Sends the queued compensating releases (each within its own 5 s),
        then closes every session."""
        if self._stopped:
            return
        self._closing = True
        workers = getattr(self, "_comp_workers", [])
        for _ in workers:
            self._comp.put(None)
        for w in workers:
            w.join()
        self._stopped = True
        for slot in self._slots:
            if slot.session is not None:
                slot.session.fail("client closed")
        self._waits.close_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
