"""A session of the asyncio client: an asyncio Protocol over one
authenticated connection. Requests queued in one turn of the loop go out in
one write, their waits computed just before it; answers are correlated by
owner in data_received, each checked against its request's deadline first
(docs/protocol.md §6); a timer keeps the silence rule of §6a.
"""

from __future__ import annotations

import asyncio

from . import _core as core
from . import errors

ENQUEUED, CLOSED, FULL = 0, 1, 2


class Session(asyncio.Protocol):
    def __init__(self, client, addr, pool):
        self.client, self.addr, self.pool = client, addr, pool
        self.decoder = core.Decoder()
        self.transport = None
        self.closed = False
        self.ready = False
        self.handshake_frames: list = []
        self.handshake_event = asyncio.Event()
        self.table: dict[int, core.Request] = {}
        self.queue: list[core.Request] = []
        self.flush_pending = False
        self.serves_abandon = False
        # When the server was last heard, or a request went in flight on
        # an idle session; the PING in flight; the silence watch (§6a).
        self.heard = client._clock()
        self.ping = None
        self.watch = None

    # Protocol callbacks.

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        if self.closed:
            return
        # asyncio runs the callbacks of arrived data before the timers that
        # fell due meanwhile: each answer is checked against its request's
        # deadline here, so that a deadline acts on time (§6).
        now = self.client._clock()
        self.heard = now
        try:
            frames = self.decoder.feed(data)
            if not self.ready:
                self.handshake_frames.extend(frames)
                self.handshake_event.set()
                return
            for f in frames:
                self._deliver(f, now)
        except core.Due:
            self.fail(core.ABANDONED)
        except errors.Protocol as e:
            self.client.stats.protocol_errors += 1
            self.fail(f"session to {self.addr}: {e}")
        except errors.LockdError as e:
            self.fail(f"session to {self.addr}: {e}")

    def connection_lost(self, exc):
        self.handshake_event.set()
        self.fail(f"session to {self.addr}: {exc or 'connection closed by the server'}")

    async def next_handshake_frame(self):
        while not self.handshake_frames:
            if self.closed:
                raise errors.NotConnected(f"handshake with {self.addr}: connection closed")
            self.handshake_event.clear()
            await self.handshake_event.wait()
        if len(self.handshake_frames) > 1:
            raise errors.Protocol(f"handshake with {self.addr}: unexpected frames")
        return self.handshake_frames.pop()

    # Requests.

    def enqueue(self, req, limit):
        if self.closed or req.kind == core.ABANDON and not self.serves_abandon:
            return CLOSED
        if len(self.table) >= limit:
            return FULL
        if not self.table:
            self.heard = self.client._clock()
            if self.watch is None:
                self.watch = asyncio.get_running_loop().call_later(self.client._silence / 3, self._watch)
        req.state = core.QUEUED
        self.table[req.owner] = req
        self.queue.append(req)
        if not self.flush_pending:
            self.flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)
        return ENQUEUED

    def _flush(self):
        self.flush_pending = False
        if self.closed or not self.queue:
            return
        batch, self.queue = self.queue, []
        now = self.client._clock()
        parts = []
        for req in batch:
            if now >= req.deadline:
                req.expired = True
                self._finish(req, core.EXPIRED, None)
                continue
            parts.append(core.encode(req.kind, req.owner, req.key, req.lease,
                                     core.wire_wait(req.immediate, req.deadline, now), req.token))
            req.state = core.SENT
            req.sent_at = now
            req.abandonable = self.serves_abandon
        if parts:
            self.transport.write(b"".join(parts))

    def _finish(self, req, out, cause):
        del self.table[req.owner]
        req.out, req.cause, req.state = out, cause, core.DONE
        if req is self.ping:
            self.ping = None
        if not req.waiter.done():
            req.waiter.set_result(out)

    def _watch(self):
        """The silence rule of §6a while a request is in flight: after a
        third of the silence timeout without a word from the server a PING
        goes out; after all of it the session is closed."""
        self.watch = None
        if self.closed or not self.table:
            return
        silence = self.client._silence
        now = self.client._clock()
        quiet = now - self.heard
        if quiet >= silence:
            self.fail(core.SILENT)
            return
        if self.ping is None and quiet >= silence / 3:
            try:
                ping = core.Request(core.PING, self.client._owners.next(), b"", core.INF, immediate=True)
            except errors.OwnerExhausted as e:
                self.fail(f"session to {self.addr}: {e}")
                return
            ping.waiter = asyncio.get_running_loop().create_future()
            self.ping = ping
            self.enqueue(ping, core.INF)
        at = self.heard + (silence if self.ping is not None else silence / 3)
        self.watch = asyncio.get_running_loop().call_later(max(at - now, 0.001), self._watch)

    def abandon(self, req):
        req.expired = True
        if req.state == core.QUEUED:
            del self.table[req.owner]
            self.queue.remove(req)
            req.state = 0
            return core.EXPIRED
        if req.state == core.SENT:
            del self.table[req.owner]
            req.state, req.cause = 0, core.ABANDONED
            self.fail(core.ABANDONED)
            return core.LOST
        return req.out

    def fail(self, cause):
        if self.closed:
            return
        self.closed = True
        for req in list(self.table.values()):
            self._finish(req, core.UNSENT if req.state == core.QUEUED else core.LOST, cause)
        self.queue.clear()
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        if cause == core.ABANDONED:
            self.client.stats.abandoned_sessions += 1
        elif cause == core.SILENT:
            self.client.stats.silent_sessions += 1
        if self.pool is not None:
            self.pool.died(self)
        if self.transport is not None:
            self.transport.abort()

    def _deliver(self, f, now):
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
