"""The Kafka ingest's status (``Keys.kafka``): alive, counts, and lag per partition.

Written by ``lambda-platform kafka ingest`` (every second, and after each micro-batch); read by
``status``, the API's metrics and the console. One HSET per write, so a reader sees one write or the
other. Counts are the writing process's since it started (a restart starts them again, as Prometheus
counters may); the lag is Kafka's newest offset minus the offset the query has read through, per
partition, at its last trigger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from serving.store.heartbeat import HEARTBEAT_FRESH_SECONDS, short_error
from serving.store.replies import HashReply, text_hash


@dataclass(frozen=True)
class PartitionLagRecord:
    topic: str
    partition: int
    lag: int


@dataclass(frozen=True)
class IngestStatus:
    """One reading of the Kafka ingest's status hash."""

    source: str
    state: str
    beat_at: float | None
    read: int = 0
    appended: int = 0
    dead: int = 0
    batches: int = 0
    lags: tuple[PartitionLagRecord, ...] = ()
    last_error: str | None = None

    @classmethod
    def from_hash(cls, values: HashReply) -> IngestStatus | None:
        """From ``HGETALL Keys.kafka`` (bytes or decoded); None when the hash is empty (no ingest ever wrote it)."""
        fields = text_hash(values)
        if not fields:
            return None
        try:
            lags = tuple(PartitionLagRecord(str(t), int(p), int(n)) for t, p, n in json.loads(fields.get("lags") or "[]"))
        except (ValueError, TypeError):
            lags = ()
        return cls(
            source=fields.get("source", ""), state=fields.get("state", ""),
            beat_at=float(fields["heartbeat_at"]) if fields.get("heartbeat_at") else None,
            read=int(fields.get("read") or 0), appended=int(fields.get("appended") or 0),
            dead=int(fields.get("dead") or 0), batches=int(fields.get("batches") or 0), lags=lags,
            last_error=fields.get("last_error") or None,
        )

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.lags)

    def alive(self, now: float | None = None) -> bool:
        return self.beat_at is not None and (time.time() if now is None else now) - self.beat_at < HEARTBEAT_FRESH_SECONDS


class IngestStatusRecord:
    """Reader and writer of one pipeline's Kafka ingest status hash."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key

    def write(self, *, source: str, state: str, read: int, appended: int, dead: int, batches: int,
              lags: Sequence[PartitionLagRecord]) -> None:
        """Say it is alive and what it did; ``source`` names topics and brokers, never a client option."""
        self.client.hset(self.key, mapping={
            "heartbeat_at": time.time(), "source": source, "state": state, "read": read, "appended": appended,
            "dead": dead, "batches": batches,
            "lags": json.dumps([[p.topic, p.partition, p.lag] for p in lags], separators=(",", ":")),
        })

    def failed(self, error: BaseException | str) -> None:
        self.client.hset(self.key, mapping={"state": "failed", "last_error": short_error(error),
                                            "heartbeat_at": time.time()})

    def read(self) -> IngestStatus | None:
        """The status, or None when no ingest ever wrote one (Kafka not configured, or not started yet)."""
        return IngestStatus.from_hash(self.client.hgetall(self.key))
