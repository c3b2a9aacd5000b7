"""The local Redis Cluster the tests and the README's cluster recipe start: a node whose port pair was taken
between the check and Redis's bind starts again on another pair instead of failing the start."""

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
