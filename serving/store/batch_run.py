"""A batch run's record and a scheduler's announcement, as the registry (``serving.store.runs``) stores them."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast

from serving.store.errors import StoreError

RunStatus = Literal["queued", "running", "succeeded", "failed", "skipped"]
RunTrigger = Literal["api", "schedule", "cli"]
ACTIVE_STATUSES = ("queued", "running")
#: A value of a run's record as callers give it (``RunRegistry.update`` / ``finish`` encode it for Redis).
RunField: TypeAlias = "str | int | float | bool | dict[str, int] | list[dict[str, str | int | float | None]] | None"
#: Error of a run whose scheduler died (or lost Redis for longer than its lease) before it finished.
INTERRUPTED = "interrupted"


class RunConflictError(StoreError):
    """A batch run is already queued or running; ``active`` is its record."""

    def __init__(self, active: BatchRun) -> None:
        self.active = active
        since = active.started_at if active.status == "running" else active.requested_at
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if since else "just now"
        super().__init__(
            f"batch run {active.id} is already {active.status} (since {when}); one run at a time: "
            "wait for it to end, then ask again"
        )


def owner_id() -> str:
    """A name for this process and instance: host:pid:random."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class BatchRun:
    """One batch run's record, as stored in Redis (times are epoch seconds)."""

    id: str
    status: RunStatus
    trigger: RunTrigger
    requested_at: float
    force: bool = False
    started_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None
    owner: str | None = None
    master_version: int | None = None
    served_before: int | None = None
    generation: int | None = None
    flipped: bool | None = None
    events: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    #: The run's stages so far, in order (``batch_layer.recompute.stages``: name, view, started_at, seconds, count, unit).
    stages: list[dict[str, str | int | float | None]] = field(default_factory=list)
    recompute_id: str | None = None
    skip_reason: str | None = None
    error: str | None = None

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at if self.finished_at is not None else (time.time() if self.status == "running" else None)
        return None if end is None else max(0.0, end - self.started_at)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @classmethod
    def from_hash(cls, values: Mapping[str, str]) -> BatchRun:
        def num(name: str, kind: type = float) -> Any:
            value = values.get(name)
            return None if value in (None, "") else kind(value)

        flipped = values.get("flipped")
        return cls(
            id=values["id"],
            status=cast(RunStatus, values["status"]),  # written only from RunStatus values
            trigger=cast(RunTrigger, values.get("trigger", "api")),  # likewise from RunTrigger
            requested_at=float(values.get("requested_at") or 0.0),
            force=values.get("force") == "1",
            started_at=num("started_at"),
            finished_at=num("finished_at"),
            heartbeat_at=num("heartbeat_at"),
            owner=values.get("owner") or None,
            master_version=num("master_version", int),
            served_before=num("served_before", int),
            generation=num("generation", int),
            flipped=None if flipped in (None, "") else flipped == "1",
            events=num("events", int),
            rows=json.loads(values["rows"]) if values.get("rows") else {},
            stages=json.loads(values["stages"]) if values.get("stages") else [],
            recompute_id=values.get("recompute_id") or None,
            skip_reason=values.get("skip_reason") or None,
            error=values.get("error") or None,
        )


@dataclass(frozen=True)
class SchedulerInfo:
    """A scheduler process that announced itself recently."""

    owner: str
    schedule: str | None
    started_at: float
    seen_at: float
    next_run_at: float | None
    ui_url: str | None = None
    upkeep: str | None = None
    """Its last upkeep of the master dataset (compaction, log trim), one line."""
