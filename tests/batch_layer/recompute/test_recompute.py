"""Batch recompute against the oracle: every gold row, in both directions.

Random events (fixed seeds) are ingested through ``MasterDataset.ingest_file`` and recomputed
with ``run_batch``. Then every row of every gold Delta table (read with ``deltalake``) is
compared with ``tests.oracle``, a from-scratch plain-Python computation over the master
dataset's event rows as of the batch's barrier version: no key or window is missing, none is
extra, every measure is equal (floats within ``rel_tol=1e-9``; distinct merchants as exact sets).
A second ingest and batch run must publish a new, larger generation whose gold rows match the
oracle over all events, while the previous generation is no longer served (the Redis pointer
moves, its keys are dropped) and stays readable in gold by Delta time travel.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import deltalake
import pytest
import redis

from batch_layer.master.dataset import MasterDataset
from batch_layer.recompute.job import BatchRunResult, run_batch
from deploy.settings import Settings
from serving.store.keys import Keys
from shared_logic.registry import load_pipeline
from tests import oracle
from tests.support import ingest_file

START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

GOLD_MEASURES: dict[str, tuple[str, ...]] = {
    "wordcount": ("count",),
    "payments": ("count", "sum_amount", "min_amount", "max_amount", "distinct_merchant"),
}


def read_gold(settings: Settings, view: str, version: int | None = None) -> tuple[list[str], dict[oracle.RowKey, dict[str, Any]]]:
    """Column names and rows of a gold table, keyed like the oracle; fails on a duplicate row."""
    table = deltalake.DeltaTable(str(settings.gold_path / view), version=version).to_pyarrow_table()
    key_column = oracle.PIPELINE_KEY[settings.pipeline]
    size = oracle.VIEW_WINDOWS[view]
    rows: dict[oracle.RowKey, dict[str, Any]] = {}
    for row in table.to_pylist():
        window: int | None = None
        if size is not None:
            start = row.pop("window_start")
            assert start.tzinfo is not None and start.utcoffset() == timedelta(0), f"{view}: window_start {start!r} is not UTC"
            window, rest = divmod(start - EPOCH, timedelta(seconds=1))
            assert rest == timedelta(0) and window % size == 0, f"{view}: window_start {start} is not aligned to {size} s"
        row_key = (row.pop(key_column), window)
        assert row_key not in rows, f"{view}: row {row_key} appears twice in gold"
        rows[row_key] = row
    return table.column_names, rows


def gold_problems(pipeline: str, view: str, gold: dict[oracle.RowKey, dict[str, Any]],
                  want: oracle.ViewTable, merchants: dict[oracle.RowKey, frozenset[str]] | None) -> list[str]:
    """Every difference between a gold table and the oracle's view (empty when they agree)."""
    problems = [f"missing row {k}: oracle has {want[k]}" for k in sorted(want.keys() - gold.keys(), key=repr)]
    problems += [f"extra row {k}: gold has {gold[k]}" for k in sorted(gold.keys() - want.keys(), key=repr)]
    for row_key in sorted(want.keys() & gold.keys(), key=repr):
        got, expected = gold[row_key], want[row_key]
        for measure in GOLD_MEASURES[pipeline]:
            value = got[measure]
            if measure == "distinct_merchant":
                assert merchants is not None
                exact = merchants[row_key]
                if len(value) != len(set(value)) or set(value) != exact or len(exact) != expected[measure]:
                    problems.append(f"{view} {row_key}: distinct_merchant {sorted(value)} != {sorted(exact)}")
            elif isinstance(expected[measure], float) and measure == "sum_amount":
                if not math.isclose(value, expected[measure], rel_tol=1e-9):
                    problems.append(f"{view} {row_key}: {measure} {value!r} != {expected[measure]!r}")
            elif value != expected[measure] or type(value) is not type(expected[measure]):
                problems.append(f"{view} {row_key}: {measure} {value!r} != {expected[measure]!r}")
    return problems


