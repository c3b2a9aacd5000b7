"""The speed layer's heartbeat (``Keys.speed``): what it processed, when it last said so, what it does,
and whether it is failing.

Written by the speed layer (``speed_layer.job``, ``speed_layer.runner``), its health through
``SpeedHealth`` here; read by the API's health and view listing, its metrics and
``lambda-platform status``. This module is the one reader of the hash, and the one writer of its
health fields (``failures``, ``last_error``, ``failed_at``, ``succeeded_at``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import redis
from redis.typing import EncodableT, FieldT

from serving.store.replies import HashReply, text_hash

#: A heartbeat older than this many seconds means the speed layer is down (it beats every 0.5 s).
HEARTBEAT_FRESH_SECONDS = 10.0
#: Most characters of an error kept (and shown): one line, enough to name the problem.
ERROR_CHARS = 300

_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]*:[^/@\s]*@")
_SECRET_WORDS = re.compile(r"(?i)\b(password|passwd|secret|token|api[_-]?key|authorization)([\"']?\s*[:=]\s*)(bearer\s+)?"
                           r"[\"']?[^\s\"',;]+")
_BEARER = re.compile(r"(?i)\bbearer\s+[^\s\"',;]+")
#: A line naming an error: ``ValueError: ...``, ``pyspark.errors....Exception: ...``, ``error: ...``.
_ERROR_LINE = re.compile(r"^(?:[\w.]*(?:Error|Exception|Exit)|error|ERROR|FATAL)\b[^\n]*?:\s*\S")


def redact(message: str) -> str:
    """``message`` without credentials: user:password in URLs, ``password=...``, bearer tokens."""
    message = _CREDENTIALS.sub(r"\1***@", message)
    message = _SECRET_WORDS.sub(lambda m: f"{m.group(1)}{m.group(2)}***", message)
    return _BEARER.sub("Bearer ***", message)


def short_error(error: BaseException | str, limit: int = ERROR_CHARS) -> str:
    """``error`` in one line of at most ``limit`` characters, credentials redacted.

    Spark reports a failed micro-batch as a long text (the query, a Python traceback, a JVM stack):
    the line kept is the last one naming an error (``ValueError: poison``), which is the cause; a
    text without such a line keeps its first non-empty line. An exception is prefixed by its class
    unless the line already names one.
    """
    whole = str(error)
    lines = [line.strip() for line in whole.splitlines() if line.strip()]
    named = [line for line in lines if _ERROR_LINE.match(line) and not line.startswith(("at ", "\tat "))]
    line = named[-1] if named else (lines[0] if lines else "")
    if isinstance(error, BaseException) and not _ERROR_LINE.match(line):
        line = f"{type(error).__name__}: {line}" if line else type(error).__name__
    line = redact(" ".join(line.split()))
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass(frozen=True)
class SpeedHeartbeat:
    """One reading of the speed layer's heartbeat hash."""

    processed: int | None
    """The last master version whose micro-batch is committed (None: never ran)."""
    beat_at: float | None
    """When it last beat (epoch seconds), None if it never ran."""
    state: str | None
    """``running``, ``failed``, or why it waits."""
    ui_url: str | None
    """Its Spark UI, when enabled."""
    batch_id: int | None = None
    """Its last committed micro-batch (None: it has not applied one since Redis has held this hash)."""
    failures: int = 0
    """Failures since its last success (a micro-batch done, or a restarted query caught up); 0: not failing."""
    last_error: str | None = None
    """Its last failure in one line (kept after a success, for the record)."""
    failed_at: float | None = None
    """When it last failed (epoch seconds)."""

    @classmethod
    def from_hash(cls, values: HashReply) -> SpeedHeartbeat:
        """From ``HGETALL Keys.speed`` (bytes or decoded)."""
        fields = text_hash(values)
        return cls(
            processed=int(fields["processed"]) if fields.get("processed") else None,
            beat_at=float(fields["heartbeat_at"]) if fields.get("heartbeat_at") else None,
            state=fields.get("state") or None,
            ui_url=fields.get("ui_url") or None,
            batch_id=int(fields["batch_id"]) if fields.get("batch_id") else None,
            failures=int(fields.get("failures") or 0),
            last_error=fields.get("last_error") or None,
            failed_at=float(fields["failed_at"]) if fields.get("failed_at") else None,
        )

    def seconds_ago(self, now: float | None = None) -> float | None:
        """Seconds since the last beat, None if it never beat."""
        return None if self.beat_at is None else (time.time() if now is None else now) - self.beat_at

    def alive(self, now: float | None = None) -> bool:
        """True when the last beat is fresher than ``HEARTBEAT_FRESH_SECONDS``."""
        ago = self.seconds_ago(now)
        return ago is not None and ago < HEARTBEAT_FRESH_SECONDS

    @property
    def failing(self) -> bool:
        """It failed since its last success (restarting, or given up)."""
        return self.failures > 0

    @property
    def applied(self) -> bool:
        """It has committed a micro-batch (its ``batch_id`` is recorded)."""
        return self.batch_id is not None

    def failure(self) -> str:
        """``<last error> (failed N times since its last success)``: what readiness, status and the console say."""
        times = "once" if self.failures == 1 else f"{self.failures} times"
        return f"{self.last_error or 'no error recorded'} (failed {times} since its last success)"


class SpeedHealth:
    """The writer of the speed layer's heartbeat hash: its beats, its start, its health (a failure, counted,
    with its error; a success, the count back to 0). Each write is one command on the one hash, so readers
    see either."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key

    def beat(self, *, query: str, state: str, ui_url: str) -> None:
        """Say it is alive, which query runs, what it does (``state``) and where its Spark UI is ('' if off)."""
        self.client.hset(self.key, mapping={"heartbeat_at": time.time(), "query": query, "state": state,
                                            "ui_url": ui_url})

    def started(self, *, query: str, started_after: int) -> None:
        """Say query ``query`` runs, after master version ``started_after``."""
        self.client.hset(self.key, mapping={"query": query, "state": "running", "started_after": started_after})

    def rebuilt_from(self, processed: int) -> None:
        """Say what it processed is the served generation ``processed`` (its segments rebuilt from there)."""
        self.client.hset(self.key, "processed", processed)

    def record_failure(self, error: BaseException | str) -> int:
        """Count a failure and keep its error (``short_error``: one line, no credentials); returns the count
        since the last success."""
        count = int(self.client.hincrby(self.key, "failures", 1))
        self.client.hset(self.key, mapping={"last_error": short_error(error), "failed_at": time.time(),
                                            "state": "failed"})
        return count

    def count_duplicates(self, dropped: int) -> None:
        """Add ``dropped`` to the duplicates left out since the hash was made (a replayed micro-batch's count
        again: a figure to watch, not an answer)."""
        if dropped:
            self.client.hincrby(self.key, "duplicates_dropped", dropped)

    def record_success(self, **fields: str | int | float) -> None:
        """Say it succeeded (the failure count back to 0), with ``fields`` (the micro-batch's figures) in the
        same write."""
        mapping: dict[FieldT, EncodableT] = {"failures": 0, "succeeded_at": time.time()}
        for name, value in fields.items():
            mapping.setdefault(name, value)
        self.client.hset(self.key, mapping=mapping)
