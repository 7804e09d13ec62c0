"""lockd's Python client beside redis-py's Lock, in the shape of lockbench's
uncontended workload: N concurrent callers (threads, or asyncio tasks), each
in a closed loop of acquire (wait 0, lease 30 s) and release of a key drawn
at random from a million, for a fixed time. As in lockbench, a cycle whose
key another caller holds at that instant ends not acquired and counts too. It starts a single-mode lockd
and a redis-server on free loopback ports, runs the pairs interleaved for
several rounds (so drift of a shared machine weighs on both), and prints
cycles/s of each and their ratio, per round and the median.

    python3 python/bench.py --lockd bin/lockd [--callers 64] [--duration 5] [--rounds 3]

Needs python3-redis and redis-server (Debian packages).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lockd  # noqa: E402

KEYS = 1_000_000
LEASE = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def usage():
    """CPU seconds and context switches of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def result(counts, elapsed, before):
    """cycles/s, and CPU microseconds and context switches per cycle."""
    cpu, csw = usage()
    n = max(sum(counts), 1)
    return sum(counts) / elapsed, (cpu - before[0]) / n * 1e6, (csw - before[1]) / n


def run_threads(cycle_factory, callers, duration):
    counts = [0] * callers
    stop = time.monotonic() + duration

    def worker(i):
        cycle = cycle_factory()
        rng = random.Random(i)
        n = 0
        while time.monotonic() < stop:
            cycle(f"bench/{rng.randrange(KEYS)}")
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(callers)]
    before, t0 = usage(), time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return result(counts, time.monotonic() - t0, before)


async def run_tasks(cycle, callers, duration):
    counts = [0] * callers
    stop = time.monotonic() + duration

    async def worker(i):
        rng = random.Random(i)
        n = 0
        while time.monotonic() < stop:
            await cycle(f"bench/{rng.randrange(KEYS)}")
            n += 1
        counts[i] = n

    before, t0 = usage(), time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(callers)))
    return result(counts, time.monotonic() - t0, before)


def lockd_threads(addr, callers, duration):
    with lockd.Client(addr) as c:
        def factory():
            def cycle(key):
                try:
                    t = c.acquire(key, LEASE, 0, min_work_budget=0)
                except lockd.Timeout:
                    return  # another caller drew the same key
                c.release(t)
            return cycle
        return run_threads(factory, callers, duration)


def redis_threads(port, callers, duration):
    import redis
    r = redis.Redis(port=port, max_connections=callers + 4)

    def factory():
        def cycle(key):
            lk = r.lock(key, timeout=LEASE)
            if lk.acquire(blocking=False):
                lk.release()
        return cycle
    try:
        return run_threads(factory, callers, duration)
    finally:
        r.close()


def lockd_asyncio(addr, callers, duration):
    async def main():
        async with lockd.AsyncClient(addr) as c:
            async def cycle(key):
                try:
                    t = await c.acquire(key, LEASE, 0, min_work_budget=0)
                except lockd.Timeout:
                    return  # another caller drew the same key
                await c.release(t)
            return await run_tasks(cycle, callers, duration)
    return asyncio.run(main())


def redis_asyncio(port, callers, duration):
    import redis.asyncio as aredis

    async def main():
        r = aredis.Redis(port=port, max_connections=callers + 4)
        try:
            async def cycle(key):
                lk = r.lock(key, timeout=LEASE)
                if await lk.acquire(blocking=False):
                    await lk.release()
            return await run_tasks(cycle, callers, duration)
        finally:
            await r.close()
    return asyncio.run(main())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lockd", default="bin/lockd", help="the lockd binary")
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="threads,asyncio")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="lockd-pybench-")
    lport, rport = free_port(), free_port()
    procs = []
    try:
        ld = subprocess.Popen([args.lockd, "serve", "--listen", f"127.0.0.1:{lport}", "--admin", "",
                               "--data-dir", os.path.join(tmp, "data"), "--log-level", "warn"],
                              stderr=open(os.path.join(tmp, "lockd.log"), "w"))
        procs.append(ld)
        rd = subprocess.Popen([args.redis_server, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        procs.append(rd)
        wait_port(lport, ld, "lockd")
        wait_port(rport, rd, "redis-server")
        addr = f"127.0.0.1:{lport}"
        runs = {"threads": (lockd_threads, redis_threads), "asyncio": (lockd_asyncio, redis_asyncio)}
        print(f"uncontended: {args.callers} callers, random keys of {KEYS}, wait 0, lease {LEASE} s, "
              f"{args.duration:g} s per run, {args.rounds} rounds, python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs")
        print(f"{'mode':8} {'round':>5} {'lockd c/s':>10} {'redis c/s':>10} {'ratio':>6} "
              f"{'CPU us/cycle':>13} {'switches/cycle':>15}   (client process: lockd / redis-py)")
        for mode in args.modes.split(","):
            ours, theirs = runs[mode]
            ratios = []
            for rnd in range(args.rounds):
                # Alternate which goes first, so neither always gets the warmer machine.
                if rnd % 2 == 0:
                    l_rate, l_cpu, l_csw = ours(addr, args.callers, args.duration)
                    r_rate, r_cpu, r_csw = theirs(rport, args.callers, args.duration)
                else:
                    r_rate, r_cpu, r_csw = theirs(rport, args.callers, args.duration)
                    l_rate, l_cpu, l_csw = ours(addr, args.callers, args.duration)
                ratios.append(l_rate / r_rate)
                print(f"{mode:8} {rnd + 1:>5} {l_rate:>10.0f} {r_rate:>10.0f} {l_rate / r_rate:>6.2f} "
                      f"{l_cpu:>6.1f} /{r_cpu:>6.1f} {l_csw:>7.2f} /{r_csw:>6.2f}", flush=True)
            print(f"{mode:8} median ratio lockd/redis-py Lock: {statistics.median(ratios):.2f}", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
