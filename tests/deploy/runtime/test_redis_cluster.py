"""The local Redis Cluster the tests and the README's cluster recipe start: a node whose port pair was taken
between the check and Redis's bind starts again on another pair instead of failing the start, also when the port
was taken by another Redis, which answers on it (two clusters starting at once: two test workers)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from deploy.runtime import redis_cluster
from deploy.runtime.redis_cluster import LocalRedisCluster


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_node_whose_bus_port_is_taken_before_it_binds_starts_on_another_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = redis_cluster._free_port
    taken = free()
    picks = iter([taken])
    monkeypatch.setattr(redis_cluster, "_free_port", lambda: next(picks, None) or free())
    cluster = LocalRedisCluster(tmp_path / "cluster")
    with socket.socket() as holder:  # another process took the bus port after it was found free
        holder.bind(("127.0.0.1", taken + 10_000))
        holder.listen()
        port = cluster._start_node()
    try:
        assert port != taken and redis.Redis(port=port).ping()
        assert "Failed listening" in (tmp_path / "cluster" / str(taken) / "redis.log").read_text()
    finally:
        cluster.stop()


@pytest.mark.slow  # two Redis starts: the full tier (the quick tier has a 3-minute budget)
def test_a_node_whose_port_another_redis_took_is_not_mistaken_for_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = redis_cluster._free_port
    other = LocalRedisCluster(tmp_path / "other")
    taken = other._start_node()  # another cluster's node, up on the port this one is about to draw
    picks = iter([taken])
    monkeypatch.setattr(redis_cluster, "_free_port", lambda: next(picks, None) or free())
    monkeypatch.setattr(redis_cluster, "_bindable", lambda port: True)  # drawn before the other bound it
    cluster = LocalRedisCluster(tmp_path / "cluster")
    try:
        port = cluster._start_node()
        assert port != taken and set(cluster.processes) == {port}
        assert redis.Redis(port=port).info("server")["process_id"] == cluster.processes[port].pid
    finally:
        cluster.stop()
        other.stop()


@pytest.mark.slow  # three Redis starts: the full tier (the quick tier has a 3-minute budget)
def test_a_start_that_fails_stops_every_node_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_ok(self: LocalRedisCluster, wait_seconds: float = 60.0) -> None:
        raise RuntimeError("not ok")

    monkeypatch.setattr(LocalRedisCluster, "wait_ok", not_ok)
    cluster = LocalRedisCluster(tmp_path / "cluster", masters=3)
    with pytest.raises(RuntimeError, match="not ok"):
        cluster.start()
    assert len(cluster.processes) == 3 and all(p.poll() is not None for p in cluster.processes.values())
