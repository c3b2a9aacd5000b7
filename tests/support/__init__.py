"""Helpers that several test files need: free ports, polling, the command line, ingest, the scheduler.

Plain functions, no fixtures (those live in the conftest files). Nothing here is a fake: ingest
writes the real master dataset, the scheduler runs in a real thread with the session's Spark.
Larger groups live beside this module, one per noun (``flights``, ``key_pages``, ``master``, ``metrics``,
``payments``, ``published``, ``s3``, ``servers``, ``speed``, ...). A test module imports its helpers from
here, never from another test module or a conftest (``tests/test_layout.py`` checks).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pytest

from batch_layer.master.dataset import IngestResult, MasterDataset
from deploy.scheduling.scheduler import run_scheduler
from deploy.settings import Settings
from serving.store.connection import redis_client
from serving.store.keys import Keys
from serving.store.runs import BatchRun, RunRegistry
from serving.store.session import PipelineStore
from shared_logic.pipeline import Pipeline
from shared_logic.registry import load_pipeline

T = TypeVar("T")

#: The command line as a user runs it (``lambda-platform``), from this interpreter.
CLI = (sys.executable, "-m", "deploy.cli")

#: A deprecated Spark setting that makes every JVM print one known WARN line at start (as ``LAMBDA_SPARK_CONF``),
#: and that line: how a test sees where a command's JVM lines go.
NOISY_SPARK_CONF = json.dumps({"spark.cache.class": "x"})
NOISY_SPARK_WARN = "The configuration key 'spark.cache.class' has been deprecated"
#: A line of the JVM's: log4j's (``... WARN ...``) or the JVM's own (``WARNING: Using incubator modules``).
JVM_LINE = (" WARN ", "WARNING:")

#: A user's own pipeline module, as a user writes it: the project's example (clicks counted and summed per
#: site section), written by tests into a folder outside the project.
CLICKS_PIPELINE = (Path(__file__).resolve().parents[2] / "deploy" / "pipelines" / "clicks.py").read_text()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], T], what: str = "condition", timeout: float = 180, *, poll: float = 0.1,
             ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``check`` every ``poll`` seconds until it returns something truthy, and return that.

    An exception of a type in ``ignoring`` counts as "not yet". AssertionError naming ``what`` once
    ``timeout`` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except ignoring:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


def run_cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``lambda-platform ARGS`` in a subprocess with ``env``; its exit code and output (text)."""
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def installed_command() -> list[str]:
    """The console script `pip install` made (it has no current folder on sys.path), or its equivalent."""
    script = Path(sys.executable).with_name("lambda-platform")
    if script.exists():
        return [str(script)]
    if sys.version_info < (3, 11):
        pytest.skip("needs the installed console script or python -P")
    return [sys.executable, "-P", "-m", "deploy.cli"]


def cli(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed ``lambda-platform ARGS`` run from ``folder`` as a user runs it: this environment without
    its ``LAMBDA_*`` variables, plus ``env``; its exit code and output (text)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    environment.update(env)
    return subprocess.run([*installed_command(), *args], cwd=folder, env=environment, capture_output=True,
                          text=True, timeout=180)


def key_url(view: str, key: str) -> str:
    """The API path of one key of a view (the key percent-encoded)."""
    return f"/v1/views/{view}/keys/{quote(key, safe='')}"


def ingest_file(settings: Settings, events: list[dict[str, Any]], file: Path) -> IngestResult:
    """Write ``events`` as JSON Lines (UTF-8, non-ASCII kept) and ingest the file."""
    with file.open("w", encoding="utf-8") as fh:
        for event in events:
            fh.write(json.dumps(event, ensure_ascii=False) + "\n")
    master = MasterDataset.open(settings, load_pipeline(settings.pipeline))
    return master.ingest_file(file)


def ingest_texts(settings: Settings, texts: list[str]) -> int:
    """Append wordcount events (one per text) in one commit; returns its master version."""
    pipeline = load_pipeline(settings.pipeline)
    master = MasterDataset.open(settings, pipeline)
    return master.append(pipeline.schema.validate([{"text": t} for t in texts]))


def registry(settings: Settings) -> RunRegistry:
    """The batch-run registry of ``settings``' pipeline."""
    return RunRegistry.from_url(settings.redis_url, load_pipeline(settings.pipeline).name)


def runs_with(runs: RunRegistry, status: str) -> list[BatchRun]:
    """The recent runs (up to 100) in ``status``."""
    return [r for r in runs.recent(limit=100)[1] if r.status == status]


def served_generation(settings: Settings) -> int | None:
    """The generation Redis serves for ``settings``' pipeline, None before the first publish."""
    return PipelineStore(redis_client(settings.redis_url), Keys(settings.pipeline)).served_generation()


@contextmanager
def scheduler_thread(spark: Any, settings: Settings, name: str = "scheduler",
                     pipeline: Pipeline | None = None) -> Iterator[threading.Event]:
    """``run_scheduler`` in a thread of this process (the session's SparkSession), of ``pipeline`` (default: the
    settings' one); stopped on exit."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_scheduler(spark, settings, pipeline or load_pipeline(settings.pipeline), redis_url=settings.redis_url,
                          stop=stop)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(180)
        assert not thread.is_alive(), f"{name} did not stop"
    if errors:
        raise errors[0]
