"""Ticket, a held lock, and the watches behind Ticket.lost() of the
blocking client."""

from __future__ import annotations

import threading

from . import _core as core
from . import errors


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
