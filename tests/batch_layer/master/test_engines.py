"""Both storage engines write the same Delta tables.

A master dataset written by one engine (events, a barrier, events after it) is read by the
other: its snapshot at the barrier, and the speed layer's input, whose ``_version`` must be the
commit version the writer reported. Appends from both engines at once lose nothing and get
distinct versions. Gold generations are seen, and not repeated, across engines. Spark's bulk
ingest keeps the delta-rs ingest's semantics. A gold write failing in a Spark task (a poison row) commits
nothing on either engine, and is written again. Compaction by JVM Delta changes no row (the platform
vacuums with delta-rs whatever the engine: tests/batch_layer/master/test_vacuum.py).

Oracle: the events the test itself appended (plain Python lists) and the versions the writers
returned; nothing is compared with the code's own reading of the same table.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from batch_layer.errors import IngestError
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.gold import write_generation
from shared_logic import load_pipeline
from shared_logic.errors import EventValidationError
from shared_logic.poison import data_error
from speed_layer.input import master_changes

PIPELINE = load_pipeline("payments")
T0 = "2026-01-01T00:00:00Z"


def _events(tag: str, n: int) -> list[dict[str, object]]:
    return [{"user_id": f"u{i % 7}", "merchant": f"{tag}-{i}", "amount": float(i), "event_time": T0} for i in range(n)]


def _master(path: Path, engine: str) -> MasterDataset:
    return MasterDataset(path, PIPELINE, get_engine(engine))


def _keys(rows) -> Counter:
    return Counter((r["user_id"], r["merchant"], r["amount"]) for r in rows)


def _streamed(spark, master: MasterDataset, settings, starting: int = 0) -> list[dict[str, object]]:
    """Every row the speed layer's input yields for ``master`` (its engine's source), read to the end."""
    name = f"changes_{uuid.uuid4().hex[:8]}"
    query = (master_changes(spark, master, settings, starting=starting).writeStream.format("memory")
             .queryName(name).start())
    try:
        query.processAllAvailable()
        return [r.asDict() for r in spark.table(name).collect()]
    finally:
        query.stop()


@pytest.mark.slow  # over 10 s: the end-to-end tier
@pytest.mark.parametrize(("writer", "reader"), [("delta-rs", "delta-spark"), ("delta-spark", "delta-rs")])
def test_a_master_written_by_one_engine_reads_the_same_with_the_other(spark, make_settings, tmp_path: Path,
                                                                       writer: str, reader: str) -> None:
    path = tmp_path / "master"
    written, read = _master(path, writer), _master(path, reader)
    written.ensure()
    batches = [_events(f"b{i}", 3 + i) for i in range(3)]
    versions = [written.append(PIPELINE.schema.validate(b)) for b in batches]
    barrier = written.append_barrier("run-1")
    late = _events("late", 4)
    late_version = written.append(PIPELINE.schema.validate(late))
    assert len({*versions, barrier, late_version}) == 5 and barrier > max(versions) and late_version > barrier

    at_barrier = read.snapshot(spark, barrier).collect()
    assert _keys(at_barrier) == _keys(itertools.chain(*batches))
    assert _keys(read.snapshot(spark, late_version).collect()) == _keys(itertools.chain(*batches, late))

    rows = _streamed(spark, read, make_settings(pipeline="payments", storage_engine=reader))
    expected = Counter()
    for batch, version in [*zip(batches, versions), (late, late_version)]:
        expected.update((e["merchant"], version) for e in batch)
    assert Counter((r["merchant"], r["_version"]) for r in rows if r["_kind"] == "event") == expected
    assert [r["_version"] for r in rows if r["_kind"] == "barrier"] == [barrier]


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_the_speed_input_starts_after_the_given_version(spark, make_settings, tmp_path: Path,
                                                        storage_engine: str) -> None:
    master = _master(tmp_path / "master", storage_engine)
    first = master.append(PIPELINE.schema.validate(_events("early", 3)))
    second = master.append(PIPELINE.schema.validate(_events("after", 2)))
    rows = _streamed(spark, master, make_settings(pipeline="payments", storage_engine=storage_engine), first)
    assert sorted((r["merchant"], r["_version"]) for r in rows) == [("after-0", second), ("after-1", second)]


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_concurrent_appends_from_both_engines_lose_nothing(spark, tmp_path: Path) -> None:
    path = tmp_path / "master"
    _master(path, "delta-rs").ensure()
    plan = [("delta-rs", 0, 8), ("delta-rs", 1, 8), ("delta-spark", 0, 4), ("delta-spark", 1, 4)]
    committed: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(plan))

    def writer(engine: str, n: int, appends: int) -> None:
        master = _master(path, engine)
        start.wait()
        try:
            for i in range(appends):
                tag = f"{engine}-{n}-{i}"
                committed.append((tag, master.append(PIPELINE.schema.validate(_events(tag, 2)))))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=p) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    assert len(committed) == sum(p[2] for p in plan)
    assert len({v for _, v in committed}) == len(committed), "two appends reported the same version"

    table = DeltaTable(str(path))
    assert table.version() == len(committed)  # version 0 created the table; nothing else committed
    tags = Counter(r["merchant"].rsplit("-", 1)[0] for r in table.to_pyarrow_table().to_pylist())
    assert tags == {tag: 2 for tag, _ in committed}
    changes = table.load_cdf(starting_version=1).read_all()
    seen = {(m.rsplit("-", 1)[0], int(v)) for m, v in zip(changes.column("merchant").to_pylist(),
                                                            changes.column("_commit_version").to_pylist())}
    assert seen == set(committed)


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_gold_generations_are_shared_and_never_repeated_across_engines(spark, tmp_path: Path) -> None:
    table = tmp_path / "gold" / "view"
    rs, jvm = get_engine("delta-rs"), get_engine("delta-spark")
    first = [("a", 1), ("b", 2)]
    second = [("a", 5), ("c", 7), ("d", 9)]

    def frame(rows: list[tuple[str, int]]):
        return spark.createDataFrame(rows, "key string, count long")

    def content(version: int | None = None) -> list[tuple[str, int]]:
        rows = DeltaTable(str(table), version=version).to_pyarrow_table().to_pylist()
        return sorted((r["key"], r["count"]) for r in rows)

    g5 = write_generation(frame(first), table, rs, generation=5)
    assert sorted(map(tuple, spark.read.format("delta").load(str(table)).collect())) == first
    v5 = DeltaTable(str(table)).version()
    write_generation(frame(second), table, jvm, generation=5)  # a repeat of generation 5: nothing commits
    assert DeltaTable(str(table)).version() == v5 and content() == first

    g7 = write_generation(frame(second), table, jvm, generation=7)
    assert content() == second and g7.rows == 3
    assert sorted(map(tuple, g7.read(spark).collect())) == second
    assert DeltaTable(str(table)).transaction_version("lambda-batch") == 7
    write_generation(frame(first), table, rs, generation=7)  # the repeat through delta-rs: nothing either
    assert content() == second and content(v5) == first and g5.rows == 2


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_a_gold_write_failing_on_a_poison_row_commits_nothing_and_is_written_again(spark, tmp_path: Path,
                                                                                  engine: str) -> None:
    """What the batch run's poison search relies on, on each engine: a generation whose rows fail in a Spark
    task (ANSI division by zero) commits nothing, and the same generation written again without that row
    commits once, with exactly the other rows."""
    table = tmp_path / "gold" / "view"
    rows = [(1, 2), (3, 0), (8, 4)]
    frame = spark.createDataFrame(rows, "a long, b long")
    with pytest.raises(Exception) as failed:
        write_generation(frame.selectExpr("a", "a / b AS ratio"), table, get_engine(engine), generation=3)
    error = data_error(failed.value)  # what the batch run's poison search reads
    assert error is not None and error.condition == "DIVIDE_BY_ZERO", failed.value
    assert not (table / "_delta_log").exists() or not list((table / "_delta_log").glob("*.json")), "a commit was made"

    written = write_generation(frame.where("b != 0").selectExpr("a", "a / b AS ratio"), table, get_engine(engine),
                               generation=3)
    got = DeltaTable(str(table))
    assert got.transaction_version("lambda-batch") == 3 and written.rows == 2
    assert sorted((r["a"], r["ratio"]) for r in got.to_pyarrow_table().to_pylist()) == [
        (a, a / b) for a, b in rows if b != 0]


def _ingest_file(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_bulk_ingest_by_spark_keeps_the_ingest_semantics(spark, tmp_path: Path) -> None:
    pad = " " * 900  # ~1 KB lines: 6,000 of them make Spark read the file in two splits (4 MB each at most)
    good = [json.dumps(e) + pad for e in _events("f", 6_000)]
    good[10] = ""  # blank lines are skipped, yet counted in line numbers
    good[4_500] = "   "
    bad = list(good)
    bad[2] = '{"user_id": "u", "merchant": "m", "amount": "12", "event_time": "' + T0 + '"}'  # strict: no coercion
    bad[5_999] = '{"user_id": "u", "merchant": "m", "amount": 1.0, "color": "red"}'
    bad[4_700] = "not json"
    rs, jvm = _master(tmp_path / "rs", "delta-rs"), _master(tmp_path / "jvm", "delta-spark")

    bad_file = _ingest_file(tmp_path / "bad.jsonl", bad)
    problems = []
    for master in (rs, jvm):
        master.ensure()
        with pytest.raises(EventValidationError) as caught:
            master.ingest_file(bad_file)
        problems.append([str(p) for p in caught.value.problems])
        assert DeltaTable(str(master.path)).version() == 0, "a rejected file committed something"
    assert problems[1] == problems[0]
    assert [p.split(",")[0] for p in problems[0]] == ["line 3", "line 4701", "line 6000"]

    good_file = _ingest_file(tmp_path / "good.jsonl", good)
    results = [master.ingest_file(good_file) for master in (rs, jvm)]
    assert [r.events for r in results] == [5_998, 5_998] and [r.version for r in results] == [1, 1]
    expected = _keys(json.loads(line) for line in good if line.strip())
    for master in (rs, jvm):
        assert _keys(DeltaTable(str(master.path)).to_pyarrow_table().to_pylist()) == expected

    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes((good[0] + "\n").encode() + b'{"user_id": "caf\xe9"}\n')
    for master in (rs, jvm):
        with pytest.raises(IngestError, match="not UTF-8"):
            master.ingest_file(latin1)


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_compaction_by_jvm_delta_changes_no_row(spark, make_settings, tmp_path: Path) -> None:
    master = _master(tmp_path / "master", "delta-spark")
    batches = [_events(f"c{i}", 3) for i in range(4)]
    versions = [master.append(PIPELINE.schema.validate(b)) for b in batches]
    compacted = master.engine.compact(master.path).version
    assert compacted == versions[-1] + 1
    assert len(DeltaTable(str(master.path)).file_uris()) == 1
    rows = _streamed(spark, master, make_settings(pipeline="payments", storage_engine="delta-spark"), versions[-1])
    assert rows == []  # the compaction carries no change
    expected = _keys(itertools.chain(*batches))
    assert _keys(DeltaTable(str(master.path)).to_pyarrow_table().to_pylist()) == expected
    assert _keys(master.snapshot(spark, compacted).collect()) == expected


@pytest.mark.parametrize("engine", ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.slow)])
def test_an_append_whose_first_batches_are_empty_keeps_every_row(spark, tmp_path: Path, engine: str) -> None:
    """A stream of validated chunks can start with empty ones (a file whose first chunks are all bad lines,
    kept as dead letters); PySpark 4.2 converts such a table to no rows at all (``arrow_frames``)."""
    master = _master(tmp_path / "master", engine)
    master.ensure()
    events = PIPELINE.schema.validate(_events("late", 3))
    batches = [pa.RecordBatch.from_pylist([], schema=events.schema)] * 2 + events.to_batches()
    version = master.append(pa.Table.from_batches(batches, schema=events.schema))
    rows = DeltaTable(str(tmp_path / "master"), version=version).to_pyarrow_table().to_pylist()
    assert sorted(r["merchant"] for r in rows if r["_kind"] == "event") == sorted(e["merchant"] for e in _events("late", 3))
