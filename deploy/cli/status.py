"""`lambda-platform status`: every part of one pipeline's platform, up, down or failing, always.

The parts, in order: the master dataset, Redis, the batch layer (a generation served), the speed
layer (a fresh heartbeat), the API (ready, and serving this pipeline), the batch scheduler (one
announced itself) and the last batch run (it did not fail). A part that cannot be reached is
reported down with the reason; nothing is ever left out. A part is *failing* when it failed since
its last success: the speed layer by its own record in Redis (``SpeedHeartbeat.failing``: its last
error and how many times), any part `up` supervises by the supervisor's record (``read_children``:
restarting, with its last exit, restarts and the last error line of its log). The platform is
*serving* when Redis is up, a generation is published, the API answers ready for this pipeline and
no part is failing: ``status`` exits 0 then, 1 otherwise. Nothing here starts anything (the
embedded Redis is only pinged).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis
from redis.exceptions import RedisClusterException
from rich.markup import escape
from rich.table import Table

from batch_layer.master.dataset import MasterDataset
from deploy.runtime.redis_server import embedded_redis_url
from deploy.settings import Settings
from deploy.supervision.supervisor import read_children
from serving.store.connection import is_cluster, redis_client
from serving.store.errors import StoreUnavailableError
from serving.store.ingest_status import IngestStatusRecord
from serving.store.keys import Keys
from serving.store.runs import RunRegistry
from serving.store.session import PipelineStore
from shared_logic.registry import load_pipeline

PARTS = ("master dataset", "redis", "batch layer", "speed layer", "api", "scheduler", "last batch run")
_TIMEOUT = 2.0
#: The part each child of `up` runs (``deploy.supervision.launcher``).
_CHILD_PARTS = {"redis": "redis", "api": "api", "speed": "speed layer", "scheduler": "scheduler",
                "kafka-ingest": "kafka ingest"}
#: The Kafka ingest's part, shown when Kafka is configured.
_KAFKA = "kafka ingest"


@dataclass
class Part:
    """One part of the platform: up or down, why, and figures for scripts (``--json``)."""

    name: str
    up: bool
    detail: str
    facts: dict[str, Any] = field(default_factory=dict)
    #: It failed since its last success (restarting, or given up); never ``up`` then.
    failing: bool = False

    @property
    def state(self) -> str:
        return "failing" if self.failing else "up" if self.up else "down"

    def fail(self, why: str, **facts: Any) -> None:
        """Mark the part failing, saying ``why`` first (after what an earlier ``fail`` said)."""
        if self.failing:
            self.detail += f"; {why}"
        else:
            self.detail = f"failing: {why}" + (f"; {self.detail}" if self.detail else "")
        self.up, self.failing = False, True
        self.facts.update(facts)


@dataclass
class PlatformStatus:
    """Every part of one pipeline's platform; ``serving`` when answers can be served now."""

    pipeline: str
    data_dir: str
    parts: list[Part]

    @property
    def serving(self) -> bool:
        by_name = {p.name: p for p in self.parts}
        return all(by_name[name].up for name in ("redis", "batch layer", "api")) and not self.failing

    @property
    def failing(self) -> list[str]:
        """The parts failing."""
        return [p.name for p in self.parts if p.failing]

    def as_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "data_dir": self.data_dir, "serving": self.serving, "failing": self.failing,
            "parts": [{"part": p.name, "state": p.state, "detail": p.detail, **p.facts} for p in self.parts],
        }

    def table(self) -> Table:
        verdict = "[green]serving[/]" if self.serving else "[red]not serving[/]"
        if self.failing:
            verdict += f" ([red]{', '.join(self.failing)} failing[/])"
        table = Table(title=f"lambda platform: pipeline {self.pipeline} ({self.data_dir}): {verdict}")
        for column in ("part", "state", "detail"):
            table.add_column(column)
        colours = {"up": "green", "down": "red", "failing": "bold red"}
        for part in self.parts:
            table.add_row(part.name, f"[{colours[part.state]}]{part.state}[/]", escape(part.detail))  # errors hold [...]
        return table


