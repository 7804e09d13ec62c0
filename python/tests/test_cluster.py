"""The client against a 3-node cluster of lockd built from the tree, started
as `lockd serve --cluster` processes on free loopback ports: locks through
any node, and a failover of the group's leader."""

from __future__ import annotations

import os
import time
import urllib.request

import pytest

import lockd
from conftest import Server, free_ports, wait_listening


@pytest.fixture(scope="module")
def cluster(lockd_bin, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("cluster"))
    ports = free_ports(9)
    peers = ",".join(f"{i + 1}=127.0.0.1:{ports[i]}" for i in range(3))
    nodes = []
    for i in range(3):
        s = Server(lockd_bin, d, f"node{i + 1}", [
            "--cluster", "--node-id", str(i + 1), "--raft-addr", f"127.0.0.1:{ports[i]}",
            "--peers", peers, "--data-dir", os.path.join(d, f"data{i + 1}"), "--groups", "1",
            "--listen", f"127.0.0.1:{ports[3 + i]}", "--admin", f"127.0.0.1:{ports[6 + i]}",
            "--log-level", "warn", "--propose-timeout", "2s"], ports[3 + i])
        s.admin = f"127.0.0.1:{ports[6 + i]}"
        nodes.append(s)
    try:
        for s in nodes:
            wait_listening(s.port, s.proc, s.log)
        yield nodes
    finally:
        for s in nodes:
            s.kill()


def leader(nodes, timeout=30.0):
    """The leader of group 1, as a running node reports it on /metrics."""
    want = 'lockd_cluster_group_leader{group="1"} '
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in nodes:
            if s.proc.poll() is not None:
                continue
            try:
                body = urllib.request.urlopen(f"http://{s.admin}/metrics", timeout=1).read().decode()
            except OSError:
                continue
            for line in body.splitlines():
                if line.startswith(want):
                    n = int(float(line[len(want):]))
                    if n and nodes[n - 1].proc.poll() is None:
                        return nodes[n - 1]
        time.sleep(0.1)
    raise AssertionError("no live leader for group 1")


def acquire_through_failover(c, key, timeout=30.0):
    """Acquire with wait 0 until granted; during an election the answers
    are definite refusals or indeterminate, never a wrong grant."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return c.acquire(key, lease=10, min_work_budget=1)
        except (lockd.Unavailable, lockd.Indeterminate, lockd.NotConnected, lockd.Timeout):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_cluster_locks_through_every_node_and_survive_leader_failover(cluster, key):
    leader(cluster)
    for s in cluster:  # each node alone serves the same locks
        with lockd.Client(s.addr) as c:
            t = acquire_through_failover(c, f"{key}/{s.port}")
            c.release(t)
    addrs = [s.addr for s in cluster]
    with lockd.Client(addrs) as c:
        held = acquire_through_failover(c, key + "/held")
        before = acquire_through_failover(c, key)
        c.release(before)

        leader(cluster).kill()

        after = acquire_through_failover(c, key)
        assert after.token > before.token, "tokens keep growing across the failover"
        c.release(after)
        # The lock taken before the failover is still held, and its ticket
        # still releases it.
        with pytest.raises(lockd.Timeout):
            c.acquire(key + "/held", min_work_budget=0)
        c.release(held)
        waited = c.acquire(key + "/held", wait=3, min_work_budget=1)
        c.release(waited)
