"""Lock and AsyncLock: a reusable lock object on one key, in the style of
threading.Lock and redis-py's Lock, over a Client or an AsyncClient.

acquire() answers True or False only where the protocol is definite: True
with a grant in hand, False for a definitive non-acquisition (TIMEOUT, or
the deadline came before the request was sent). An outcome the client
cannot know is never turned into False: it raises lockd.Indeterminate, and
a wait that runs out on a held key raises lockd.WaitElapsed (an
Indeterminate and a TimeoutError), as docs/protocol.md §6 requires.
"""

from __future__ import annotations

import asyncio
import threading

from . import _core as core
from . import errors


def _wait_of(blocking, timeout, default):
    """The acquire's wait in seconds: 0 for blocking=False; otherwise
    timeout, where None or -1 (threading's "no timeout") mean the lock's
    blocking_timeout."""
    if not blocking:
        if timeout not in (None, -1):
            raise ValueError("a timeout needs blocking=True")
        return 0
    return default if timeout in (None, -1) else timeout


class _Base:
    def __init__(self, client, key, *, lease, blocking_timeout, min_work_budget, keep_alive):
        core.key_bytes(key)
        core.acquire_params(lease, blocking_timeout, min_work_budget)
        if keep_alive is not None and core.to_ns("keep_alive", keep_alive) <= 0:
            raise errors.UnsupportedDuration(f"keep_alive {keep_alive!r} is not a positive interval")
        self.client, self.key = client, key
        self.lease, self.blocking_timeout = lease, blocking_timeout
        self.min_work_budget, self.keep_alive = min_work_budget, keep_alive
        self.ticket = None
        # The error that ended the keep-alive, if it ended by itself.
        self.keep_alive_error = None

    @property
    def token(self):
        """The fencing token of the grant held, or None."""
        return None if self.ticket is None else self.ticket.token

    def locked(self) -> bool:
        """True while this object holds a grant with validity left, as the
        client knows it (no round trip): a lease renewed or lapsed on the
        server shows only through extend() and the keep-alive."""
        return self.ticket is not None and self.ticket.remaining() > 0

    def _check_free(self):
        if self.locked():
            raise RuntimeError(f"this Lock already holds {self.key!r}; it is not reentrant")

    def _held(self):
        if self.ticket is None:
            raise RuntimeError(f"this Lock does not hold {self.key!r}")
        return self.ticket


class Lock(_Base):
    """A reusable lock on `key` over a lockd.Client:

        lock = lockd.Lock(client, "invoice/42", min_work_budget=2)
        with lock:                    # waits up to blocking_timeout
            write(..., fence=lock.token)
        if lock.acquire(blocking=False):
            try: ...
            finally: lock.release()

    lease (default 30 s), blocking_timeout (the wait of a blocking
    acquire, default 255 s: lockd has no endless wait) and min_work_budget
    (required) are as for Client.acquire. keep_alive, if given, is an
    interval in seconds: while held, the lease is renewed that often on a
    thread of its own. One Lock object holds one grant at a time: give each
    competing thread its own Lock over the shared Client."""

    def __init__(self, client, key, *, lease=None, blocking_timeout=core.MAX_WAIT_SECONDS,
                 min_work_budget, keep_alive=None):
        super().__init__(client, key, lease=lease, blocking_timeout=blocking_timeout,
                         min_work_budget=min_work_budget, keep_alive=keep_alive)
        self._stop = None
        self._keeper = None

    def acquire(self, blocking=True, timeout=None) -> bool:
        """Takes the lock: True when granted; False when the server answered
        TIMEOUT or the deadline came before the request was sent (the lock
        is certainly not held). blocking=False is one immediate attempt.
        Everything else raises: Busy (admission refused), WaitElapsed (the
        wait ran out after the request may have reached the server), other
        Indeterminate outcomes, and input errors."""
        self._check_free()
        wait = _wait_of(blocking, timeout, self.blocking_timeout)
        try:
            self.ticket = self.client.acquire(self.key, self.lease, wait, min_work_budget=self.min_work_budget)
        except errors.Timeout:  # definite: WaitElapsed, an Indeterminate, is no Timeout
            return False
        if self.keep_alive is not None:
            self._start_keep_alive()
        return True

    def _start_keep_alive(self):
        stop, ticket = threading.Event(), self.ticket
        self.keep_alive_error = None

        def run():
            try:
                ticket.keep_alive(self.keep_alive, stop)
            except errors.LockdError as e:
                self.keep_alive_error = e
        self._stop = stop
        self._keeper = threading.Thread(target=run, daemon=True, name="lockd-keep-alive")
        self._keeper.start()

    def _stop_keep_alive(self):
        if self._keeper is not None:
            self._stop.set()
            self._keeper.join()
            self._keeper = self._stop = None

    def release(self):
        """Releases the grant held. Raises RuntimeError when none is held,
        and as Client.release otherwise (NotHeld: it was already gone;
        Indeterminate: no answer within 5 s). Either way this object holds
        nothing afterwards."""
        ticket = self._held()
        self._stop_keep_alive()
        self.ticket = None
        self.client.release(ticket)

    def extend(self, lease=None):
        """Renews the lease now (KEEP): the lease becomes `lease` (default:
        the current one) from now; as Ticket.renew."""
        self._held().renew(lease)

    def __enter__(self):
        if not self.acquire():
            raise errors.Timeout(f"{self.key!r} was not acquired: TIMEOUT")
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except errors.LockdError:
            pass  # the body's exception wins

    def __repr__(self):
        return f"Lock(key={self.key!r}, locked={self.locked()}, token={self.token})"


class AsyncLock(_Base):
    """As Lock, over a lockd.AsyncClient: `await lock.acquire(...)`,
    `await lock.release()`, `await lock.extend()`, `async with lock:`; the
    keep-alive runs as a task."""

    def __init__(self, client, key, *, lease=None, blocking_timeout=core.MAX_WAIT_SECONDS,
                 min_work_budget, keep_alive=None):
        super().__init__(client, key, lease=lease, blocking_timeout=blocking_timeout,
                         min_work_budget=min_work_budget, keep_alive=keep_alive)
        self._keeper = None

    async def acquire(self, blocking=True, timeout=None) -> bool:
        """As Lock.acquire."""
        self._check_free()
        wait = _wait_of(blocking, timeout, self.blocking_timeout)
        try:
            self.ticket = await self.client.acquire(self.key, self.lease, wait, min_work_budget=self.min_work_budget)
        except errors.Timeout:  # definite: WaitElapsed, an Indeterminate, is no Timeout
            return False
        if self.keep_alive is not None:
            self.keep_alive_error = None
            self._keeper = asyncio.get_running_loop().create_task(self._keep(self.ticket))
        return True

    async def _keep(self, ticket):
        try:
            await ticket.keep_alive(self.keep_alive)
        except errors.LockdError as e:
            self.keep_alive_error = e

    async def release(self):
        """As Lock.release."""
        ticket = self._held()
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        self.ticket = None
        await self.client.release(ticket)

    async def extend(self, lease=None):
        """As Lock.extend."""
        await self._held().renew(lease)

    async def __aenter__(self):
        if not await self.acquire():
            raise errors.Timeout(f"{self.key!r} was not acquired: TIMEOUT")
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if exc_type is None:
            await self.release()
            return
        try:
            await self.release()
        except errors.LockdError:
            pass  # the body's exception wins

    def __repr__(self):
        return f"AsyncLock(key={self.key!r}, locked={self.locked()}, token={self.token})"
