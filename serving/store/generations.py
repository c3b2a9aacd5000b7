"""What is served: the generation pointer, the epoch markers, and dropping keys by prefix.

The epoch marker is a random value set once per Redis dataset; a different value later means
Redis lost its data (a restart without persistence, a FLUSHALL, a failover to a replica that had
not received it). Writers compare it before they make anything visible; the speed layer rebuilds
its segments when it changes. On a bucketed store (Redis Cluster) every bucket has its own marker
beside its data, on the master that holds it, so losing one master's data is noticed by exactly
the writes that go there; the *epoch* of the store is then all markers joined by ``,``, global first.
"""

from __future__ import annotations

import uuid

import redis

from serving.store.errors import LayoutError
from serving.store.keys import Keys
from serving.store.replies import text


def ensure_epoch(client: redis.Redis, keys: Keys) -> str:
    """This Redis dataset's epoch, its markers created where missing. A different value later means data was lost.

    Raises LayoutError when the store was laid out with another bucket count (its rows would be
    looked for in the wrong buckets).
    """
    glob = keys.global_keys
    client.set(glob.layout, keys.buckets, nx=True)
    laid_out = client.get(glob.layout)
    if laid_out is not None and int(laid_out) != keys.buckets:
        raise LayoutError(
            f"the serving store of {keys.pipeline!r} is laid out in {int(laid_out)} buckets, not {keys.buckets}: "
            f"use buckets={int(laid_out)} in the Redis URL, or start on an empty Redis"
        )
    markers = []
    for k in keys.every_prefix():
        client.set(k.epoch, uuid.uuid4().hex, nx=True)
        value = client.get(k.epoch)
        assert value is not None, f"{k.epoch} vanished right after SET NX (a FLUSHALL in between); run again"
        markers.append(text(value))
    return ",".join(markers)


def read_epoch(client: redis.Redis, keys: Keys) -> str | None:
    """The store's epoch as it is now, or None when a marker is gone (that Redis lost its data)."""
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
    """The generation readers are served (its master version), or None before the first publish.

    On a bucketed store this is the global pointer, which moves last, after every bucket's."""
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
