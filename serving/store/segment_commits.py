"""The commit point of a micro-batch, and the plan of the one in flight, on the replicas before they count.

A commit moves the realtime segments' ``processed`` to the micro-batch's end version, in every
bucket. On one Redis this is one MULTI; on a bucketed store (Redis Cluster) one atomic call per
bucket: a reader of one key reads one bucket and sees the micro-batch whole or not at all; a
reader of several buckets (top-N) compares the versions they answered at and asks again when a
commit fell between them (``serving.store.reader``). A segment that died since the micro-batch
was planned (below the bucket's generation pointer: ``Generations.drop_stale`` deletes it) is skipped,
as the chunk writes skip it (``serving.store.segments``): a replay's commit leaves no key behind.

Failover. A master that dies before its replica received a commit would, after the failover, lack
it, while the speed layer's checkpoint says the micro-batch is done: a gap nobody repairs. So a commit
waits for a replica (``serving.store.replication``); without one ``ReplicationError`` fails the
micro-batch, Spark replays it, and the guards (on the replicas too, written in the same atomic calls)
make the replay re-apply exactly what the new master lacks. A plan that opens a group of micro-batches
under one tag (``PipelineStore.save_plan``) is waited for the same way: it is the one record of the
group's tag until the group's commit, so a failover losing it would start the undo logs over mid-group.

Callers commit and keep plans through a pipeline's store session (``serving.store.session.PipelineStore``);
the functions here are its private helpers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis
from redis.cluster import RedisCluster

from serving.store.keys import Keys
from serving.store.replication import Master, master_of, replicated
from serving.store.replies import text

#: What a commit or plan no replica acknowledged leads to.
_REPLAYED = "the micro-batch is replayed rather than counted as done"

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

def commit_processed(client: redis.Redis, keys: Keys, bases: Sequence[int], processed: int) -> None:
    """``PipelineStore.commit_processed``: one MULTI on one Redis; on a cluster, per master its buckets' calls
    on one connection, then WAIT (``serving.store.replication``)."""
    now = time.time()
    if not isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=True)
        for bucket in keys.all_buckets():
            pipe.execute_command(*_commit_call(bucket, bases, processed, now))
        pipe.execute()
        return
    by_master: dict[str, tuple[Master, list[Keys]]] = {}
    for bucket in keys.all_buckets():
        master = master_of(client, bucket.current)
        by_master.setdefault(master.name, (master, []))[1].append(bucket)
    what = f"version {processed} of {keys.pipeline!r}"
    for master, buckets in by_master.values():
        calls = [_commit_call(bucket, bases, processed, now) for bucket in buckets]
        replicated(client, master, calls, doing=f"committing {what}", what=what, otherwise=_REPLAYED)


def _commit_call(bucket: Keys, bases: Sequence[int], processed: int, now: float) -> tuple:
    """The EVAL of ``_COMMIT`` in one bucket."""
    metas = (bucket.segment_meta(b) for b in bases)
    return ("EVAL", _COMMIT, 1 + len(bases), bucket.current, *metas, processed, now, *bases)


def save_plan(client: redis.Redis, keys: Keys, query: str, batch_id: int, plan: str, *, opens_group: bool) -> None:
    """``PipelineStore.save_plan``: one SET; on a cluster, a plan opening a group waits for a replica."""
    key, value = keys.global_keys.plan(query), f"{batch_id}:{plan}"
    if not (opens_group and isinstance(client, RedisCluster)):
        client.set(key, value)
        return
    what = f"the plan of micro-batch {batch_id} of {keys.pipeline!r}"
    replicated(client, master_of(client, key), [("SET", key, value)], doing=f"saving {what}", what=what,
               otherwise=_REPLAYED)


def saved_plan(client: redis.Redis, keys: Keys, query: str) -> tuple[int, str] | None:
    """``PipelineStore.saved_plan``: the plan key, read and split."""
    stored = client.get(keys.global_keys.plan(query))
    if stored is None:
        return None
    batch_id, plan = text(stored).split(":", 1)
    return int(batch_id), plan
