"""What is served: the generation pointer, the epoch markers, dropping keys by prefix, and the lifecycle
of a generation (``Generations``: begin, flip, drop stale), the one writer of the pointer and the record.
Callers reach all of it through a pipeline's store session (``serving.store.session.PipelineStore``);
the functions here are its private helpers.

The epoch marker is a random value set once per Redis dataset; a different value later means
Redis lost its data (a restart without persistence, a FLUSHALL, a failover to a replica that had
not received it). Writers compare it before they make anything visible; the speed layer rebuilds
its segments when it changes. On a bucketed store (Redis Cluster) every bucket has its own marker
beside its data, on the master that holds it, so losing one master's data is noticed by exactly
the writes that go there; the *epoch* of the store is then all markers joined by ``,``, global first.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace

import redis
from redis.cluster import RedisCluster
from redis.typing import EncodableT

from serving.store.errors import (
    GenerationLostError,
    LayoutError,
    LogicConflictError,
    ReplicationError,
    StoreUnavailableError,
)
from serving.store.generation_meta import GenerationMeta
from serving.store.keys import Keys
from serving.store.logic import claim_segment, satisfy_waiting
from serving.store.replication import master_of, replicated
from serving.store.replies import text

log = logging.getLogger(__name__)

# KEYS: the pointer, the generation's record, the epoch marker (one bucket's, or the global ones);
# ARGV: the marker the run read, the generation, the record's fields and values ->
# -2 (the marker changed: that Redis lost its data), else the generation served after the call.
_FLIP = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -2 end
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local generation = tonumber(ARGV[2])
if generation <= current then return current end
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('SET', KEYS[1], ARGV[2])
return generation
"""


#: Tries of one bucket's flip on a cluster (each waits up to ``replication.WAIT_MILLISECONDS`` for a replica).
_FLIP_TRIES = 3

def ensure_epoch(client: redis.Redis, keys: Keys) -> str:
    """``PipelineStore.ensure_epoch``: the layout checked, each missing marker set (SET NX), all read back."""
    glob = keys.global_keys
    client.set(glob.layout, keys.buckets, nx=True)
    LayoutError.check(keys.pipeline, client.get(glob.layout), keys.buckets)
    markers = []
    for k in keys.every_prefix():
        client.set(k.epoch, uuid.uuid4().hex, nx=True)
        value = client.get(k.epoch)
        assert value is not None, f"{k.epoch} vanished right after SET NX (a FLUSHALL in between); run again"
        markers.append(text(value))
    return ",".join(markers)


def read_epoch(client: redis.Redis, keys: Keys) -> str | None:
    """``PipelineStore.read_epoch``: every marker read, None at the first one gone."""
    markers = []
    for k in keys.every_prefix():
        value = client.get(k.epoch)
        if value is None:
            return None
        markers.append(text(value))
    return ",".join(markers)


def epoch_marker(keys: Keys, epoch: str) -> str:
    """The marker of ``keys``'s bucket (or the global one) within the store's ``epoch``."""
    markers = epoch.split(",")
    return markers[0] if keys.is_global else markers[1 + keys.bucket_index]  # type: ignore[operator]


def served_generation(client: redis.Redis, keys: Keys) -> int | None:
    """``PipelineStore.served_generation``: the global pointer (on a bucketed store it moves last)."""
    value = client.get(keys.global_keys.current)
    return None if value is None else int(value)


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """Delete every key under ``prefix:`` (SCAN + UNLINK in batches; never blocks Redis for long).
    On a cluster the scan visits every master."""
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=20_000):
        batch.append(key)
        if len(batch) >= 2000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


