"""Compacting the master dataset (what `up`'s scheduler does between runs) changes no answer.

* After many one-event commits, a compaction leaves one file; the batch snapshot and the speed
  layer still see every event exactly once: every key of every view, over HTTP, equals the oracle
  (plain Python over the master dataset as stored), with compactions both before and after the
  served generation's barrier.
* A compaction is not a change: the scheduler's next run is skipped ("not changed"), and runs
  again once events arrive.
* After a compaction the log is trimmed and the master vacuumed down to the oldest version still
  read: time travel to the served generation and a speed layer starting after it stay exact.
* When compaction is due: after K commits, or after N minutes with new commits (a fake clock).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from deploy.scheduling.compactor import MasterCompactor
from deploy.scheduling.scheduler import BatchScheduler, run_now
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests.support.speed import assert_exact, running_speed_layer, wait_caught_up

WORDS = ["alpha", "beta", "gamma", "delta", "alpha beta", "beta gamma delta"]


def master_of(settings: Settings) -> MasterDataset:
    return MasterDataset.open(settings, load_pipeline(settings.pipeline))


def one_commit_per_event(settings: Settings, texts: list[str]) -> int:
    master = master_of(settings)
    version = -1
    for text in texts:
        version = master.append(master.pipeline.schema.validate([{"text": text}]))
    return version


def active_files(settings: Settings) -> int:
    return len(DeltaTable(str(settings.master_path)).file_uris())


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_compaction_changes_no_answer_and_is_not_a_change(spark, make_settings, api) -> None:
    settings = make_settings(master_compact_every="off", master_compact_commits=1)
    pipeline = load_pipeline(settings.pipeline)
    one_commit_per_event(settings, WORDS[:1])
    compactor = MasterCompactor(master_of(settings), every_seconds=None, every_commits=1, check_seconds=0)
    assert compactor.maybe_compact() is None, "commits are counted from the compactor's first look"
    one_commit_per_event(settings, WORDS * 5)
    assert compactor.maybe_compact() is not None  # before any generation: the batch snapshot reads the compacted file
    files_before = active_files(settings)
    assert files_before == 1
    latest = one_commit_per_event(settings, WORDS)
    assert active_files(settings) == files_before + len(WORDS)

    run = run_now(spark, settings, pipeline, redis_url=settings.redis_url)
    assert run.status == "succeeded" and run.events == 1 + len(WORDS) * 6
    compacted = compactor.maybe_compact()
    assert compacted is not None and (compacted.base, compacted.version) == (run.generation, run.generation + 1)
    assert active_files(settings) == 1

    scheduler = BatchScheduler(spark, settings, pipeline, redis_url=settings.redis_url)
    scheduler.compactor = compactor
    try:
        skipped = scheduler.attempt(queued=False)
        assert skipped.status == "skipped" and "not changed since generation" in skipped.skip_reason
        latest = one_commit_per_event(settings, ["late alpha", "late omega"])
        assert compactor.maybe_compact() is not None  # after the barrier, before the speed layer reads
        ran = scheduler.attempt(queued=False)
        assert ran.status == "succeeded", "new events after a compaction are a change"
    finally:
        scheduler.close()

    one_commit_per_event(settings, ["after the last run", "alpha"])
    assert compactor.maybe_compact() is not None
    # A micro-batch holding only a compaction does not move the speed layer's processed version
    # (it has no rows to read it from): end on an event, as live traffic does.
    latest = one_commit_per_event(settings, ["omega"])
    with running_speed_layer(spark, settings), api() as server:
        assert wait_caught_up(settings) == latest
        assert assert_exact(server.base_url, settings, latest) >= 8


def test_compaction_is_due_after_k_commits_or_n_minutes_with_new_commits(tmp_path: Path, make_settings) -> None:
    settings = make_settings()
    now = [1000.0]
    master = master_of(settings)
    by_commits = MasterCompactor(master, every_seconds=None, every_commits=3, check_seconds=0, clock=lambda: now[0])
    off = MasterCompactor(master, every_seconds=None, every_commits=0)
    assert by_commits.maybe_compact() is None  # no table yet
    one_commit_per_event(settings, ["a"])
    assert by_commits.maybe_compact() is None  # counting starts here
    one_commit_per_event(settings, ["b", "c"])
    assert by_commits.maybe_compact() is None, "2 commits < 3"
    one_commit_per_event(settings, ["d"])
    done = by_commits.maybe_compact()
    assert done is not None and active_files(settings) == 1

    by_time = MasterCompactor(master, every_seconds=600, every_commits=0, check_seconds=0, clock=lambda: now[0])
    assert by_time.maybe_compact() is None  # counting starts at the compaction
    one_commit_per_event(settings, ["e"])
    assert by_time.maybe_compact() is None, "a new commit, but 10 minutes have not passed"
    now[0] += 600
    assert by_time.maybe_compact() is not None and active_files(settings) == 1
    now[0] += 600
    assert by_time.maybe_compact() is None, "10 more minutes, but nothing new since the compaction"
    assert not off.enabled and off.maybe_compact() is None
    rows = pa.Table.from_batches(DeltaTable(str(settings.master_path)).to_pyarrow_dataset().to_batches())
    assert sorted(rows.column("text").to_pylist()) == ["a", "b", "c", "d", "e"]


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_the_log_is_trimmed_to_what_the_served_generation_and_the_speed_layer_read(spark, make_settings, api) -> None:
    """After a compaction the scheduler trims the master's log: commit files before the newest checkpoint
    at or below the served generation go, time travel to that generation still reads every event it
    covers, and a speed layer starting after it still answers exactly; then upkeep and a recompute
    while the speed layer runs (oracle: the events appended, counted here, and plain Python over the
    master dataset as stored)."""
    settings = make_settings(master_compact_every="off", master_compact_commits=1, master_log_keep_versions=0,
                             master_vacuum_retention_hours=0)
    pipeline = load_pipeline(settings.pipeline)
    texts = WORDS * 20
    one_commit_per_event(settings, texts)
    run = run_now(spark, settings, pipeline, redis_url=settings.redis_url)
    assert run.status == "succeeded" and run.events == len(texts)
    one_commit_per_event(settings, ["after the barrier", "alpha"])
    log_dir = settings.master_path / "_delta_log"
    commits_before = len(list(log_dir.glob("*.json")))

    scheduler = BatchScheduler(spark, settings, pipeline, redis_url=settings.redis_url)
    try:
        assert scheduler.oldest_needed_version() == run.generation, "no speed layer yet: the served generation"
        scheduler.compactor.check_seconds = 0
        scheduler.compactor.maybe_compact()  # counts commits from its first look
        one_commit_per_event(settings, ["omega"])
        assert scheduler.compactor.maybe_compact() is not None
        trim, keep_from = scheduler.compactor.last_trim
        assert keep_from == run.generation and trim.starts_at is not None and trim.starts_at <= run.generation
        assert trim.deleted > 0 and f"log keeps every version from {run.generation}" in scheduler.compactor.summary()
        # The compaction's commit came after the served generation: the files it removed are still read.
        assert scheduler.compactor.last_vacuum.files_deleted == 0 and "vacuum deleted 0 files" in scheduler.compactor.summary()
    finally:
        scheduler.close()
    first_commit = min(int(p.stem) for p in log_dir.glob("*.json"))
    assert first_commit == trim.starts_at and len(list(log_dir.glob("*.json"))) < commits_before
    served = DeltaTable(str(settings.master_path), version=run.generation).to_pyarrow_table()
    events = [t for t in served["text"].to_pylist() if t is not None]  # barrier rows carry no event
    assert sorted(events) == sorted(texts), "time travel to the served generation"

    latest = one_commit_per_event(settings, ["zeta"])
    with running_speed_layer(spark, settings), api() as server:
        assert wait_caught_up(settings) == latest
        assert assert_exact(server.base_url, settings, latest) >= 8
        # Upkeep and a recompute while the speed layer runs: every answer stays exact.
        scheduler = BatchScheduler(spark, settings, pipeline, redis_url=settings.redis_url)
        try:
            scheduler.compactor.check_seconds = 0
            scheduler.compactor.maybe_compact()
            one_commit_per_event(settings, WORDS)
            assert scheduler.compactor.maybe_compact() is not None
            rerun = scheduler.attempt(queued=False)
            assert rerun.status == "succeeded", "new events after upkeep are a change"
            one_commit_per_event(settings, ["eta", "theta"])
            assert scheduler.compactor.maybe_compact() is not None
            assert scheduler.compactor.last_trim[1] <= rerun.generation
            latest = one_commit_per_event(settings, ["iota"])
        finally:
            scheduler.close()
        assert wait_caught_up(settings) == latest
        assert assert_exact(server.base_url, settings, latest) >= 8
        again = DeltaTable(str(settings.master_path), version=rerun.generation).to_pyarrow_table()
        assert len([t for t in again["text"].to_pylist() if t is not None]) == rerun.events
