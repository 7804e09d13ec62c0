"""A session of the blocking client: one authenticated connection, written
by the caller that finds its writer idle (every frame queued meanwhile in
one send) and read by one waiting caller for all of them (leader/follower),
answers correlated by owner. It acts on each request's deadline on time
(docs/protocol.md §6) and keeps the silence rule of §6a.
"""

from __future__ import annotations

import _thread
import contextlib
import math
import select
import socket
import ssl
import struct
import threading

from . import _core as core
from . import errors

POLL = 0.05  # how often a stalled send, or a reader, looks at the deadlines
SOCKTIMEO = struct.pack("ll", 0, int(POLL * 1e6))
ENQUEUED, CLOSED, FULL = 0, 1, 2


class Session:
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
        ping = self.ping
        return len(self.table) == (ping is not None and ping.owner in self.table)

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
                return CLOSED
            if len(self.table) >= limit:
                return FULL
            if self._idle():
                self.heard = self.client._clock()
            req.state = core.QUEUED
            self.table[req.owner] = req
            self.queue.append(req)
            if self.writing:
                return ENQUEUED
            self.writing = True
        self._flush(req)
        return ENQUEUED

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
        waiting. A recv gives up after POLL (SO_RCVTIMEO) when a TLS
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