class Generations:
    """One pipeline's batch generations in one Redis: what a batch run publishes through
    (``PipelineStore.generations``).

    ``begin`` records a generation before its rows are loaded (under ``Keys.generation_prefix``, which no
    reader looks at yet), ``flip`` serves it with its record in one atomic call per bucket, and
    ``drop_stale`` deletes what is older than the served generation. A run that dies before the flip leaves
    what is served untouched; its partial keys are dropped by the next successful run's ``drop_stale``.
    """

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys

    def begin(self, generation: int, epoch: str) -> None:
        """Record that ``generation`` is being loaded (so a dead run's keys get dropped).

        ``epoch`` is the store's epoch read before the run's barrier (``PipelineStore.ensure_epoch``);
        GenerationLostError at once when Redis lost its data since (the flip would refuse the generation anyway).
        """
        if read_epoch(self.client, self.keys) != epoch:
            raise GenerationLostError(
                f"Redis lost its data after generation {generation} of {self.keys.pipeline!r} began (its epoch "
                "marker changed): nothing was loaded; run the batch again")
        self.client.sadd(self.keys.generations, generation)

    def flip(self, generation: int, epoch: str, meta: GenerationMeta) -> bool:
        """Serve ``generation`` with its record ``meta`` from now on, atomically, unless a newer one is served;
        True when it is served.

        First the generation's realtime segment is claimed for ``meta.logic`` (``PipelineStore.claim_segment``):
        LogicConflictError when the speed layer wrote it under other logic (serving both would mix two
        logics). Then, bucketed, every bucket's pointer, then the global one
        (``PipelineStore.served_generation``): GenerationLostError when an epoch marker is not the one in
        ``epoch`` (that Redis lost data during the load, so the generation may be incomplete there);
        StoreUnavailableError when Redis fails. Once served, a speed layer's wait for a generation of its
        logic is over (``PipelineStore.satisfy_waiting``).
        """
        held = claim_segment(self.client, self.keys, generation, meta.logic)
        if held is not None:
            raise LogicConflictError(
                f"generation {generation} of {self.keys.pipeline!r} was computed under logic {meta.logic}, but its "
                f"realtime segment holds {held}: the speed layer runs other pipeline code than this batch run. "
                "Run every part with the same code; nothing was flipped")
        args: list[EncodableT] = [generation]
        for name, value in replace(meta, version=generation, published_at=time.time()).to_hash().items():
            args += [name, value]
        served = generation
        for where in reversed(self.keys.every_prefix()):  # the global pointer last
            call = ("EVAL", _FLIP, 3, where.current, where.meta(generation), where.epoch, epoch_marker(where, epoch),
                    *args)
            try:
                served = self._flip_in(where, call, generation)
            except redis.RedisError as e:
                raise StoreUnavailableError(f"cannot flip the served generation of {self.keys.pipeline!r} to "
                                            f"{generation}: {e}") from e
            if served == -2:
                raise GenerationLostError(
                    f"Redis lost its data while generation {generation} of {self.keys.pipeline!r} was loading "
                    f"(epoch marker {where.epoch} changed); nothing more was flipped: run the batch again")
        if served == generation:
            satisfy_waiting(self.client, self.keys, meta.logic)
        return served == generation

    def _flip_in(self, where: Keys, call: tuple, generation: int) -> int:
        """``call`` (``_FLIP`` in one bucket); on a cluster, done once a replica holds it: a master that died
        before replicating a bucket's flip would leave that bucket on the old generation, which ``drop_stale``
        then deletes below the global pointer (``serving.store.replication``)."""
        if not isinstance(self.client, RedisCluster):
            return int(self.client.execute_command(*call))
        what = f"the flip of {where.current} to generation {generation}"
        for attempt in range(1, _FLIP_TRIES + 1):  # _FLIP again is harmless: it returns the pointer it finds
            master = master_of(self.client, where.current)  # from the slot map a failed try asked for again
            try:
                [reply] = replicated(self.client, master, [call], doing=what, what=what,
                                     otherwise="nothing more was flipped: run the batch again")
                return int(reply)
            except ReplicationError as e:  # a failover moved the slot, or a replica still catching up on the load
                if attempt == _FLIP_TRIES:
                    raise
                log.warning("%s (attempt %d of %d), trying again", e, attempt, _FLIP_TRIES)
        raise AssertionError("unreachable")

    def drop_stale(self) -> dict[str, list[int]]:
        """Delete every generation and realtime segment older than the served generation; returns what was
        dropped (``generations`` / ``segments`` -> their numbers).

        Safe while readers and the speed layer run: readers only touch the served generation and its
        segment (atomically, in Lua), and the speed layer's writes skip segments below the pointer.
        """
        keys = self.keys
        served = served_generation(self.client, keys)
        if served is None:
            return {}
        dropped: dict[str, list[int]] = {}
        for index, kind in ((keys.generations, "g"), (keys.segments, "s")):
            stale = sorted(g for g in (int(x) for x in self.client.smembers(index)) if g < served)
            for number in stale:
                for where in keys.every_prefix():
                    delete_prefix(self.client,
                                  where.generation_prefix(number) if kind == "g" else where.segment_prefix(number))
                self.client.srem(index, number)
            dropped[index.rsplit(":", 1)[-1]] = stale
        if any(dropped.values()):
            log.info("dropped stale data of %s below generation %d: %s", keys.pipeline, served, dropped)
        return dropped
