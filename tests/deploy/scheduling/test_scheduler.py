"""The batch scheduler against real parts: Spark (the session's), Redis, Delta tables.

* An interval schedule runs a recompute when the master dataset changed, and records a skip on
  the next tick when it did not; the run's generation is its barrier's master version (a barrier
  row at that version, read with ``deltalake``) and is what Redis serves.
* Two schedulers on one data dir (two threads, two file-lock handles) never run at once: the run
  records' [start, end] intervals never overlap.
* A scheduler process killed with SIGKILL mid-run frees the file lock at once; its run reads as
  failed ('interrupted') once its lease expires, and a new run is admitted.
* A run that fails is recorded as failed with the error.
* ``run_now`` (for ``lambda-platform batch run``) is recorded and refuses while another process
  holds the lock or a run is queued.
* Schedules: intervals and cron expressions (UTC), and clear messages for bad ones; a scheduler started
  again goes on with the grid of the last run that finished within an interval (no recompute at once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
import redis
from deltalake import DeltaTable

from batch_layer.errors import RunInProgressError
from batch_layer.faults import injected
from batch_layer.recompute.lock import RunLock
from deploy.errors import ConfigError
from deploy.scheduling.scheduler import _first_due, parse_schedule, run_now
from deploy.settings import Settings
from serving.store.keys import Keys
from serving.store.logic import generation_logic
from serving.store.runs import RunConflictError
from shared_logic.pipelines.wordcount import WordCount
from shared_logic.registry import load_pipeline
from tests import oracle
from tests.support import ingest_texts, registry, runs_with, scheduler_thread, served_generation, wait_for

ROOT = Path(__file__).resolve().parents[3]
TERMINAL = ("succeeded", "failed", "skipped")


def barrier_kinds(settings: Settings, version: int) -> list[str]:
    """The ``_kind`` of every row the master dataset's commit ``version`` added."""
    cdf = DeltaTable(str(settings.master_path)).load_cdf(starting_version=version, ending_version=version)
    return pa.RecordBatchReader.from_stream(cdf).read_all().column("_kind").to_pylist()


# --- interval schedule: run when changed, skip when not ---------------------------------------------

@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_interval_schedule_runs_when_master_changed_and_skips_when_unchanged(spark, make_settings) -> None:
    settings = make_settings(batch_schedule="1s")
    texts = ["the cat sat", "the dog", "a cat"]
    version = ingest_texts(settings, texts)
    runs = registry(settings)

    with scheduler_thread(spark, settings):
        done = wait_for(lambda: runs_with(runs, "succeeded"), what="a scheduled run to succeed")
        assert [(s.schedule, s.next_run_at is not None) for s in runs.schedulers()] == [("1s", True)]
        skipped = wait_for(lambda: runs_with(runs, "skipped"), timeout=30, what="the next tick to be skipped")

    [run] = done
    assert run.trigger == "schedule" and not run.force
    assert run.master_version == version, "the run saw the ingest as the latest master version"
    assert run.generation == version + 1, "the generation is the barrier appended after the ingest"
    assert barrier_kinds(settings, run.generation) == ["barrier"]
    assert served_generation(settings) == run.generation and run.flipped is True
    assert run.events == len(texts)
    assert run.rows["word_counts"] == len({w for t in texts for w in t.split()})
    assert run.started_at is not None and run.finished_at is not None and run.duration and run.duration > 0
    assert run.error is None and run.recompute_id

    skip = skipped[-1]  # the first skip after the run
    assert skip.started_at >= run.finished_at
    assert skip.generation == run.generation and skip.master_version == run.generation
    assert "not changed since generation" in skip.skip_reason
    # Only the one run appended a barrier: a skip never touches the master dataset.
    assert DeltaTable(str(settings.master_path)).version() == run.generation
    assert runs.active() is None, "nothing queued or running after the scheduler stopped"


# --- single flight between two schedulers -----------------------------------------------------------

