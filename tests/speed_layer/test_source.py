"""The streaming source over the master dataset: offsets are versions, rows carry their version,
barriers pass through, compaction commits add nothing, the per-trigger cap holds.

Oracle: each version's rows are found independently as the difference between the snapshots at
that version and the one before (read with delta-rs), never through the change data feed.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from shared_logic import load_pipeline
from speed_layer.source import SOURCE_NAME, MasterChangesSource, master_schema_option


def _rows_added(path: Path, version: int) -> Counter:
    def rows(v: int) -> Counter:
        return Counter(_normal(r) for r in DeltaTable(str(path), version=v).to_pyarrow_table().to_pylist())

    return rows(version) - rows(version - 1)


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_micro_batches_follow_versions(spark, tmp_path: Path) -> None:
    pipeline = load_pipeline("wordcount")
    master = MasterDataset(tmp_path / "master", pipeline, get_engine("delta-rs"))
    for i in range(5):
        master.append(pipeline.schema.validate([{"text": f"w{i} x", "event_time": "2026-01-01T00:00:00Z"}] * (i + 1)))
    master.append_barrier("run")
    DeltaTable(str(master.path)).optimize.compact()  # a compaction commit: dataChange = false
    master.append(pipeline.schema.validate([{"text": "late", "event_time": "2026-01-01T00:00:00Z"}]))
    latest = DeltaTable(str(master.path)).version()

    spark.dataSource.register(MasterChangesSource)
    stream = (
        spark.readStream.format(SOURCE_NAME).option("path", str(master.path))
        .option("schema_json", master_schema_option(master.schema)).option("starting_version", "0")
        .option("max_versions_per_trigger", "2").load()
    )
    batches: list[list[dict]] = []
    query = (stream.writeStream.foreachBatch(lambda df, _: batches.append([r.asDict() for r in df.collect()]))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + 120
        while sum(len(b) for b in batches) < 17 and time.monotonic() < deadline:
            time.sleep(0.2)
        query.processAllAvailable()
    finally:
        query.stop()

    for batch in batches:
        versions = {r["_version"] for r in batch}
        assert max(versions) - min(versions) < 2, "a micro-batch read more than 2 versions"
    streamed: dict[int, Counter] = {}
    for row in (r for b in batches for r in b):
        streamed.setdefault(row.pop("_version"), Counter())[_normal(row)] += 1
    for version in range(1, latest + 1):  # the compaction commit's difference is empty: nothing new to read
        assert streamed.get(version, Counter()) == _rows_added(master.path, version), f"version {version}"


def _normal(row: dict) -> tuple:
    """A row comparable across readers: timestamps as UTC epoch microseconds."""
    def value(v: object) -> object:
        if isinstance(v, datetime):
            v = v if v.tzinfo else v.replace(tzinfo=timezone.utc)
            return round(v.timestamp() * 1_000_000)
        return v

    return tuple(sorted((k, value(v)) for k, v in row.items()))


SEPARATORS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]


def test_rows_cap_and_rows_over_commits_holding_line_separators(tmp_path: Path) -> None:
    """The reader's offsets and rows, driven as Spark drives them, over commits whose statistics hold
    every Unicode line separator (delta-rs writes U+0085, U+2028, U+2029 unescaped)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from speed_layer.source import MasterChangesReader

    pipeline = load_pipeline("wordcount")
    master = MasterDataset(tmp_path / "master", pipeline, get_engine("delta-rs"))
    written: Counter = Counter()  # (text, version) -> rows: the oracle
    rows_per_version: Counter = Counter()
    for i, sep in enumerate(SEPARATORS):
        rows = [f"a{sep}b", sep, f"{sep}z"][: 1 + i % 3]
        version = master.append(pipeline.schema.validate([{"text": t} for t in rows]),
                                app_id=f"id{sep}", app_version=1, metadata={"note": sep})
        written.update((t, version) for t in rows)
        rows_per_version[version] = len(rows)
    latest = max(rows_per_version)

    cap = 4
    reader = MasterChangesReader({"path": str(master.path), "schema_json": master_schema_option(master.schema),
                                  "starting_version": "0", "max_rows_per_trigger": str(cap), "partitions": "2"})
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and reader.reportLatestOffset() == {"version": latest}
    streamed: Counter = Counter()
    start = reader.initialOffset()
    while start["version"] < latest:
        end = reader.latestOffset(start, limit)
        first, last = start["version"] + 1, end["version"]
        rows = sum(rows_per_version[v] for v in range(first, last + 1))
        assert last >= first and (rows <= cap or last == first), (first, last, rows)
        assert last == latest or rows + rows_per_version[last + 1] > cap, "the cap cut a micro-batch short"
        for partition in reader.partitions(start, end):
            for batch in reader.read(partition):
                streamed.update(zip(batch.column("text").to_pylist(), batch.column("_version").to_pylist()))
        start = end
    assert streamed == written


def test_end_offsets_summarize_their_versions_as_the_rows_do(tmp_path: Path) -> None:
    """The summary an end offset carries (highest version with rows, barrier versions, first version, rows
    added) is what the rows of its versions say; a commit whose statistics cannot tell gives no summary (the rows are asked)."""
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from batch_layer.master.delta_log import read_commit
    from speed_layer.source import SUMMARY, MasterChangesReader, summarize

    pipeline = load_pipeline("wordcount")
    master = MasterDataset(tmp_path / "master", pipeline, get_engine("delta-rs"))
    master.append(pipeline.schema.validate([{"text": "a b"}] * 2))
    master.append_barrier("run-1")
    DeltaTable(str(master.path)).optimize.compact()  # no rows: dataChange = false
    master.append(pipeline.schema.validate([{"text": "c"}]))
    master.append_barrier("run-2")
    DeltaTable(str(master.path)).optimize.compact()
    latest = DeltaTable(str(master.path)).version()

    def oracle(first: int, last: int) -> dict:
        added = {v: _rows_added(master.path, v) for v in range(first, last + 1)}
        kinds = {v: {dict(row)["_kind"] for row in rows} for v, rows in added.items()}
        with_rows = [v for v, k in kinds.items() if k]
        return {"last": max(with_rows) if with_rows else None, "barriers": [v for v, k in kinds.items() if "barrier" in k],
                "first": first, "rows": sum(sum(rows.values()) for rows in added.values())}

    for first in range(1, latest + 1):
        for last in range(first, latest + 1):
            commits = [read_commit(str(master.path), v) for v in range(first, last + 1)]
            assert summarize(commits) == oracle(first, last), (first, last)  # type: ignore[arg-type]

    reader = MasterChangesReader({"path": str(master.path), "schema_json": master_schema_option(master.schema),
                                  "starting_version": "0", "max_versions_per_trigger": "3"})
    start = reader.initialOffset()
    while start["version"] < latest:
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end[SUMMARY] == oracle(start["version"] + 1, end["version"])
        start = end
    assert reader.latestOffset(start, ReadAllAvailable()) is start, "nothing new: the start offset itself"

    mixed = pa.table({"text": ["x", ""], "event_time": pa.array([None, None], pa.timestamp("us", tz="UTC")),
                      "_kind": ["event", "barrier"]}, schema=master.schema)
    version = master.append(mixed)
    assert summarize([read_commit(str(master.path), version)]) is None  # type: ignore[list-item]
