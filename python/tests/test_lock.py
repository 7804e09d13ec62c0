"""lockd.Lock and lockd.AsyncLock against lockd built from the tree, and the
exceptions' standard bases: what a user of threading.Lock or redis-py's Lock
would try first."""

from __future__ import annotations

import asyncio
import os
import time
import tomllib

import pytest

import lockd
from conftest import AsyncAdapter, ROOT


def test_a_lock_object_is_reusable_and_answers_true_or_false(server, key):
    with lockd.Client(server.addr) as c:
        mine = lockd.Lock(c, key, lease=10, min_work_budget=1)
        theirs = lockd.Lock(c, key, min_work_budget=0)
        assert not mine.locked() and mine.token is None
        assert mine.acquire(blocking=False) is True
        assert mine.locked() and mine.token > 0
        assert theirs.acquire(blocking=False) is False, "a held key is a definite False"
        assert not theirs.locked()
        with pytest.raises(RuntimeError):
            mine.acquire(blocking=False)  # not reentrant
        first = mine.token
        mine.release()
        assert not mine.locked()
        with pytest.raises(RuntimeError):
            mine.release()
        with mine:
            assert mine.locked() and mine.token > first, "the same object again, a larger token"
            assert theirs.acquire(blocking=False) is False
        assert theirs.acquire(blocking=False) is True, "released at the end of the with block"
        theirs.release()
        with pytest.raises(ValueError):
            mine.acquire(blocking=False, timeout=3)


def test_a_wait_that_runs_out_raises_never_false(server, key):
    with lockd.Client(server.addr) as c:
        holder = lockd.Lock(c, key, min_work_budget=0)
        assert holder.acquire(blocking=False)
        waiter = lockd.Lock(c, key, min_work_budget=0)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as e:
            waiter.acquire(timeout=1)
        assert time.monotonic() - t0 < 1.5
        assert isinstance(e.value, lockd.WaitElapsed) and isinstance(e.value, lockd.Indeterminate)
        assert not waiter.locked()
        holder.release()


def test_extend_and_keep_alive(server, key):
    with lockd.Client(server.addr) as c:
        lock = lockd.Lock(c, key, lease=1, min_work_budget=0, keep_alive=0.3)
        assert lock.acquire(blocking=False)
        time.sleep(1.6)  # past the 1 s lease: only the renewals hold it
        assert lock.locked() and lock.keep_alive_error is None
        assert lockd.Lock(c, key, min_work_budget=0).acquire(blocking=False) is False
        lock.extend(20)
        assert lock.ticket.remaining() > 19
        lock.release()
        assert lockd.Lock(c, key, min_work_budget=0).acquire(blocking=False) is True


def test_async_lock(server, key):
    with AsyncAdapter(server.addr) as a:
        async def scenario():
            mine = lockd.AsyncLock(a.client, key, lease=1, min_work_budget=0, keep_alive=0.3)
            theirs = lockd.AsyncLock(a.client, key, min_work_budget=0)
            assert await mine.acquire(blocking=False) is True
            assert await theirs.acquire(blocking=False) is False
            await asyncio.sleep(1.6)
            assert mine.locked() and mine.keep_alive_error is None
            assert await theirs.acquire(blocking=False) is False, "kept alive past its 1 s lease"
            await mine.extend(5)
            await mine.release()
            async with theirs:
                assert theirs.locked()
            assert not theirs.locked()
            with pytest.raises(lockd.WaitElapsed):
                async with mine:
                    await theirs.acquire(timeout=1)
            assert await theirs.acquire(blocking=False) is True
            await theirs.release()
        a.run(scenario())


def test_exceptions_subclass_the_standard_ones(server, key):
    with lockd.Client(server.addr) as c:
        t = c.acquire(key, min_work_budget=0)
        with pytest.raises(TimeoutError):
            c.acquire(key, min_work_budget=0)  # TIMEOUT: a lockd.Timeout
        with pytest.raises(ValueError):
            c.acquire("a key", min_work_budget=0)
        with pytest.raises(ValueError):
            c.acquire(key, lease=0, min_work_budget=0)
        c.release(t)
    assert issubclass(lockd.Busy, lockd.LockdError) and not issubclass(lockd.Busy, TimeoutError)
    assert issubclass(lockd.NotConnected, ConnectionError)


def test_version_is_the_package_version():
    with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
        assert lockd.__version__ == tomllib.load(f)["project"]["version"]
