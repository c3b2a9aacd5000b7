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
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import redis

from serving.store.connection import redis_client
from serving.store.errors import StoreError
from serving.store.keys import LUA_RUN_NAMES, Keys

RunStatus = Literal["queued", "running", "succeeded", "failed", "skipped"]
RunTrigger = Literal["api", "schedule", "cli"]
ACTIVE_STATUSES = ("queued", "running")
#: Runs kept in the registry; older ones are dropped as new ones arrive (the active one never is).
KEEP_RUNS = 1000
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
        def num(name: str, kind: type = float):
            value = values.get(name)
            return None if value in (None, "") else kind(value)

        flipped = values.get("flipped")
        return cls(
            id=values["id"],
            status=values["status"],  # type: ignore[arg-type]
            trigger=values.get("trigger", "api"),  # type: ignore[arg-type]
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


# --- Lua ------------------------------------------------------------------------------------------
# Every script takes the registry prefix (lp:p:batch) and the caller's clock as ARGV[1], ARGV[2].

_COMMON = LUA_RUN_NAMES + """
local P, now = ARGV[1], ARGV[2]
-- A 'running' run whose lease is not its own was left by a dead scheduler: record it as failed.
local function settle(id)
  local run = run_key(P, id)
  local status = redis.call('HGET', run, 'status')
  if status == 'running' and redis.call('GET', lease_key(P)) ~= id then
    local last = redis.call('HGET', run, 'heartbeat_at') or redis.call('HGET', run, 'started_at') or now
    local started = tonumber(redis.call('HGET', run, 'started_at') or last)
    redis.call('HSET', run, 'status', 'failed', 'finished_at', last, 'duration_seconds', tonumber(last) - started,
               'error', '%(interrupted)s')
    return 'failed'
  end
  return status
end
-- The active run (queued or running), or false.
local function active()
  local id = redis.call('GET', active_key(P))
  if not id then return false end
  local status = settle(id)
  if status == 'queued' or status == 'running' then return id end
  redis.call('DEL', active_key(P))
  return false
end
local function trim(keep)
  local n = redis.call('ZCARD', runs_key(P))
  if n <= keep then return end
  local current = redis.call('GET', active_key(P))
  for _, id in ipairs(redis.call('ZRANGE', runs_key(P), 0, n - keep - 1)) do
    if id ~= current then
      redis.call('ZREM', runs_key(P), id)
      redis.call('DEL', run_key(P, id))
    end
  end
end
local function create(id, status, trigger, force, keep)
  redis.call('HSET', run_key(P, id), 'id', id, 'status', status, 'trigger', trigger, 'force', force, 'requested_at', now)
  redis.call('ZADD', runs_key(P), now, id)
  redis.call('SET', active_key(P), id)
  trim(keep)
end
""".replace("%(interrupted)s", INTERRUPTED + ": the scheduler running it stopped (its lease expired) before it "
                                          "recorded an outcome; the served generation shows what is served")

# ARGV: P, now, id, trigger, force, keep -> {1, record} admitted, or {0, the active run's record}
# (flat HGETALLs read in the same step as the decision, so a conflict names the state that caused it)
_ENQUEUE = _COMMON + """
local current = active()
if current then return {0, redis.call('HGETALL', run_key(P, current))} end
local id = ARGV[3]
create(id, 'queued', ARGV[4], ARGV[5], tonumber(ARGV[6]))
redis.call('RPUSH', queue_key(P), id)
return {1, redis.call('HGETALL', run_key(P, id))}
"""

# ARGV: P, now, owner, lease ms, mode ('queued' | 'new'), new id, trigger, force, keep
# -> {1, id} claimed (running, lease held), {0, id or false} busy / nothing queued
_CLAIM = _COMMON + """
local owner, lease_ms, mode = ARGV[3], ARGV[4], ARGV[5]
local holder = redis.call('GET', lease_key(P))
if holder then return {0, holder} end
local current = active()
local id
if mode == 'queued' then
  while true do
    id = redis.call('LPOP', queue_key(P))
    if not id then return {0, current} end
    if redis.call('HGET', run_key(P, id), 'status') == 'queued' then break end
  end
else
  if current then return {0, current} end
  id = ARGV[6]
  create(id, 'queued', ARGV[7], ARGV[8], tonumber(ARGV[9]))
end
redis.call('SET', active_key(P), id)
redis.call('SET', lease_key(P), id, 'PX', lease_ms)
redis.call('HSET', run_key(P, id), 'status', 'running', 'started_at', now, 'heartbeat_at', now, 'owner', owner)
return {1, id}
"""

# ARGV: P, now, id, lease ms -> 1 renewed, 0 lease lost
_RENEW = _COMMON + """
local id = ARGV[3]
if redis.call('GET', lease_key(P)) ~= id then return 0 end
redis.call('PEXPIRE', lease_key(P), ARGV[4])
redis.call('HSET', run_key(P, id), 'heartbeat_at', now)
return 1
"""

# ARGV: P, now, id, field, value, ... -> 1
_UPDATE = _COMMON + """
local id = ARGV[3]
if #ARGV > 3 and redis.call('EXISTS', run_key(P, id)) == 1 then redis.call('HSET', run_key(P, id), unpack(ARGV, 4)) end
return 1
"""

# ARGV: P, now, id, field, value, ... (the outcome) -> 1
_FINISH = _COMMON + """
local id = ARGV[3]
if redis.call('EXISTS', run_key(P, id)) == 1 then
  redis.call('HSET', run_key(P, id), 'finished_at', now, unpack(ARGV, 4))
  local started = redis.call('HGET', run_key(P, id), 'started_at')
  if started then redis.call('HSET', run_key(P, id), 'duration_seconds', tonumber(now) - tonumber(started)) end
end
if redis.call('GET', lease_key(P)) == id then redis.call('DEL', lease_key(P)) end
if redis.call('GET', active_key(P)) == id then redis.call('DEL', active_key(P)) end
return 1
"""

# ARGV: P, now, id... -> one flat HGETALL per id (settled first; {} when unknown)
_READ = _COMMON + """
local out = {}
for i = 3, #ARGV do
  settle(ARGV[i])
  out[#out + 1] = redis.call('HGETALL', run_key(P, ARGV[i]))
end
return out
"""

# ARGV: P, now, offset, limit -> {active id or '', {flat HGETALL}...} newest first
_LIST = _COMMON + """
local current = active() or ''
local out = {current}
local limit = tonumber(ARGV[4])
if limit < 1 then return out end
for _, id in ipairs(redis.call('ZREVRANGE', runs_key(P), tonumber(ARGV[3]), tonumber(ARGV[3]) + limit - 1)) do
  settle(id)
  out[#out + 1] = redis.call('HGETALL', run_key(P, id))
end
return out
"""


def _flat(values: list[str]) -> dict[str, str]:
    return dict(zip(values[::2], values[1::2]))


def _fields(values: Mapping[str, object]) -> list[object]:
    args: list[object] = []
    for name, value in values.items():
        if value is None:
            value = ""
        elif isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        args += [name, value]
    return args


class RunRegistry:
    """One pipeline's batch runs in Redis: admit, claim, heartbeat, finish, read.

    Thread-safe (redis-py clients are). Times are this process's clock, in epoch seconds; no
    decision depends on comparing clocks of two hosts (dead schedulers are found by lease expiry).
    """

    def __init__(self, client: redis.Redis, pipeline: str, *, keep: int = KEEP_RUNS) -> None:
        self.client, self.pipeline, self.keep = client, pipeline, keep
        self.keys = Keys(pipeline)
        self.prefix = self.keys.batch_prefix
        self._scripts = {
            name: client.register_script(source)
            for name, source in (("enqueue", _ENQUEUE), ("claim", _CLAIM), ("renew", _RENEW), ("update", _UPDATE),
                                 ("finish", _FINISH), ("read", _READ), ("list", _LIST))
        }

    @classmethod
    def from_url(cls, url: str, pipeline: str, *, fail_fast: bool = False, keep: int = KEEP_RUNS) -> RunRegistry:
        return cls(redis_client(url, fail_fast=fail_fast, decode=True), pipeline, keep=keep)

    def close(self) -> None:
        self.client.close()

    def _call(self, name: str, *args: object) -> object:
        return self._scripts[name](args=[self.prefix, repr(time.time()), *args])

    # --- the API side ---------------------------------------------------------------------------
    def enqueue(self, *, trigger: RunTrigger = "api", force: bool = False) -> BatchRun:
        """Queue a run for a scheduler to pick up; RunConflictError if one is queued or running."""
        admitted, values = self._call("enqueue", new_run_id(), trigger, "1" if force else "0", self.keep)
        record = BatchRun.from_hash(_flat(values))
        if not admitted:
            raise RunConflictError(record)
        return record

    def get(self, run_id: str) -> BatchRun | None:
        (values,) = self._call("read", run_id)
        return BatchRun.from_hash(_flat(values)) if values else None

    def recent(self, limit: int = 20, offset: int = 0) -> tuple[str | None, list[BatchRun]]:
        """(id of the active run or None, runs newest first)."""
        reply = self._call("list", offset, limit)
        current, *rows = reply  # type: ignore[misc]
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

    def update(self, run_id: str, **values: object) -> None:
        self._call("update", run_id, *_fields(values))

    def finish(self, run_id: str, status: RunStatus, **values: object) -> BatchRun | None:
        """Record the outcome and free the single-flight slot (lease and active) if this run holds it."""
        self._call("finish", run_id, *_fields({"status": status, **values}))
        return self.get(run_id)

    # --- scheduler presence ---------------------------------------------------------------------
    def announce(self, owner: str, *, schedule: str | None, started_at: float, next_run_at: float | None,
                 ttl_seconds: float = 10.0, ui_url: str | None = None) -> None:
        """Say that scheduler ``owner`` is alive (for ``ttl_seconds``), with its schedule (and Spark UI)."""
        key = self.keys.batch_scheduler(owner)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={
            "owner": owner, "schedule": schedule or "", "started_at": started_at, "seen_at": time.time(),
            "next_run_at": "" if next_run_at is None else next_run_at, "ui_url": ui_url or "",
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
        for owner in self.client.zrange(self.keys.batch_schedulers, 0, -1):
            values = self.client.hgetall(self.keys.batch_scheduler(owner))
            if not values:
                self.client.zrem(self.keys.batch_schedulers, owner)
                continue
            alive.append(SchedulerInfo(
                owner=owner, schedule=values.get("schedule") or None, started_at=float(values["started_at"]),
                seen_at=float(values["seen_at"]),
                next_run_at=float(values["next_run_at"]) if values.get("next_run_at") else None,
                ui_url=values.get("ui_url") or None,
            ))
        return alive
