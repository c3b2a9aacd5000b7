"""The batch-run registry (in Redis); the single-flight lock beside it is ``batch_layer.recompute.lock``.

A *batch run* is one recompute asked for by the schedule, over HTTP or from the command line.
Its record is a Redis hash, written as the run progresses: queued -> running -> succeeded,
failed or skipped. Redis layout for pipeline ``p`` (beside ``serving.store.keys``)::

    lp:p:batch:run:{id}          hash: the run's record (``BatchRun``'s fields; times in epoch seconds,
                                 ``rows`` as JSON, ``duration_seconds`` once it ended)
    lp:p:batch:runs              sorted set: run id, scored by the time it was asked for (newest last)
    lp:p:batch:queue             list: ids of runs asked for over HTTP, waiting for a scheduler
    lp:p:batch:active            id of the run queued or running (at most one: single flight)
    lp:p:batch:lease             id of the running run; expires unless its scheduler renews it
    lp:p:batch:schedulers        sorted set of scheduler owners; each one's details under
    lp:p:batch:scheduler:{owner} hash, expiring unless the scheduler keeps announcing itself

Single flight has two locks with two jobs:

* ``RunLock`` (``batch_layer.recompute.lock``), an ``flock`` on ``DATA_DIR/locks/batch-{pipeline}.lock``, is the *execution*
  mutex. Every process that recomputes a data dir holds it for the whole run. The kernel
  releases it the instant the process dies (kill -9 included), and it can never expire under a
  run that is merely slow (a long GC pause, a stopped process), which a lease can. It only covers
  processes that share the data dir's file system, which is what recomputing it needs anyway.
* The lease (``lp:p:batch:lease``, ``SET NX PX``, renewed by a heartbeat) is the *visible*
  state: the API process, which holds no file lock and may run on another host, admits a new
  run only when none is queued or running, and a run whose lease is gone while its record still
  says 'running' was left by a dead scheduler: every read settles it as failed ('interrupted').
  A scheduler claims a run only when it holds the file lock and the lease is free, so schedulers
  on different hosts that share Redis do not overlap either (as long as the lease is renewed).

Every state change is one Lua call, so ten concurrent requests admit exactly one run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import redis
from redis.typing import EncodableT

from serving.store.batch_run import (
    ACTIVE_STATUSES,
    INTERRUPTED,
    BatchRun,
    RunConflictError,
    RunField,
    RunStatus,
    RunTrigger,
    SchedulerInfo,
    new_run_id,
    owner_id,
)
from serving.store.connection import redis_client
from serving.store.errors import StoreUnavailableError
from serving.store.keys import Keys
from serving.store.run_scripts import CLAIM, ENQUEUE, FINISH, LIST, READ, RENEW, UPDATE

__all__ = [
    "ACTIVE_STATUSES", "INTERRUPTED", "KEEP_RUNS", "BatchRun", "RunConflictError", "RunField", "RunRegistry",
    "RunStatus", "RunTrigger", "SchedulerInfo", "new_run_id", "owner_id",
]

#: Runs kept in the registry; older ones are dropped as new ones arrive (the active one never is).
KEEP_RUNS = 1000


def _flat(values: list[str]) -> dict[str, str]:
    return dict(zip(values[::2], values[1::2]))


def _encoded(value: RunField) -> EncodableT:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def _fields(values: Mapping[str, RunField]) -> list[EncodableT]:
    args: list[EncodableT] = []
    for name, value in values.items():
        args += [name, _encoded(value)]
    return args


@contextmanager
def _reachable() -> Iterator[None]:
    """Redis failing, as the store's StoreUnavailableError (what the HTTP API answers 503 for)."""
    try:
        yield
    except redis.RedisError as e:
        raise StoreUnavailableError(f"Redis is unreachable: {e}") from e