@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_two_schedulers_on_one_data_dir_never_run_at_once(spark, make_settings) -> None:
    settings = make_settings(batch_schedule="1s")
    ingest_texts(settings, ["one two", "two three"])
    runs = registry(settings)

    with scheduler_thread(spark, settings, "scheduler-a"), scheduler_thread(spark, settings, "scheduler-b"):
        wait_for(lambda: len(runs_with(runs, "succeeded")) == 1, what="the first run")
        second = ingest_texts(settings, ["three four"])
        wait_for(lambda: len(runs_with(runs, "succeeded")) == 2, what="a run over the second ingest")
        time.sleep(1.5)  # a few more ticks from both schedulers, all skipped

    _, recent = runs.recent(limit=500)
    ran = sorted((r for r in recent if r.started_at is not None), key=lambda r: r.started_at)
    assert all(r.status in TERMINAL for r in ran), [r.status for r in ran]
    for before, after in zip(ran, ran[1:]):
        assert before.finished_at <= after.started_at, f"runs {before.id} and {after.id} overlap"
    succeeded = [r for r in ran if r.status == "succeeded"]
    assert [r.master_version for r in succeeded][1] == second
    assert succeeded[0].generation < succeeded[1].generation == served_generation(settings)
    assert len({r.owner for r in ran}) >= 1 and all(r.status == "skipped" for r in ran if r not in succeeded)
    assert len(runs.schedulers()) == 0, "both schedulers retired on stop"


# --- a killed scheduler: lock freed by the OS, run read as interrupted -------------------------------

