"""One long-running loop per pipeline, as threads of one process sharing its SparkSession.

``speed run`` and ``batch schedule`` serve every pipeline of the deployment (``LAMBDA_PIPELINES``)
from one Spark application each: a streaming query, or a scheduler, per pipeline, each with its
own settings (``Settings.for_pipeline``: tables, checkpoint, Redis keys, schedule). Pipelines
share nothing but the JVM, so one pipeline's exactness never depends on another's progress.

A loop that fails stops the others (they finish the step in hand: a micro-batch, a recompute)
and the failure ends the process, so the supervisor restarts all of them together; each
resumes from its own checkpoint or run registry, as after any other restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from deploy.settings import Settings
from shared_logic.pipeline import Pipeline
from shared_logic.registry import load_pipeline

log = logging.getLogger(__name__)

#: What a loop gets: its pipeline's settings, the pipeline, and the event that ends it.
Work = Callable[[Settings, Pipeline, threading.Event], None]


def run_per_pipeline(settings: Settings, work: Work, stop: threading.Event, *, what: str) -> None:
    """Run ``work`` for each pipeline of ``settings`` until ``stop`` is set, then return; re-raise
    the first failure of any of them (after the others have stopped)."""
    names = settings.pipeline_names
    if len(names) == 1:  # no thread: the loop runs (and fails) exactly as it always did
        work(settings.for_pipeline(names[0]), load_pipeline(names[0]), stop)
        return
    failures: list[BaseException] = []

    def run(name: str) -> None:
        try:
            work(settings.for_pipeline(name), load_pipeline(name), stop)
        except BaseException as e:
            log.exception("%s of pipeline %s failed: stopping the other pipelines' too", what, name)
            failures.append(e)
            stop.set()

    threads = [threading.Thread(target=run, args=(name,), name=f"{what}-{name}") for name in names]
    for thread in threads:
        thread.start()
    log.info("%s running for pipelines %s", what, ", ".join(names))
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # a bounded wait keeps this (main) thread free for the signal handler
    if failures:
        raise failures[0]


def application_name(role: str, settings: Settings) -> str:
    """The Spark application's name: ``lambda-speed-wordcount``, ``lambda-speed-wordcount+payments``."""
    return f"lambda-{role}-" + "+".join(load_pipeline(name).name for name in settings.pipeline_names)
