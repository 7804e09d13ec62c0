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
(docs/protocol.md §6), and alone on it that costs only the one call.
"""

from __future__ import annotations

import _thread
import contextlib
import math
import queue
import select
import socket
import ssl
import struct
import threading
import time

from . import _core as core
from . import errors

_POLL = 0.05  # how often a stalled send, or a reader, looks at the deadlines
_SOCKTIMEO = struct.pack("ll", 0, int(_POLL * 1e6))
_ENQUEUED, _CLOSED, _FULL = 0, 1, 2
_RECONNECT_MIN, _RECONNECT_MAX = 0.05, 2.0


class _Session:
    def __init__(self, client, sock, addr, decoder, pool=None, serves_abandon=False, tls=False):
        self.client, self.sock, self.addr, self.decoder, self.pool = client, sock, addr, decoder, pool
        self.serves_abandon, self.tls = serves_abandon, tls
        self.lock = threading.Lock()
        self.closed = False
        self.writing = False
        self.table: dict[int, core.Request] = {}
        self.queue: list[core.Request] = []
        # Leader/follower reading: no thread of its own reads the session.
        # One caller waiting for an answer reads (the leader) and hands
        # every answer to its caller; the others park on their waiters.
        # A leader whose own answer came promotes a parked caller.
        self.reading = False
        self.parked: dict[int, core.Request] = {}
        self.rbuf = bytearray(64 << 10)
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        # When the server was last heard, or a request went in flight on
        # an idle session; the PING in flight, if any (§6a).
        self.heard = client._clock()
        self.ping = None

    def _idle(self):
        # self.lock is held. No request in flight but perhaps a PING whose
        # caller left: nobody reads the session meanwhile.
        return len(self.table) == (self.ping is not None)

    def enqueue(self, req, limit):
        with self.lock:
            if self._idle() and not self.reading and not self.closed:
                # Idle, nobody has read it for a while: a server that
                # closed it, or said why before closing, must be found now,
                # while the request is certainly unsent.
                self.reading = True
                idle = True
            else:
                idle = False
        if idle:
            self._check_idle()
        with self.lock:
            if self.closed or req.kind == core.ABANDON and not self.serves_abandon:
                return _CLOSED
            if len(self.table) >= limit:
                return _FULL
            if self._idle():
                self.heard = self.client._clock()
            req.state = core.QUEUED
            self.table[req.owner] = req
            self.queue.append(req)
            if self.writing:
                return _ENQUEUED
            self.writing = True
        self._flush(req)
        return _ENQUEUED

    def _flush(self, own):
        """Sends what is queued until the queue is empty, or until the
        deadline of own (the writer's request) comes: the writer then hands
        the role to the caller of the next queued request, so that its own
        call ends on time. Each frame's wait is computed here, just before
        the send."""
        clock = self.client._clock
        while True:
            with self.lock:
                if self.closed or not self.queue:
                    self.writing = False
                    return
                now = clock()
                if now >= own.deadline:
                    self.writing = False
                    self._wake(self.queue[0])
                    return
                batch, self.queue = self.queue, []
                parts, jobs, pos = [], [], 0
                for req in batch:
                    if now >= req.deadline:
                        req.expired = True
                        self._finish(req, core.EXPIRED, None)
                        continue
                    frame = core.encode(req.kind, req.owner, req.key, req.lease,
                                        core.wire_wait(req.immediate, req.deadline, now), req.token)
                    jobs.append((pos, req))
                    pos += len(frame)
                    parts.append(frame)
                    req.state = core.SENT
                    req.sent_at = now
                    req.abandonable = self.serves_abandon
            if parts and not self._send(b"".join(parts), jobs):
                return

    def _send(self, data, jobs):
        view, sent = memoryview(data), 0
        while sent < len(data):
            try:
                sent += self.sock.send(view[sent:])
            except (TimeoutError, BlockingIOError, ssl.SSLWantWriteError):
                # A stalled transport: a frame whose deadline passed may have
                # left (this batch's or an earlier one's), so the session
                # closes (§6); every caller waiting on another frame is
                # woken by that.
                now = self.client._clock()
                with self.lock:
                    due = any(req.state == core.SENT and now >= req.deadline for req in self.table.values())
                if due:
                    self.fail(core.ABANDONED)
                    return False
            except OSError as e:
                self._write_failed(sent, jobs, e)
                return False
        return True

    def _write_failed(self, sent, jobs, err):
        """Frames starting at or after the bytes that got out certainly never
        left: they end unsent, the others lost."""
        cause = f"write to {self.addr}: {err}"
        with self.lock:
            for offset, req in jobs:
                if offset >= sent and req.state == core.SENT and self.table.get(req.owner) is req:
                    self._finish(req, core.UNSENT, cause)
        self.fail(cause)

    def _finish(self, req, out, cause):
        # self.lock is held.
        del self.table[req.owner]
        req.out, req.cause, req.state = out, cause, core.DONE
        if req is self.ping:
            self.ping = None
        self._wake(req)

    @staticmethod
    def _wake(req):
        # self.lock is held. One pending wake at most: the caller re-checks
        # its state after every wake, under the lock.
        if not req.woken:
            req.woken = True
            req.waiter.release()

    def _check_idle(self):
        """self.reading is ours: reads what an idle session holds, if
        anything, without waiting."""
        try:
            if self._readable(0):
                self._read_once(self.client._clock())
        except (OSError, ValueError, errors.LockdError) as e:
            self._failed(e)
        finally:
            with self.lock:
                self.reading = False
                self._pass_reading()

    def _pass_reading(self):
        # self.lock is held and nobody reads: a parked caller takes over.
        if self.parked and not self.reading:
            _, req = self.parked.popitem()
            self._wake(req)

    def wait(self, req, clock):
        """Waits for req's answer until its deadline, reading the session
        when nobody else does, and writing it when req is still queued and
        nobody else does. Returns the outcome, or None at the deadline."""
        while True:
            with self.lock:
                if req.woken:
                    req.waiter.acquire()
                    req.woken = False
                if req.state == core.DONE:
                    return req.out
                if clock() >= req.deadline:
                    return None
                if req.state == core.QUEUED and not self.writing and not self.closed:
                    self.writing = True
                    role = "write"
                elif not self.reading:
                    self.reading = True
                    role = "lead"
                else:
                    self.parked[req.owner] = req
                    role = "park"
            if role == "write":
                self._flush(req)
                continue
            if role == "lead":
                self._lead(req, clock)
                continue
            left = req.deadline - clock()
            got = left > 0 and req.waiter.acquire(True, left)
            with self.lock:
                self.parked.pop(req.owner, None)
                if got:
                    req.woken = False
                    continue
                if req.state == core.DONE:
                    continue
                self._pass_reading()
            return None

    def _lead(self, req, clock):
        """Reads and delivers until req is answered, its deadline comes, or
        it is still queued and the writer's role is free. Data that is
        found only once the deadline has come is left unread: the
        deadline acts first (§6)."""
        try:
            while req.state != core.DONE:
                if req.state == core.QUEUED and not self.writing:
                    return
                now = clock()
                if now >= req.deadline:
                    return
                wake = self._watch(now)
                if self._readable(min(req.deadline, wake) - now):
                    now = clock()
                    if now >= req.deadline:
                        return
                    self._read_once(now)
        except (OSError, ValueError, errors.LockdError) as e:
            self._failed(e)
        finally:
            with self.lock:
                self.reading = False
                self._pass_reading()

    def _readable(self, timeout):
        if self.tls and self.sock.pending():
            return True
        return bool(self.poller.poll(max(math.ceil(timeout * 1000), 0)))

    def _watch(self, now):
        """The silence rule of §6a for a session with a request in flight:
        after a third of the silence timeout without a word from the
        server a PING goes out; after all of it the session is closed.
        Returns when to look again."""
        silence = self.client._silence
        with self.lock:
            quiet = now - self.heard
            if quiet >= silence:
                raise core.Silent(f"nothing heard from {self.addr} for {quiet:.3f} s")
            if self.ping is not None or quiet < silence / 3 or self.closed:
                return self.heard + (silence if self.ping is not None else silence / 3)
            ping = self.ping = core.Request(core.PING, self.client._owners.next(), b"", core.INF, immediate=True)
            ping.waiter = _thread.allocate_lock()
            ping.waiter.acquire()
        self.enqueue(ping, core.INF)
        return self.heard + silence

    def _read_once(self, now):
        """One recv, its answers delivered; `now` is when the data was found
        waiting. A recv gives up after _POLL (SO_RCVTIMEO) when a TLS
        record is incomplete."""
        try:
            n = self.sock.recv_into(self.rbuf)
        except (BlockingIOError, TimeoutError, ssl.SSLWantReadError):
            return
        if n == 0:
            raise ConnectionError("connection closed by the server")
        self.heard = now
        frames = self.decoder.feed(memoryview(self.rbuf)[:n])
        with self.lock:
            if self.closed:
                return
            for f in frames:
                self._deliver(f, now)

    def _failed(self, e):
        """Closes the session after a read or the silence rule failed it."""
        if isinstance(e, core.Due):
            self.fail(core.ABANDONED)
        elif isinstance(e, core.Silent):
            self.fail(core.SILENT)
        else:
            if isinstance(e, errors.Protocol):
                self.client.stats.protocol_errors += 1
            self.fail(f"session to {self.addr}: {e}")

    def abandon(self, req):
        """The caller's move at its deadline. A request still queued is
        withdrawn, certainly unsent; one the writer took may have left, so
        the session is closed, under the same hold of the lock that takes
        the request out, so that no answer can come between the two; one
        answered meanwhile keeps its answer."""
        with self.lock:
            req.expired = True
            if req.state == core.QUEUED:
                del self.table[req.owner]
                self.queue.remove(req)
                req.state = 0
                return core.EXPIRED
            if req.state != core.SENT:
                return req.out
            self._close_locked(core.ABANDONED)
        self._teardown(core.ABANDONED)
        return core.LOST

    def fail(self, cause):
        with self.lock:
            if self.closed:
                return
            self._close_locked(cause)
        self._teardown(cause)

    def _close_locked(self, cause):
        # self.lock is held.
        self.closed = True
        for req in list(self.table.values()):
            self._finish(req, core.UNSENT if req.state == core.QUEUED else core.LOST, cause)
        self.queue.clear()

    def _teardown(self, cause):
        if cause == core.ABANDONED:
            self.client.stats.abandoned_sessions += 1
        elif cause == core.SILENT:
            self.client.stats.silent_sessions += 1
        if self.pool is not None:
            self.pool.died(self)
        with contextlib.suppress(OSError, ValueError, KeyError):
            self.poller.unregister(self.sock)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    def _deliver(self, f, now):
        """Correlates one answer by owner; self.lock is held. An answer that
        matches no request breaks the correlation every answer relies on.
        An answer for a request whose deadline had come by `now` is not
        taken: the session closes as that deadline says (§6)."""
        out = core.OUTCOME_OF_OP.get(f.op)
        if out is None:
            raise errors.Protocol(f"unexpected {f.op!r} frame from {self.addr}")
        core.check_text(f)
        if out == core.ACQUIRED and f.token == 0:
            raise errors.Protocol(f"ACQUIRED with token 0 from {self.addr}")
        if out == core.REJECTED and f.owner == 0:
            raise core.refusal(f.text.decode("ascii", "replace"), f"server {self.addr}")
        req = self.table.get(f.owner)
        if req is None or req.state != core.SENT or not core.answers(req.kind, out):
            raise errors.Protocol(f"{f.op!r} for owner {f.owner}, which has no matching request in flight on {self.addr}")
        if now >= req.deadline:
            raise core.Due(f"{f.op!r} for owner {f.owner} arrived after its deadline")
        if req.kind == core.KEEP and out == core.ACQUIRED and f.token != req.token:
            raise errors.Protocol(f"KEEP of token {req.token} answered with token {f.token} by {self.addr}")
        req.granted, req.waited_ms = f.token, f.waited_ms
        if out == core.REJECTED:
            req.reason = f.text.decode("ascii", "replace")
        self._finish(req, out, None)
        if out == core.REJECTED and req.reason in core.CLOSING_REASONS:
            raise errors.LockdError(f"server {self.addr} closes the session: {req.reason}")


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
        self.idle: list[_Session] = []
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


class Ticket:
    """A held lock: key, fencing token, and validity on the monotonic clock
    (time.monotonic()). Pass token to everything the critical section writes
    to, so that a write carrying an older token can be refused."""

    def __init__(self, client, key: bytes, token: int, lease: int, valid_until: float):
        self._client, self._key, self.token, self.lease, self.valid_until = client, key, token, lease, valid_until

    @property
    def key(self) -> str:
        return self._key.decode()

    def remaining(self) -> float:
        """Seconds of validity left, never negative."""
        return max(self.valid_until - self._client._clock(), 0.0)

    def lost(self) -> threading.Event:
        """An Event set when the validity ends: at valid_until (moved by each
        confirmed renewal), or earlier when a release or renewal is answered
        NOT HELD, or a release RELEASED."""
        return self._client._watches.lost(self)

    def renew(self, lease=None):
        """Sends KEEP: the lease becomes `lease` (default: the current one)
        from now. Only an answered ACQUIRED moves valid_until, to the KEEP's
        send instant + lease - drift margin; NotHeld ends the validity; any
        other error (Indeterminate above all) leaves it as it was. 5 s from
        the call, retries included."""
        self._client._renew(self, self.lease if lease is None else lease)

    def keep_alive(self, interval, stop: threading.Event):
        """Renews every `interval` seconds until `stop` is set, then returns.
        Raises when the lock is lost: NotHeld at once, or the first failed
        renewal's error when the validity ran out before one was confirmed."""
        if core.to_ns("interval", interval) <= 0:
            raise errors.UnsupportedDuration(f"keep-alive interval {interval!r}")
        interval = core.to_ns("interval", interval) / 1e9
        failed = None
        while True:
            wait = min(interval, self.remaining()) if failed else interval
            if stop.wait(wait):
                return
            if failed and self.remaining() == 0:
                raise errors.NotHeld(f"the lease of {self.key!r} lapsed without a confirmed renewal: {failed}") from failed
            try:
                self.renew()
                failed = None
            except errors.NotHeld:
                raise
            except errors.LockdError as e:
                failed = failed or e

    def __repr__(self):
        return f"Ticket(key={self.key!r}, token={self.token}, remaining={self.remaining():.3f})"


class _Watches:
    def __init__(self, client):
        self.client = client
        self.lock = threading.Lock()
        self.by_grant: dict[tuple[bytes, int], list] = {}

    def lost(self, t):
        k = (t._key, t.token)
        with self.lock:
            w = self.by_grant.get(k)
            if w:
                return w[0]
            ev = threading.Event()
            left = t.valid_until - self.client._clock()
            if left <= 0:
                ev.set()
                return ev
            w = [ev, None]
            self.by_grant[k] = w
            self._arm(k, w, left)
            return ev

    def _arm(self, k, w, left):
        timer = threading.Timer(left, self.end, k)
        timer.daemon = True
        w[1] = timer
        timer.start()

    def renew(self, key, token, left):
        with self.lock:
            w = self.by_grant.get((key, token))
            if w:
                w[1].cancel()
                self._arm((key, token), w, left)

    def end(self, key, token):
        with self.lock:
            w = self.by_grant.pop((key, token), None)
        if w:
            w[1].cancel()
            w[0].set()


class Client:
    """A pool of sessions to lockd; safe for use by many threads.

    addrs: "host:port" or a list of them; tenant and secret (bytes, or the
    auth file's hex) authenticate with HMAC HELLO; tls: an ssl.SSLContext
    (or True for the default one) for the server's TLS port.
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
        self._client_id = core.new_client_id()
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
                sock.sendall(core.session_frame(owner, self._client_id))
                core.session_answer(self._read_frame(sock, decoder, addr, left), owner)
            # Blocking from here, but a send or a recv gives up its turn
            # after _POLL (SO_SNDTIMEO, SO_RCVTIMEO) to look at deadlines.
            sock.settimeout(None)
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _SOCKTIMEO)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _SOCKTIMEO)
            return _Session(self, sock, addr, decoder, pool, hs.serves_abandon, self._tls is not None)
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
                if r == _ENQUEUED:
                    return s
                if r == _FULL:
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
            if s.enqueue(req, 1) == _ENQUEUED:
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
        (errors.Indeterminate) or certainly is not."""
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