CHILD = """
import sys, time
from pathlib import Path
from batch_layer.recompute.lock import RunLock
from serving.store.runs import RunRegistry
lock = RunLock(Path(sys.argv[1]))
assert lock.acquire("child")
registry = RunRegistry.from_url(sys.argv[2], "wordcount")
run, _ = registry.claim("child", lease_seconds=float(sys.argv[3]), queued=True)
registry.renew(run.id, lease_seconds=float(sys.argv[3]))
print(run.id, flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # a subprocess killed with SIGKILL
def test_killed_scheduler_frees_the_lock_and_its_run_reads_as_interrupted(make_settings) -> None:
    settings = make_settings()
    runs = registry(settings)
    queued = runs.enqueue(trigger="api")
    lock = RunLock.for_pipeline(settings.data_dir, settings.pipeline_slug)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(lock.path), settings.redis_url, "1.0"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == queued.id
        running = runs.get(queued.id)
        assert running.status == "running" and running.started_at is not None
        assert not lock.acquire("test"), "the child holds the file lock"
        with pytest.raises(RunConflictError, match=f"{queued.id} is already running"):
            runs.enqueue()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)

    assert lock.acquire("test"), "the kernel released the dead process's flock at once"
    lock.release()
    interrupted = wait_for(lambda: (r := runs.get(queued.id)).status != "running" and r, timeout=10,
                           what="the lease to expire")
    assert interrupted.status == "failed" and interrupted.error.startswith("interrupted:")
    assert interrupted.finished_at == interrupted.heartbeat_at, "ended at its last sign of life"
    again = runs.enqueue()
    assert again.status == "queued" and again.id != queued.id



class _WordCountV2(WordCount):
    """The built-in word count under a new logic version: a change its source does not show (a library upgrade)."""

    logic_version = "v2"


@pytest.mark.slow  # a subprocess killed with SIGKILL, two recomputes
def test_after_a_run_killed_under_old_logic_the_new_logics_scheduler_recomputes_by_itself(spark, make_settings) -> None:
    """`up` started again on changed pipeline code after a kill -9 in the middle of a run: the dead run reads as
    interrupted and the old logic stays served; the scheduler of the new code recomputes by itself (nothing asked,
    its hourly schedule's next tick an hour after the last good run) and serves the new logic, counts exact."""
    settings = make_settings(batch_schedule="1h")
    texts = ["The cat", "the dog sat", "a Cat sat"]
    ingest_texts(settings, texts)
    v1, v2 = load_pipeline("wordcount"), _WordCountV2()
    assert v1.logic != v2.logic
    first = run_now(spark, settings, v1, redis_url=settings.redis_url)
    runs = registry(settings)
    killed = runs.enqueue(trigger="api", force=True)
    lock = RunLock.for_pipeline(settings.data_dir, settings.pipeline_slug)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(lock.path), settings.redis_url, "1.0"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == killed.id
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    interrupted = wait_for(lambda: (r := runs.get(killed.id)).status != "running" and r, timeout=10,
                           what="the killed run's lease to expire")
    assert interrupted.status == "failed" and interrupted.error.startswith("interrupted:")
    client, keys = redis.Redis.from_url(settings.redis_url), Keys("wordcount")
    assert generation_logic(client, keys, served_generation(settings)) == v1.logic

    with scheduler_thread(spark, settings, pipeline=v2):
        [run] = wait_for(lambda: [r for r in runs_with(runs, "succeeded") if r.id != first.id], timeout=120,
                         what="the new logic's scheduler to recompute by itself")
    assert run.trigger == "schedule" and not run.force and run.generation == served_generation(settings)
    assert generation_logic(client, keys, run.generation) == v2.logic
    position = json.loads(client.hget(keys.meta(run.generation), "measures:word_counts")).index("count")
    stored = client.hgetall(keys.rows(run.generation, "word_counts"))
    counts = {k.decode(): int(json.loads(v)[position]) for k, v in stored.items()}
    assert counts == dict(Counter(w for t in texts for w in oracle.words(t)))


# --- a failing run is recorded ------------------------------------------------------------------------

def test_a_failing_run_is_recorded_as_failed_with_its_error(spark, make_settings) -> None:
    settings = make_settings()
    log = settings.master_path / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("this is not a Delta log\n")
    runs = registry(settings)
    queued = runs.enqueue(force=True)
    with scheduler_thread(spark, settings):
        run = wait_for(lambda: (r := runs.get(queued.id)).status in TERMINAL and r, timeout=60, what="the run to end")
    assert run.status == "failed" and run.finished_at is not None
    assert run.error.split(":")[0].isidentifier(), f"the error names its class: {run.error}"
    assert runs.active() is None, "a failed run frees the single-flight slot"
    assert runs.enqueue().status == "queued"


def test_a_run_records_its_stages_as_it_goes(spark, make_settings) -> None:
    settings = make_settings()
    texts = ["the cat sat", "the dog", "a cat"]
    ingest_texts(settings, texts)
    runs = registry(settings)
    queued = runs.enqueue(force=True)  # before the scheduler starts, so it is the run the scheduler takes
    midway: list = []
    with injected("after-gold", lambda: midway.append(runs.get(queued.id))), scheduler_thread(spark, settings):
        run = wait_for(lambda: (r := runs.get(queued.id)).status in TERMINAL and r, timeout=120, what="the run to end")
    assert run.status == "succeeded", run.error

    # Seen while it ran (after its first view's gold commit): the stages so far, each finished.
    during = midway[0]
    assert during.status == "running"
    assert [(s["name"], s["view"]) for s in during.stages] == [("barrier", None), ("snapshot", None), ("gold", "word_counts")]
    assert all(s["seconds"] is not None for s in during.stages)

    views = ["word_counts", "word_counts_per_minute"]
    assert [(s["name"], s["view"]) for s in run.stages] == [
        ("barrier", None), ("snapshot", None), *[(name, v) for v in views for name in ("gold", "publish")], ("flip", None)]
    counts = {(s["name"], s["view"]): s["count"] for s in run.stages}
    assert counts[("barrier", None)] == counts[("flip", None)] == run.generation
    assert counts[("snapshot", None)] == len(texts)
    assert counts[("gold", "word_counts")] == counts[("publish", "word_counts")] == len({w for t in texts for w in t.split()})
    assert counts[("publish", "word_counts_per_minute")] == counts[("gold", "word_counts_per_minute")] >= 1
    assert all(s["seconds"] >= 0 and s["started_at"] >= run.started_at for s in run.stages)


# --- run_now (the command line's batch run) ------------------------------------------------------------

def test_run_now_is_recorded_and_single_flight(spark, make_settings) -> None:
    settings = make_settings()
    pipeline = load_pipeline(settings.pipeline)
    lock = RunLock.for_pipeline(settings.data_dir, settings.pipeline_slug)
    assert lock.acquire("another process")
    try:
        with pytest.raises(RunInProgressError, match="another process is recomputing"):
            run_now(spark, settings, pipeline, redis_url=settings.redis_url)
    finally:
        lock.release()
    runs = registry(settings)
    queued = runs.enqueue()
    with pytest.raises(RunInProgressError, match=f"batch run {queued.id} is queued or running"):
        run_now(spark, settings, pipeline, redis_url=settings.redis_url)
    runs.client.delete(runs.keys.batch_active, runs.keys.batch_queue)
    # No master dataset yet: nothing to recompute, recorded as a skip (no Spark job runs).
    run = run_now(spark, settings, pipeline, redis_url=settings.redis_url)
    assert run.status == "skipped" and run.trigger == "cli" and run.force
    assert "ingest events first" in run.skip_reason
    assert runs.recent()[1][0].id == run.id


# --- schedules ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [
    ("1s", 1), ("300s", 300), ("15m", 900), ("1h", 3600), ("1h30m", 5400), ("2d", 172800), (" 10M ", 600),
])
def test_interval_schedules(text: str, seconds: int) -> None:
    schedule = parse_schedule(text)
    assert schedule.interval == seconds and schedule.cron is None
    assert schedule.first_due(1000.0) == 1000.0, "an interval schedule ticks at start"
    assert schedule.next_due(1000.0, 1000.5) == 1000.0 + seconds
    # A run that overran three intervals: the missed ticks are dropped, the grid is kept.
    assert schedule.next_due(1000.0, 1000.0 + 3.5 * seconds) == 1000.0 + 4 * seconds


