"""What is served: the generation pointer, the epoch marker, and dropping keys by prefix.

The epoch marker is a random value set once per Redis dataset; a different value later means
Redis lost its data (a restart without persistence, a FLUSHALL). Writers compare it before they
make anything visible; the speed layer rebuilds its segments when it changes.
"""

from __future__ import annotations

import uuid

import redis

from serving.store.keys import Keys
from serving.store.replies import text


def ensure_epoch(client: redis.Redis, keys: Keys) -> str:
    """This Redis dataset's epoch marker, created if missing. A different value later means data was lost."""
    client.set(keys.epoch, uuid.uuid4().hex, nx=True)
    epoch = client.get(keys.epoch)
    assert epoch is not None, f"{keys.epoch} vanished right after SET NX (a FLUSHALL in between); run again"
    return text(epoch)


def served_generation(client: redis.Redis, keys: Keys) -> int | None:
    """The generation readers are served (its master version), or None before the first publish."""
    value = client.get(keys.current)
    return None if value is None else int(value)


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """Delete every key under ``prefix:`` (SCAN + UNLINK in batches; never blocks Redis for long)."""
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=20_000):
        batch.append(key)
        if len(batch) >= 2000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)
