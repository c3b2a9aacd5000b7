"""The commit point of a micro-batch: its realtime segments' ``processed`` moves to the micro-batch's
end version, in every bucket, and is on the replicas before the speed layer may commit its offsets.

On one Redis this is one MULTI over the segments' metadata. On a bucketed store (Redis Cluster)
it is one atomic call per bucket: a reader of one key reads one bucket and sees the micro-batch
whole or not at all; a reader of several buckets (top-N) compares the versions they answered at
and asks again when a commit fell between them (``serving.api.view_reader``).

Failover. A master that dies before its replica received a write would, after the failover,
lack it, while the speed layer's checkpoint says the micro-batch is done: a gap nobody repairs.
So when a bucket's master has replicas, the commit ends with ``WAIT 1`` on the connection that
wrote the commit: Redis replicates each master's writes as one ordered stream, so a replica that
acknowledged the commit holds every increment the executors wrote there before it. Without the
acknowledgement (timeout, or the master died) ``ReplicationError`` fails the micro-batch, Spark
replays it, and the guards (on the replicas too, written in the same atomic calls) make the
replay re-apply exactly what the new master lacks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from serving.store.errors import ReplicationError
from serving.store.keys import Keys

#: KEYS: the segments' meta hashes (one bucket); ARGV: processed version, time.
_COMMIT = """
for _, meta in ipairs(KEYS) do redis.call('HSET', meta, 'processed', ARGV[1], 'updated_at', ARGV[2]) end
return #KEYS
"""

#: How long a commit waits for a replica's acknowledgement.
WAIT_MILLISECONDS = 5_000


def commit_processed(client: redis.Redis, keys: Keys, bases: Sequence[int], processed: int) -> None:
    """Make every increment tagged ``processed`` visible in the segments based at ``bases``.

    Returns once it is visible in every bucket and, where a bucket's master has replicas, once one
    replica acknowledged it; raises ReplicationError otherwise (the micro-batch must be replayed).
    """
    now = time.time()
    if not isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=True)
        for bucket in keys.all_buckets():
            for base in bases:
                pipe.hset(bucket.segment_meta(base), mapping={"processed": processed, "updated_at": now})
        pipe.execute()
        return
    by_master: dict[str, tuple[redis.Redis, int, list[Keys]]] = {}
    for bucket in keys.all_buckets():
        nodes = client.nodes_manager.slots_cache[client.keyslot(bucket.current)]
        primary = nodes[0]
        if primary.name not in by_master:
            by_master[primary.name] = (client.get_redis_connection(primary), len(nodes) - 1, [])
        by_master[primary.name][2].append(bucket)
    for name, (node, known_replicas, buckets) in by_master.items():
        try:
            _commit_on(node, buckets, bases, processed, now, known_replicas, name, keys.pipeline)
        except (redis.RedisError, OSError) as e:
            _refresh_slots(client)
            if isinstance(e, ReplicationError):
                raise
            raise ReplicationError(f"committing version {processed} of {keys.pipeline!r} on {name} failed: {e}") from e


def _refresh_slots(client: RedisCluster) -> None:
    """Ask the cluster for its slot map again (a failover moved slots: the replay goes to the new masters).
    Mid-election nobody may answer yet; the client asks again by itself on its next command then."""
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException, OSError):
        pass


def _commit_on(node: redis.Redis, buckets: list[Keys], bases: Sequence[int], processed: int, now: float,
               known_replicas: int, name: str, pipeline: str) -> None:
    """The commit on one master, all on one connection (WAIT covers what *its* connection wrote):
    each bucket's call, then ROLE (still the master? replicas attached now?), then WAIT if any replica
    is expected (known to the cluster's slot map, or attached)."""
    connection = node.connection_pool.get_connection()
    try:
        for bucket in buckets:
            connection.send_command("EVAL", _COMMIT, len(bases), *(bucket.segment_meta(b) for b in bases),
                                    processed, now)
        for _ in buckets:
            connection.read_response()
        connection.send_command("ROLE")
        role = connection.read_response()
        if role[0] not in (b"master", "master"):
            raise ReplicationError(f"{name} is no longer a master (a failover): version {processed} of {pipeline!r} "
                                   "is replayed on the new one")
        if max(known_replicas, len(role[2])) == 0:
            return
        connection.send_command("WAIT", 1, WAIT_MILLISECONDS)
        acknowledged = int(connection.read_response())
    finally:
        node.connection_pool.release(connection)
    if acknowledged < 1:
        raise ReplicationError(
            f"no replica of {name} acknowledged version {processed} of {pipeline!r} within "
            f"{WAIT_MILLISECONDS} ms: the micro-batch is replayed rather than counted as done")