def platform_status(settings: Settings, api_key: str | None = None) -> PlatformStatus:
    """Probe every part of ``settings.pipeline``'s platform; never raises for a part that is down.

    ``api_key`` (sent as a bearer token) lets the probe read the API's view list when reads need a key.
    """
    pipeline = load_pipeline(settings.pipeline)
    parts: dict[str, Part] = {}
    latest = _master(settings, pipeline, parts)
    url = settings.redis_url or embedded_redis_url(settings.redis_dir)
    try:
        client = redis_client(url, fail_fast=True, decode=True) if is_cluster(url) else redis.Redis.from_url(
            url, socket_connect_timeout=_TIMEOUT, socket_timeout=_TIMEOUT, decode_responses=True)
    except (redis.RedisError, RedisClusterException, OSError) as e:  # a cluster client asks for its slot map at once
        _unreachable(url, e, parts)
    else:
        try:
            _redis_parts(client, url, pipeline.name, latest, parts, pipeline.logic)
            if settings.kafka_bootstrap is not None and parts["redis"].up:
                parts[_KAFKA] = _kafka_ingest(client, Keys(pipeline.name))
        finally:
            client.close()
    parts["api"] = _api(settings, pipeline.name, api_key)
    if settings.kafka_bootstrap is not None:
        parts.setdefault(_KAFKA, Part(_KAFKA, False, "unknown: Redis is unreachable"))
    _supervised(settings, parts)
    names = [*PARTS, _KAFKA] if _KAFKA in parts else PARTS
    return PlatformStatus(pipeline.name, str(settings.data_dir.resolve()), [parts[name] for name in names])


def _kafka_ingest(client: redis.Redis, keys: Keys) -> Part:
    """The Kafka ingest's own record: alive, its counts since it started, its lag per partition."""
    try:
        status = IngestStatusRecord(client, keys.kafka).read()
    except (redis.RedisError, OSError) as e:
        return Part(_KAFKA, False, f"cannot read it from Redis: {e}")
    if status is None:
        return Part(_KAFKA, False, "not started yet: `up` runs it, or `lambda-platform kafka ingest`")
    lags = {f"{p.topic}/{p.partition}": p.lag for p in status.lags}
    alive, said = status.alive(), ""
    if not alive:
        said = " (no heartbeat: stopped)"
    elif status.state not in ("running", "failed"):  # alive, not running: it says why (waiting for a topic)
        said = f" ({status.state})"
    part = Part(_KAFKA, alive and status.state == "running",
                f"{status.source}: read {status.read:,}, appended {status.appended:,}, dead letters {status.dead:,}, "
                f"lag {status.lag:,} records{said}",
                {"read": status.read, "appended": status.appended, "dead_letters": status.dead, "lag": status.lag,
                 "partition_lag": lags})
    if status.state == "failed":
        part.fail(status.last_error or "failed", last_error=status.last_error)
    return part


def _supervised(settings: Settings, parts: dict[str, Part]) -> None:
    """Mark failing the parts whose process `up`'s supervisor is restarting (it records them beside the logs)."""
    children = read_children(settings.data_dir.resolve() / "logs")
    for child in (children or {}).values():
        part = parts.get(_CHILD_PARTS.get(child.name, ""))
        if part is None:
            continue
        part.facts["restarts"] = child.restarts
        if child.failing():
            part.fail(f"restarting: {child.failure()}", last_exit=child.last_exit,
                      last_error=part.facts.get("last_error") or child.last_error)


def _master(settings: Settings, pipeline: Any, parts: dict[str, Part]) -> int | None:
    master = MasterDataset.open(settings, pipeline)
    try:
        latest = master.engine.latest_version(master.path)
    except Exception as e:
        parts["master dataset"] = Part("master dataset", False, f"{master.path}: cannot read it: {e}")
        return None
    if latest is None:
        parts["master dataset"] = Part("master dataset", False, f"no master dataset at {master.path} yet")
    else:
        parts["master dataset"] = Part("master dataset", True, f"latest version {latest}",
                                       {"latest_version": latest})
    return latest


def _unreachable(url: str, e: Exception, parts: dict[str, Part]) -> None:
    where = url.split("@")[-1]
    parts["redis"] = Part("redis", False, f"{where}: {e}")
    for name in ("batch layer", "speed layer", "scheduler", "last batch run"):
        parts[name] = Part(name, False, f"unknown: Redis is unreachable at {where}")


def _redis_parts(client: redis.Redis, url: str, pipeline: str, latest: int | None, parts: dict[str, Part],
                 logic: str = "") -> None:
    where = url.split("@")[-1]
    try:
        client.ping()
    except (redis.RedisError, OSError) as e:
        _unreachable(url, e, parts)
        return
    parts["redis"] = Part("redis", True, where)
    store = PipelineStore(client, Keys(pipeline))
    registry = RunRegistry(client, pipeline)
    served: int | None = None
    probes = (("batch layer", lambda: _served(store, logic)), ("speed layer", lambda: _speed(store, latest, served)),
              ("scheduler", lambda: _scheduler(registry)), ("last batch run", lambda: _last_run(registry)))
    for name, probe in probes:
        try:
            parts[name] = probe()
        except (redis.RedisError, OSError, ValueError) as e:
            parts[name] = Part(name, False, f"cannot read it from Redis: {e}")
        except StoreUnavailableError as e:  # the registry's reads: the Redis error is the cause
            parts[name] = Part(name, False, f"cannot read it from Redis: {e.__cause__ or e}")
        if name == "batch layer":
            served = parts[name].facts.get("generation")