class RunRegistry:
    """One pipeline's batch runs in Redis: admit, claim, heartbeat, finish, read.

    Thread-safe (redis-py clients are). Times are this process's clock, in epoch seconds; no
    decision depends on comparing clocks of two hosts (dead schedulers are found by lease expiry).
    The reads and ``enqueue`` (what the API asks) raise StoreUnavailableError when Redis fails; the
    scheduler's side raises redis-py's errors, which its loop waits out.
    """

    def __init__(self, client: redis.Redis, pipeline: str, *, keep: int = KEEP_RUNS) -> None:
        """``client`` must decode replies (``decode_responses=True``, as ``from_url`` makes it)."""
        self.client, self.pipeline, self.keep = client, pipeline, keep
        self.keys = Keys(pipeline)
        self.prefix = self.keys.batch_prefix
        self._scripts = {
            name: client.register_script(source)
            for name, source in (("enqueue", ENQUEUE), ("claim", CLAIM), ("renew", RENEW), ("update", UPDATE),
                                 ("finish", FINISH), ("read", READ), ("list", LIST))
        }

    @classmethod
    def from_url(cls, url: str, pipeline: str, *, fail_fast: bool = False, keep: int = KEEP_RUNS) -> RunRegistry:
        return cls(redis_client(url, fail_fast=fail_fast, decode=True), pipeline, keep=keep)

    def close(self) -> None:
        self.client.close()

    def _call(self, name: str, *args: EncodableT) -> Any:
        """Script ``name``'s reply (redis-py leaves Lua replies untyped; ``run_scripts`` states each shape)."""
        return self._scripts[name](args=[self.prefix, repr(time.time()), *args])

    # --- the API side ---------------------------------------------------------------------------
    def enqueue(self, *, trigger: RunTrigger = "api", force: bool = False) -> BatchRun:
        """Queue a run for a scheduler to pick up; RunConflictError if one is queued or running."""
        with _reachable():
            admitted, values = self._call("enqueue", new_run_id(), trigger, "1" if force else "0", self.keep)
        record = BatchRun.from_hash(_flat(values))
        if not admitted:
            raise RunConflictError(record)
        return record

    def get(self, run_id: str) -> BatchRun | None:
        with _reachable():
            (values,) = self._call("read", run_id)
        return BatchRun.from_hash(_flat(values)) if values else None

    def recent(self, limit: int = 20, offset: int = 0) -> tuple[str | None, list[BatchRun]]:
        """(id of the active run or None, runs newest first)."""
        with _reachable():
            reply = self._call("list", offset, limit)
        current, *rows = reply
        return current or None, [BatchRun.from_hash(_flat(values)) for values in rows if values]

    def active(self) -> BatchRun | None:
        current, _ = self.recent(limit=0)
        return self.get(current) if current else None

    def queued(self) -> int:
        return int(self.client.llen(self.keys.batch_queue))

    # --- the scheduler side ---------------------------------------------------------------------
    def claim(self, owner: str, *, lease_seconds: float, queued: bool, trigger: RunTrigger = "schedule",
              force: bool = False) -> tuple[BatchRun | None, str | None]:
        """Start a run: the oldest queued one (``queued``) or a new one (``trigger``, ``force``).

        Returns (the run, now 'running' with the lease held, None), or (None, id of the run in the
        way, or None when nothing is queued). The caller must hold the ``RunLock``.
        """
        claimed, run_id = self._call(
            "claim", owner, int(lease_seconds * 1000), "queued" if queued else "new", new_run_id(), trigger,
            "1" if force else "0", self.keep,
        )
        if not claimed:
            return None, run_id or None
        return self.get(run_id), None

    def renew(self, run_id: str, *, lease_seconds: float) -> bool:
        """Extend the running run's lease; False if it was lost (expired, or taken over)."""
        return bool(self._call("renew", run_id, int(lease_seconds * 1000)))

    def update(self, run_id: str, **values: RunField) -> None:
        self._call("update", run_id, *_fields(values))

    def finish(self, run_id: str, status: RunStatus, **values: RunField) -> BatchRun | None:
        """Record the outcome and free the single-flight slot (lease and active) if this run holds it."""
        self._call("finish", run_id, *_fields({"status": status, **values}))
        return self.get(run_id)

    # --- scheduler presence ---------------------------------------------------------------------
    def announce(self, owner: str, *, schedule: str | None, started_at: float, next_run_at: float | None,
                 ttl_seconds: float = 10.0, ui_url: str | None = None, upkeep: str | None = None) -> None:
        """Say that scheduler ``owner`` is alive (for ``ttl_seconds``), with its schedule (and Spark UI)."""
        key = self.keys.batch_scheduler(owner)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={
            "owner": owner, "schedule": schedule or "", "started_at": started_at, "seen_at": time.time(),
            "next_run_at": "" if next_run_at is None else next_run_at, "ui_url": ui_url or "",
            "upkeep": upkeep or "",
        })
        pipe.pexpire(key, int(ttl_seconds * 1000))
        pipe.zadd(self.keys.batch_schedulers, {owner: started_at})
        pipe.execute()

    def retire(self, owner: str) -> None:
        """Scheduler ``owner`` stopped."""
        self.client.delete(self.keys.batch_scheduler(owner))
        self.client.zrem(self.keys.batch_schedulers, owner)

    def schedulers(self) -> list[SchedulerInfo]:
        """Schedulers alive now (their announcement has not expired), oldest first."""
        alive: list[SchedulerInfo] = []
        with _reachable():
            # The registry's client decodes replies (see __init__); ZRANGE without WITHSCORES answers members only.
            for owner in cast("list[str]", self.client.zrange(self.keys.batch_schedulers, 0, -1)):
                values = cast("dict[str, str]", self.client.hgetall(self.keys.batch_scheduler(owner)))
                if not values:
                    self.client.zrem(self.keys.batch_schedulers, owner)
                    continue
                alive.append(SchedulerInfo(
                    owner=owner, schedule=values.get("schedule") or None, started_at=float(values["started_at"]),
                    seen_at=float(values["seen_at"]),
                    next_run_at=float(values["next_run_at"]) if values.get("next_run_at") else None,
                    ui_url=values.get("ui_url") or None, upkeep=values.get("upkeep") or None,
                ))
        return alive