def assert_gold_matches_oracle(settings: Settings, generation: int, *, gold_version: int | None = None) -> dict[str, oracle.ViewTable]:
    """Compare every gold table of the pipeline with the oracle at master version ``generation``."""
    pipeline = settings.pipeline
    events = oracle.read_events(settings.master_path, generation)
    want = oracle.views(pipeline, events)
    for view in oracle.PIPELINE_VIEWS[pipeline]:
        columns, gold = read_gold(settings, view, gold_version)
        size = oracle.VIEW_WINDOWS[view]
        expected_columns = {oracle.PIPELINE_KEY[pipeline], *GOLD_MEASURES[pipeline]} | ({"window_start"} if size else set())
        assert set(columns) == expected_columns, f"{view}: gold columns {columns}"
        merchants = oracle.merchant_sets(events, size) if pipeline == "payments" else None
        problems = gold_problems(pipeline, view, gold, want[view], merchants)
        assert not problems, f"{view}: {len(problems)} difference(s) with the oracle:\n" + "\n".join(problems[:30])
        assert len(gold) == len(want[view]) > 0
    return want


def check_result(result: BatchRunResult, settings: Settings, want: dict[str, oracle.ViewTable]) -> None:
    """The run's own report agrees with the data: barrier version, event count, rows per view."""
    assert result.flipped
    assert result.generation == oracle.barrier_versions(settings.master_path)[-1]
    assert result.events == len(oracle.read_events(settings.master_path, result.generation))
    assert result.view_rows == {view: len(rows) for view, rows in want.items()}


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_wordcount_gold_tables_match_oracle(spark: Any, make_settings: Callable[..., Settings], redis_url: str,
                                            tmp_path: Path) -> None:
    settings = make_settings(pipeline="wordcount")
    events = oracle.wordcount_events(random.Random(20240301), 450, START)
    untimed = sum(1 for e in events if e.get("event_time") is None)
    assert untimed > 20

    before = datetime.now(timezone.utc)
    ingested = ingest_file(settings, events, tmp_path / "lines.jsonl")
    after = datetime.now(timezone.utc)
    assert ingested.events == len(events)

    # Events without event_time got the ingest time, fixed in the master dataset.
    stored = oracle.read_events(settings.master_path)
    assert len(stored) == len(events)
    filled = [e for e in stored if before - timedelta(seconds=1) <= e["event_time"] <= after + timedelta(seconds=1)]
    assert len(filled) == untimed
    assert all(e["event_time"] is not None for e in stored)

    result = run_batch(spark, settings, load_pipeline("wordcount"), redis_url=redis_url)
    assert result.generation > ingested.version
    want = assert_gold_matches_oracle(settings, result.generation)
    check_result(result, settings, want)

    # The oracle's own semantics, spot-checked: ASCII whitespace only, case and punctuation kept.
    all_time = want["word_counts"]
    assert ("a\u00a0b", None) in all_time and ("a", None) not in all_time
    assert ("x\x1cy", None) in all_time
    assert {("The", None), ("the", None), ("THE", None), ("fox,", None)} <= all_time.keys()
    assert not any(w == "" or oracle.ASCII_WHITESPACE.search(w) for w, _ in all_time)
    assert sum(v["count"] for v in all_time.values()) == sum(len(oracle.words(e["text"])) for e in events)


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_payments_gold_tables_match_oracle(spark: Any, make_settings: Callable[..., Settings], redis_url: str,
                                           tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    events = oracle.payments_events(random.Random(7), 550, START)
    assert any(isinstance(e["amount"], int) for e in events)
    ingest_file(settings, events, tmp_path / "payments.jsonl")

    result = run_batch(spark, settings, load_pipeline("payments"), redis_url=redis_url)
    want = assert_gold_matches_oracle(settings, result.generation)
    check_result(result, settings, want)
    # The data really exercises the windows and the distinct sets.
    hours = {w for _, w in want["spend_by_user_hourly"]}
    assert len(hours) >= 8
    assert max(v["distinct_merchant"] for v in want["spend_by_user"].values()) >= 8
    assert min(v["count"] for v in want["spend_by_user"].values()) <= 10


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_second_ingest_and_batch_publish_a_new_generation(spark: Any, make_settings: Callable[..., Settings],
                                                          redis_url: str, tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    pipeline = load_pipeline("payments")
    rng = random.Random(99)
    ingest_file(settings, oracle.payments_events(rng, 300, START, seconds=4 * 3600), tmp_path / "first.jsonl")
    first = run_batch(spark, settings, pipeline, redis_url=redis_url)
    want_first = assert_gold_matches_oracle(settings, first.generation)
    check_result(first, settings, want_first)

    # More payments: existing and new users, hours already computed and later ones.
    later = oracle.payments_events(
        rng, 250, START + timedelta(hours=2), seconds=5 * 3600,
        users=("alice", "bob", "newcomer", "Newcomer"), weights=(3, 2, 2, 1),
    )
    second_ingest = ingest_file(settings, later, tmp_path / "second.jsonl")
    assert second_ingest.version > first.generation
    second = run_batch(spark, settings, pipeline, redis_url=redis_url)

    assert second.generation > second_ingest.version > first.generation
    assert oracle.barrier_versions(settings.master_path) == [first.generation, second.generation]
    want_second = assert_gold_matches_oracle(settings, second.generation)
    check_result(second, settings, want_second)
    assert second.events == first.events + len(later)
    assert ("newcomer", None) in want_second["spend_by_user"] and ("newcomer", None) not in want_first["spend_by_user"]
    changed = [k for k in want_first["spend_by_user_hourly"] if want_first["spend_by_user_hourly"][k] != want_second["spend_by_user_hourly"][k]]
    assert changed, "the second ingest should update rows computed by the first run"

    # The previous generation stays readable in gold by time travel (one commit per generation).
    for view in oracle.PIPELINE_VIEWS["payments"]:
        latest = deltalake.DeltaTable(str(settings.gold_path / view)).version()
        _, previous = read_gold(settings, view, latest - 1)
        events = oracle.read_events(settings.master_path, first.generation)
        size = oracle.VIEW_WINDOWS[view]
        problems = gold_problems("payments", view, previous, want_first[view], oracle.merchant_sets(events, size))
        assert not problems, "\n".join(problems[:30])

    # Redis serves the new generation only; every key of the old one is gone.
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert client.get(Keys("payments").current) == str(second.generation)
        assert client.smembers(Keys("payments").generations) == {str(second.generation)}
        assert list(client.scan_iter(match=f"{Keys('payments').prefix}:?:{first.generation}:*")) == []
        assert list(client.scan_iter(match=f"{Keys('payments').prefix}:?:{second.generation}:*"))
    finally:
        client.close()


@pytest.mark.parametrize("pipeline", ["wordcount", "payments"])
def test_oracle_reads_only_event_rows(pipeline: str, tmp_path: Path, make_settings: Callable[..., Settings]) -> None:
    """The oracle's input contract: barrier rows and other versions are not events."""
    settings = make_settings(pipeline=pipeline)
    make = oracle.wordcount_events if pipeline == "wordcount" else oracle.payments_events
    first = ingest_file(settings, make(random.Random(1), 5, START), tmp_path / "a.jsonl")
    master = MasterDataset.open(settings, load_pipeline(pipeline))
    barrier = master.append_barrier("test")
    ingest_file(settings, make(random.Random(2), 3, START), tmp_path / "b.jsonl")
    assert oracle.barrier_versions(settings.master_path) == [barrier]
    assert len(oracle.read_events(settings.master_path, first.version)) == 5
    assert len(oracle.read_events(settings.master_path, barrier)) == 5
    assert len(oracle.read_events(settings.master_path)) == 8