def _served(store: PipelineStore, logic: str) -> Part:
    served = store.served_generation()
    if served is None:
        return Part("batch layer", False, "nothing published yet: no batch generation is served")
    meta = store.generation_meta(served)
    age = f", computed {time.time() - meta.computed_at:.0f}s ago" if meta.computed_at else ""
    served_logic = meta.logic
    detail = f"serving generation {served}{age}, logic {served_logic or 'unrecorded'}"
    if logic and served_logic != logic:
        detail += f"; this pipeline code is logic {logic}: a recompute under it is pending"
    return Part("batch layer", True, detail,
                {"generation": served, "logic": served_logic or None, "pending_logic": logic if served_logic != logic else None})


def _speed(store: PipelineStore, latest: int | None, served: int | None) -> Part:
    speed = store.speed_heartbeat()
    beat = speed.seconds_ago()
    if beat is None:
        part = Part("speed layer", False, "never ran: answers come from the batch generation alone",
                    {"failures": speed.failures})
        if speed.failing:
            part.fail(speed.failure(), last_error=speed.last_error)
        return part
    processed = speed.processed
    lag = None if latest is None or processed is None else max(0, latest - max(processed, served or -1))
    up = speed.alive()
    ui = speed.ui_url if up else None
    facts = {"processed_version": processed, "lag_versions": lag, "heartbeat_seconds_ago": round(beat, 1),
             "spark_ui": ui or None, "failures": speed.failures}
    waiting = f", {speed.state}" if speed.state and speed.state not in ("running", "failed") else ""
    unapplied = ", has not applied a micro-batch yet" if not speed.applied and lag else ""
    part = Part("speed layer", up, f"processed version {processed}, lag {lag} versions, heartbeat {beat:.0f}s ago"
                + (f", Spark UI {ui}" if ui else "") + waiting + unapplied, facts)
    if speed.failing:
        part.fail(speed.failure(), last_error=speed.last_error)
    return part


def _scheduler(registry: RunRegistry) -> Part:
    alive = registry.schedulers()
    if not alive:
        return Part("scheduler", False, "no batch scheduler is running (`lambda-platform batch schedule`)")
    first = alive[0]
    when = f", next run in {max(0.0, first.next_run_at - time.time()):.0f}s" if first.next_run_at else ""
    schedule = f"schedule {first.schedule}" if first.schedule else "on-demand runs only"
    more = f" ({len(alive)} schedulers)" if len(alive) > 1 else ""
    ui = f", Spark UI {first.ui_url}" if first.ui_url else ""
    upkeep = f"; upkeep: {first.upkeep}" if first.upkeep else ""
    return Part("scheduler", True, f"{schedule}{when}{more}{ui}{upkeep}",
                {"schedulers": len(alive), "schedule": first.schedule, "spark_ui": first.ui_url, "upkeep": first.upkeep})


def _last_run(registry: RunRegistry) -> Part:
    _, runs = registry.recent(limit=1)
    if not runs:
        return Part("last batch run", False, "no batch run recorded yet")
    run = runs[0]
    detail = f"run {run.id} {run.status}"
    if run.generation is not None:
        detail += f", generation {run.generation}"
    if run.duration is not None:
        detail += f", {run.duration:.1f}s"
    reason = run.error or run.skip_reason
    facts = {"run": run.id, "status": run.status, "generation": run.generation}
    return Part("last batch run", run.status not in ("failed", "interrupted"),
                detail + (f": {reason}" if reason else ""), facts)


def _api(settings: Settings, pipeline: str, api_key: str | None) -> Part:
    base = settings.api_url
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=_TIMEOUT) as http:
            ready = http.get("/readyz")
            views = http.get(f"{settings.api_routes}/views")
    except httpx.HTTPError as e:
        return Part("api", False, f"{base}: not reachable ({type(e).__name__})")
    served = _json(views).get("pipeline") if views.status_code == 200 else None
    if served is not None and served != pipeline:
        return Part("api", False, f"{base} serves pipeline {served!r}, not {pipeline!r}", {"url": base})
    detail = _json(ready).get("detail", "")
    if ready.status_code != 200:
        return Part("api", False, f"{base}: not ready ({ready.status_code}): {detail}", {"url": base})
    if served is None:
        return Part("api", False, f"{base}: cannot tell which pipeline it serves (GET /v1/views answered "
                                  f"{views.status_code}); set LAMBDA_API_KEYS to a key with scope 'read'", {"url": base})
    return Part("api", True, f"{base}: {detail}", {"url": base})


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}

