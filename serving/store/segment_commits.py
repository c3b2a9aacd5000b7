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
            connection = client.get_redis_connection(primary)
            by_master[primary.name] = (connection, len(nodes) - 1, [])
        by_master[primary.name][2].append(bucket)
    for name, (connection, replicas, buckets) in by_master.items():
        pipe = connection.pipeline(transaction=False)
        for bucket in buckets:
            pipe.eval(_COMMIT, len(bases), *(bucket.segment_meta(base) for base in bases), processed, now)
        if replicas:
            pipe.execute_command("WAIT", 1, WAIT_MILLISECONDS)
        try:
            replies = pipe.execute()
        except redis.RedisError as e:
            client.nodes_manager.initialize()  # a failover moved the slots: the replay asks the new masters
            raise ReplicationError(f"committing version {processed} of {keys.pipeline!r} on {name} failed: {e}") from e
        if replicas and int(replies[-1]) < 1:
            raise ReplicationError(
                f"no replica of {name} acknowledged version {processed} of {keys.pipeline!r} within "
                f"{WAIT_MILLISECONDS} ms: the micro-batch is replayed rather than counted as done")
