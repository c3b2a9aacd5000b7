"""`lambda-platform status`: each part of the platform, up or down, with versions and lag."""

from __future__ import annotations

import time

import httpx
import redis
from rich.table import Table

from batch_layer.master import MasterDataset
from batch_layer.runs import RunRegistry
from batch_layer.storage import get_engine
from deploy.redis_server import embedded_redis_url
from deploy.settings import Settings
from serving.keys import Keys
from shared_logic.registry import load_pipeline

_HEARTBEAT_FRESH = 10.0  # seconds


def status_table(settings: Settings) -> Table:
    """A table of the platform's parts; never raises for a part that is down."""
    pipeline = load_pipeline(settings.pipeline)
    keys = Keys(pipeline.name)
    table = Table(title=f"lambda platform: {pipeline.name} ({settings.data_dir.resolve()})")
    for column in ("part", "state", "detail"):
        table.add_column(column)

    master = MasterDataset(settings.master_path, pipeline, get_engine(settings.storage_engine))
    latest = master.engine.latest_version(master.path)
    table.add_row("master dataset", "present" if latest is not None else "empty", f"latest version {latest}")

    url = settings.redis_url or embedded_redis_url(settings.redis_dir)
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError) as e:
        table.add_row("redis", "[red]down[/]", f"{url.split('@')[-1]}: {e}")
        return table
    table.add_row("redis", "[green]up[/]", url.split("@")[-1])

    served = client.get(keys.current)
    meta = client.hgetall(keys.meta(int(served))) if served else {}
    computed = float(meta.get(b"computed_at", 0) or 0)
    table.add_row("batch layer", "[green]served[/]" if served else "[yellow]nothing published[/]",
                  f"generation {int(served)}, computed {time.time() - computed:.0f}s ago" if served else "")

    speed = {k.decode(): v.decode() for k, v in client.hgetall(keys.speed).items()}
    if not speed.get("heartbeat_at"):
        table.add_row("speed layer", "[yellow]never ran[/]", "answers come from the batch generation alone")
    else:
        beat = time.time() - float(speed["heartbeat_at"])
        processed = int(speed["processed"]) if speed.get("processed") else None
        lag = None if latest is None or processed is None else max(0, latest - max(processed, int(served or -1)))
        up = beat < _HEARTBEAT_FRESH
        ui = f", Spark UI {speed['ui_url']}" if up and speed.get("ui_url") else ""
        table.add_row("speed layer", "[green]up[/]" if up else "[red]down[/]",
                      f"processed version {processed}, lag {lag} versions, heartbeat {beat:.0f}s ago{ui}")

    base = f"http://{settings.http_host}:{settings.http_port}"
    try:
        ready = httpx.get(f"{base}/readyz", timeout=2)
        table.add_row("api", "[green]up[/]" if ready.status_code == 200 else "[yellow]not ready[/]",
                      f"{base} ({ready.json().get('detail', '')})")
    except httpx.TransportError:
        table.add_row("api", "[red]down[/]", base)

    registry = RunRegistry.from_url(url, pipeline.name)
    try:
        _, runs = registry.recent(limit=1)
        schedulers = registry.schedulers()
    finally:
        registry.close()
    for scheduler in schedulers:
        ui = f", Spark UI {scheduler.ui_url}" if scheduler.ui_url else ""
        table.add_row("batch scheduler", "[green]up[/]", f"{scheduler.schedule or 'on demand only'}{ui}")
    if runs:
        run = runs[0]
        detail = f"run {run.id}, generation {run.generation}, {run.duration or 0:.1f}s"
        table.add_row("last batch run", run.status, detail + (f": {run.error}" if run.error else ""))
    return table
