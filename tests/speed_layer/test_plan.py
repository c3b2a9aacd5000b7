"""A plan that opens a group of micro-batches under one tag is on a replica before the group writes.

On a Redis Cluster the plan key is the one record of the open group's tag until the group's commit
(which waits for a replica itself): a failover losing it would start the undo logs over mid-group.
Real Redis Cluster with a replica per master; the replica of the plan's master is frozen.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from deploy.runtime.redis_cluster import LocalRedisCluster
from serving.store import replication
from serving.store.connection import redis_client, store_keys
from serving.store.errors import ReplicationError
from serving.store.session import PipelineStore
from speed_layer.input import Summary
from speed_layer.plan import Planner


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_plan_opening_a_group_waits_for_a_replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalRedisCluster(tmp_path / "cluster", replicas=1).start()
    try:
        client = redis_client(cluster.url)
        keys = store_keys("orders", cluster.url)
        planner = Planner(PipelineStore(client, keys), "q1", "logic1", tmp_path / "checkpoint", driver_rows=0)
        master = client.get_node_from_key(keys.plan("q1")).port
        frozen = cluster.replicas_of(master)[0]
        monkeypatch.setattr(replication, "WAIT_MILLISECONDS", 300)
        cluster.pause(frozen)
        try:
            # A micro-batch ending where a version does is committed (the commit waits): its plan does not wait.
            assert planner.plan(2, Summary(10, [10]), ends_inside=False).tag == 10
            for _ in ("first attempt", "replay"):
                with pytest.raises(ReplicationError, match=f"no replica of 127.0.0.1:{master} acknowledged the plan "
                                                           "of micro-batch 3"):
                    planner.plan(3, Summary(12, []), ends_inside=True)
        finally:
            cluster.resume(frozen)
        assert planner.plan(3, Summary(12, []), ends_inside=True)[1:] == (None, 12, False)  # the replay: acknowledged
        replica = redis.Redis(port=frozen)
        replica.execute_command("READONLY")
        assert replica.get(keys.plan("q1")).decode().startswith("3:")
    finally:
        cluster.stop()
