"""What the chaos writer sent and what the platform acknowledged: the reader's bound and the audit's input.

A request's words enter ``sent_words`` *before* its first attempt goes out. An answer can only
count events whose request had been sent before the answer came back, so after any answer
``baseline[word] + sent_words[word]`` is an upper bound that is never wrong: it covers every
acknowledged event plus the request in flight (which may be committed before it is answered).
The writer retries every request until it is acknowledged, so once the writer has stopped,
sent = acknowledged (save requests given up on, which the audit reports).
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests import oracle


def app_id(idempotency_key: str) -> str:
    """The Delta application transaction id the API records for ``idempotency_key`` (serving/api/idempotency.py)."""
    return "ingest:" + hashlib.sha256(idempotency_key.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass
class IngestRequest:
    """One POST /v1/events: its Idempotency-Key, its events, and what became of it."""

    key: str
    events: list[dict[str, Any]]
    attempts: int = 0
    #: Master version of the 202 answer; None until acknowledged.
    version: int | None = None
    replayed: bool = False
    #: Why the writer gave up on it (never acknowledged), else None.
    gave_up: str | None = None
    words: Counter[str] = field(init=False)

    def __post_init__(self) -> None:
        self.words = Counter(w for e in self.events for w in oracle.words(e["text"]))

    @property
    def app_id(self) -> str:
        return app_id(self.key)

    @property
    def acknowledged(self) -> bool:
        return self.version is not None

    def oracle_events(self) -> list[dict[str, Any]]:
        """The events as the oracle reads them (event_time as a datetime)."""
        return [{"text": e["text"], "event_time": datetime.fromisoformat(e["event_time"].replace("Z", "+00:00"))}
                for e in self.events]


class Ledger:
    """Thread-safe record of every request; ``bound(word)`` is the reader's upper bound."""

    def __init__(self, baseline: Counter[str]) -> None:
        self.baseline = baseline
        self._lock = threading.Lock()
        self._sent: Counter[str] = Counter()
        self.requests: list[IngestRequest] = []

    def begin(self, request: IngestRequest) -> None:
        """Call before the first attempt is sent."""
        with self._lock:
            self._sent.update(request.words)
            self.requests.append(request)

    def acknowledge(self, request: IngestRequest, version: int, replayed: bool) -> None:
        with self._lock:
            request.version, request.replayed = version, replayed

    def bound(self, word: str) -> int:
        """Most events with ``word`` any answer received so far can count (baseline + sent)."""
        with self._lock:
            return self.baseline[word] + self._sent[word]

    def snapshot(self) -> list[IngestRequest]:
        with self._lock:
            return list(self.requests)

    def acknowledged(self) -> list[IngestRequest]:
        return [r for r in self.snapshot() if r.acknowledged]

    def latest_version(self) -> int | None:
        """The newest master version any acknowledgement named (None before the first)."""
        versions = [r.version for r in self.snapshot() if r.version is not None]
        return max(versions) if versions else None

    def acknowledged_events(self) -> int:
        return sum(len(r.events) for r in self.acknowledged())