def test_cron_schedules_are_utc() -> None:
    schedule = parse_schedule("*/15 * * * *")
    assert schedule.cron == "*/15 * * * *" and schedule.interval is None
    at = datetime(2024, 3, 1, 9, 7, 30, tzinfo=timezone.utc).timestamp()
    assert schedule.first_due(at) == datetime(2024, 3, 1, 9, 15, tzinfo=timezone.utc).timestamp()
    assert schedule.next_due(schedule.first_due(at), at + 3600) == datetime(2024, 3, 1, 10, 15, tzinfo=timezone.utc).timestamp()
    assert parse_schedule("@hourly").first_due(at) == datetime(2024, 3, 1, 10, 0, tzinfo=timezone.utc).timestamp()
    assert parse_schedule("0 2 * * 1").first_due(at) == datetime(2024, 3, 4, 2, 0, tzinfo=timezone.utc).timestamp()


def test_no_schedule_means_on_demand_only() -> None:
    assert parse_schedule(None) is None and parse_schedule("  ") is None


@pytest.mark.parametrize(("text", "message"), [
    ("0s", "interval '0s' is zero; the shortest is '1s'"),
    ("5x", "'5x' is not an interval: write a whole number and a unit, s, m, h or d"),
    ("1.5h", "'1.5h' is not an interval"),
    ("300", "'300' is not an interval"),
    ("10 minutes", "'10 minutes' is not an interval"),
    ("* * *", "a cron expression has 5 fields (minute hour day-of-month month day-of-week"),
    ("every day", "this one has 2"),
    ("61 * * * *", "bad cron expression '61 * * * *'"),
    ("*/0 * * * *", "bad cron expression"),
    ("0 0 31 2 *", "never fires"),
])
def test_bad_schedules_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_schedule(text)
    assert "LAMBDA_BATCH_SCHEDULE" in str(raised.value)
    assert message in str(raised.value), str(raised.value)


def test_a_bad_schedule_stops_at_settings_load(make_settings) -> None:
    with pytest.raises(ConfigError, match="LAMBDA_BATCH_SCHEDULE"):
        make_settings(batch_schedule="every 5 minutes")


def test_a_restarted_scheduler_goes_on_with_the_grid_of_the_last_finished_run(make_settings) -> None:
    """No recompute at once after a run of a moment ago (it would race the other parts' restart for the CPU);
    after a failed run, or none within an interval, the first tick is at once."""
    settings = make_settings(batch_schedule="1h")
    runs = registry(settings)
    scheduler = SimpleNamespace(registry=runs, pipeline=load_pipeline(settings.pipeline))
    hourly, now = parse_schedule("1h"), time.time()
    assert _first_due(scheduler, hourly, now) == now, "no run yet: at once"
    failed, _ = runs.claim("test", lease_seconds=15, queued=False)
    runs.finish(failed.id, "failed", error="boom")
    assert _first_due(scheduler, hourly, now) == now, "a failed run: retried at once"
    done, _ = runs.claim("test", lease_seconds=15, queued=False)
    finished = runs.finish(done.id, "succeeded")
    assert finished is not None and finished.started_at is not None
    started = finished.started_at
    assert _first_due(scheduler, hourly, started + 1) == started + 3600, "the grid goes on"
    assert _first_due(scheduler, hourly, started + 3601) == started + 3601, "an interval on: at once"
