"""`lambda-platform up`: the whole platform on one machine, as supervised child processes.

Order: the embedded Redis (unless LAMBDA_REDIS_URL is set), then, on a fresh data dir, sample
events and a first recompute, then the API, the speed layer, the batch scheduler and the demo
traffic. Everything a part needs comes through its environment (LAMBDA_*), so each child is
exactly the command a user could run by hand. Running `up` again on the same data dir resumes:
Delta tables, the Redis AOF and the streaming checkpoint are all under it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rich.console import Console

from batch_layer.master import MasterDataset, dump_jsonl
from batch_layer.publish import redis_client, served_generation
from batch_layer.storage import get_engine
from deploy.redis_server import embedded_redis_argv, embedded_redis_url, ping, wait_for_redis
from deploy.samples import SAMPLES, sample_events
from deploy.settings import Settings
from deploy.supervisor import Child, Supervisor
from serving.keys import Keys
from shared_logic.registry import load_pipeline

log = logging.getLogger(__name__)

DEFAULT_SCHEDULE = "60s"
_CLI = [sys.executable, "-m", "deploy.cli"]


def local_api_key(settings: Settings) -> tuple[str | None, dict[str, list[str]]]:
    """The configured keys, or a local key with every scope kept in the data dir (0600)."""
    if settings.api_keys:
        return None, {k: list(v) for k, v in settings.api_keys.items()}
    path = settings.data_dir.resolve() / "local_api_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(24))
        path.chmod(0o600)
    key = path.read_text().strip()
    return key, {key: ["read", "ingest", "admin"]}


def _env(settings: Settings, redis_url: str, keys: dict[str, list[str]]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({
        "LAMBDA_DATA_DIR": str(settings.data_dir.resolve()),
        "LAMBDA_PIPELINE": settings.pipeline,
        "LAMBDA_REDIS_URL": redis_url,
        "LAMBDA_API_KEYS": json.dumps(keys),
        "LAMBDA_HTTP_HOST": settings.http_host,
        "LAMBDA_HTTP_PORT": str(settings.http_port),
        "LAMBDA_SPARK_MASTER": settings.spark_master,
        "LAMBDA_BATCH_SCHEDULE": settings.batch_schedule or DEFAULT_SCHEDULE,
        "LAMBDA_SPEED_TRIGGER_SECONDS": str(settings.speed_trigger_seconds),
        "LAMBDA_GENERATE_RATE": str(settings.generate_rate),
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")])),
    })
    return env


def run_platform(settings: Settings, *, generate_traffic: bool, console: Console) -> int:
    """Run every part until SIGINT/SIGTERM; returns the exit status."""
    pipeline = load_pipeline(settings.pipeline)
    logs = settings.data_dir.resolve() / "logs"
    key, keys = local_api_key(settings)
    supervisor = Supervisor([])
    redis_url = settings.redis_url or embedded_redis_url(settings.redis_dir)
    env = _env(settings, redis_url, keys)

    if not settings.redis_url and not ping(redis_url):
        settings.redis_dir.mkdir(parents=True, exist_ok=True)
        redis = Child("redis", embedded_redis_argv(settings.redis_dir, daemonize=False), env, logs / "redis.log",
                      stop_last=True)
        supervisor.children.append(redis)
        redis.start()
        wait_for_redis(redis_url, 15, settings.redis_dir / "redis.log")

    master = MasterDataset(settings.master_path, pipeline, get_engine(settings.storage_engine))
    if not settings.master_path.exists() and (events := sample_events(pipeline.name)) is not None:
        with tempfile.TemporaryDirectory() as tmp:
            sample = Path(tmp) / f"{pipeline.name}-sample.jsonl"
            dump_jsonl(events, sample)
            result = master.ingest_file(sample)
        console.print(f"loaded {result.events} sample events into a new master dataset (version {result.version})")
    if served_generation(redis_client(redis_url), Keys(pipeline.name)) is None:
        with console.status("first batch recompute (starting Spark)"), (logs / "batch.log").open("ab") as out:
            first = subprocess.run([*_CLI, "batch", "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
        if first.returncode != 0:
            console.print(f"[red]the first batch recompute failed[/]; see {logs / 'batch.log'}")
            supervisor.stop()
            return 1

    parts = [("api", ["serve"]), ("speed", ["speed", "run"]), ("scheduler", ["batch", "schedule"])]
    if generate_traffic and pipeline.name in SAMPLES:
        parts.append(("generator", ["generate"]))
    for name, args in parts:
        child = Child(name, [*_CLI, *args], env, logs / f"{name}.log")
        supervisor.children.append(child)
        child.start()

    _banner(console, settings, pipeline.views[0].name, key, logs, redis_url)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set():
        supervisor.watch_once()
        stop.wait(0.5)
    console.print("stopping: generator, scheduler, speed layer (after its micro-batch), API, Redis")
    supervisor.stop()
    return 0


def _banner(console: Console, settings: Settings, view: str, key: str | None, logs: Path, redis_url: str) -> None:
    base = f"http://{settings.http_host}:{settings.http_port}"
    auth = f'-H "Authorization: Bearer {key}" ' if key else ""
    console.print(
        f"\n[bold]Lambda platform up[/] (pipeline {settings.pipeline})\n"
        f"  API docs:   {base}/docs\n"
        f"  views:      curl {auth}{base}/v1/views\n"
        f"  a key:      curl {auth}{base}/v1/views/{view}/top\n"
        f"  metrics:    {base}/metrics\n"
        f"  API key:    {key or '(from LAMBDA_API_KEYS)'}  (scopes read, ingest, admin)\n"
        f"  data:       {settings.data_dir.resolve()}\n"
        f"  logs:       {logs}\n"
        f"  Redis:      {redis_url}\n"
        f"  status:     lambda-platform --data-dir {settings.data_dir} status\n"
        "Ctrl-C stops everything.\n",
        soft_wrap=True,
    )
