"""The commit point of a micro-batch, and the plan of the one in flight, on the replicas before they count.

A commit moves the realtime segments' ``processed`` to the micro-batch's end version, in every
bucket. On one Redis this is one MULTI; on a bucketed store (Redis Cluster) one atomic call per
bucket: a reader of one key reads one bucket and sees the micro-batch whole or not at all; a
reader of several buckets (top-N) compares the versions they answered at and asks again when a
commit fell between them (``serving.store.reader``). A segment that died since the micro-batch
was planned (below the bucket's generation pointer: ``Generations.drop_stale`` deletes it) is skipped,
as the chunk writes skip it (``serving.store.segments``): a replay's commit leaves no key behind.

Failover. A master that dies before its replica received a write would, after the failover,
lack it, while the speed layer's checkpoint says the micro-batch is done: a gap nobody repairs.
So when a bucket's master has replicas, the commit ends with ``WAIT 1`` on the connection that
wrote the commit: Redis replicates each master's writes as one ordered stream, so a replica that
acknowledged the commit holds every increment the executors wrote there before it. Without the
acknowledgement (timeout, or the master died) ``ReplicationError`` fails the micro-batch, Spark
replays it, and the guards (on the replicas too, written in the same atomic calls) make the
replay re-apply exactly what the new master lacks. A plan that opens a group of micro-batches
under one tag (``PipelineStore.save_plan``) is waited for the same way: it is the one record of
the group's tag until the group's commit, so a failover losing it would start the undo logs over
mid-group.

Callers commit and keep plans through a pipeline's store session (``serving.store.session.PipelineStore``);
the functions here are its private helpers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from serving.store.errors import ReplicationError
from serving.store.keys import Keys
from serving.store.replies import text

#: KEYS: the bucket's generation pointer, then the segments' meta hashes (one bucket); ARGV: processed version,
#: time, then the segments' bases (ARGV[j + 1] is KEYS[j]'s). A segment below the pointer is dead: not written.
_COMMIT = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local n = 0
for j = 2, #KEYS do
  if tonumber(ARGV[j + 1]) >= current then
    redis.call('HSET', KEYS[j], 'processed', ARGV[1], 'updated_at', ARGV[2])
    n = n + 1
  end
end
return n
"""

#: How long a commit waits for a replica's acknowledgement.
WAIT_MILLISECONDS = 5_000


def commit_processed(client: redis.Redis, keys: Keys, bases: Sequence[int], processed: int) -> None:
    """``PipelineStore.commit_processed``: one MULTI on one Redis; on a cluster, per master its buckets' calls
    on one connection, then WAIT (``_replicated``)."""
    now = time.time()
    if not isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=True)
        for bucket in keys.all_buckets():
            pipe.execute_command(*_commit_call(bucket, bases, processed, now))
        pipe.execute()
        return
    by_master: dict[str, tuple[redis.Redis, int, list[Keys]]] = {}
    for bucket in keys.all_buckets():
        nodes = client.nodes_manager.slots_cache[client.keyslot(bucket.current)]
        primary = nodes[0]
        if primary.name not in by_master:
            by_master[primary.name] = (client.get_redis_connection(primary), len(nodes) - 1, [])
        by_master[primary.name][2].append(bucket)
    what = f"version {processed} of {keys.pipeline!r}"
    for name, (node, known_replicas, buckets) in by_master.items():
        calls = [_commit_call(bucket, bases, processed, now) for bucket in buckets]
        _replicated(client, node, calls, known_replicas, name, f"committing {what}", what)


def _commit_call(bucket: Keys, bases: Sequence[int], processed: int, now: float) -> tuple:
    """The EVAL of ``_COMMIT`` in one bucket."""
    metas = (bucket.segment_meta(b) for b in bases)
    return ("EVAL", _COMMIT, 1 + len(bases), bucket.current, *metas, processed, now, *bases)


def save_plan(client: redis.Redis, keys: Keys, query: str, batch_id: int, plan: str, *, opens_group: bool) -> None:
    """``PipelineStore.save_plan``: one SET; on a cluster, a plan opening a group waits (``_replicated``)."""
    key, value = keys.global_keys.plan(query), f"{batch_id}:{plan}"
    if not (opens_group and isinstance(client, RedisCluster)):
        client.set(key, value)
        return
    nodes = client.nodes_manager.slots_cache[client.keyslot(key)]
    what = f"the plan of micro-batch {batch_id} of {keys.pipeline!r}"
    _replicated(client, client.get_redis_connection(nodes[0]), [("SET", key, value)], len(nodes) - 1,
                nodes[0].name, f"saving {what}", what)


def saved_plan(client: redis.Redis, keys: Keys, query: str) -> tuple[int, str] | None:
    """``PipelineStore.saved_plan``: the plan key, read and split."""
    stored = client.get(keys.global_keys.plan(query))
    if stored is None:
        return None
    batch_id, plan = text(stored).split(":", 1)
    return int(batch_id), plan


def _replicated(client: RedisCluster, node: redis.Redis, calls: list[tuple], known_replicas: int, name: str,
                doing: str, what: str) -> None:
    """``calls`` on master ``name``, then acknowledged by a replica (``_on_replica``); any failure is a
    ReplicationError, after which the slot map is asked for again."""
    try:
        _on_replica(node, calls, known_replicas, name, what)
    except (redis.RedisError, OSError) as e:
        _refresh_slots(client)
        if isinstance(e, ReplicationError):
            raise
        raise ReplicationError(f"{doing} on {name} failed: {e}") from e


def _refresh_slots(client: RedisCluster) -> None:
    """Ask the cluster for its slot map again (a failover moved slots: the replay goes to the new masters).
    Mid-election nobody may answer yet; the client asks again by itself on its next command then."""
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException, OSError):
        pass


def _on_replica(node: redis.Redis, calls: list[tuple], known_replicas: int, name: str, what: str) -> None:
    """``calls`` on one master, all on one connection (WAIT covers what *its* connection wrote), then
    ROLE (still the master? replicas attached now?), then WAIT if any replica is expected (known to the
    cluster's slot map, or attached)."""
    connection = node.connection_pool.get_connection()
    try:
        for call in calls:
            connection.send_command(*call)
        for _ in calls:
            connection.read_response()
        connection.send_command("ROLE")
        role = connection.read_response()
        if role[0] not in (b"master", "master"):
            raise ReplicationError(f"{name} is no longer a master (a failover): {what} is replayed on the new one")
        if max(known_replicas, len(role[2])) == 0:
            return
        connection.send_command("WAIT", 1, WAIT_MILLISECONDS)
        acknowledged = int(connection.read_response())
    finally:
        node.connection_pool.release(connection)
    if acknowledged < 1:
        raise ReplicationError(
            f"no replica of {name} acknowledged {what} within "
            f"{WAIT_MILLISECONDS} ms: the micro-batch is replayed rather than counted as done")
