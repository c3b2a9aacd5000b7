"""Schema evolution of the master dataset, both ways.

An event model that gains an optional field evolves an existing master dataset: one commit adds
the column (no rows), old rows read it as null on every reader (deltalake in plain Python, the
Spark snapshot of each engine, the speed layer's input of each engine), new rows carry their
values, and the pipeline's logic changes (so the platform recomputes). A removed field, a retyped
field or a new required field is refused before anything is written, naming the field.

Oracle: the events the test wrote (plain Python) and the Delta log read with deltalake; never the
code's own reading of the same table.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame

from batch_layer.errors import BatchLayerError, SchemaChangeError
from batch_layer.master.dataset import MasterDataset, dump_jsonl
from batch_layer.master.engines import get_engine
from batch_layer.master.schema_evolution import plan_evolution
from shared_logic import Count, EventModel, Pipeline, View
from speed_layer.input import master_changes

T0 = "2026-01-01T00:00:00Z"


class ClickV1(EventModel):
    page: str
    ms: int
    event_time: datetime | None = None


class ClickV2(ClickV1):
    referrer: str | None = None  # the added optional field


class ClickRemoved(EventModel):  # ClickV2 without referrer
    page: str
    ms: int
    event_time: datetime | None = None


class ClickRetyped(EventModel):  # ms: int -> str
    page: str
    ms: str
    event_time: datetime | None = None


class ClickRequired(ClickV1):
    country: str  # a new field without a default


class _Clicks(Pipeline):
    name = "clicks"
    views = (View("page_views", keys=("page",), measures=(Count(),)),)

    def transform(self, events: DataFrame) -> DataFrame:
        return events


class ClicksV1(_Clicks):
    event_model = ClickV1


class ClicksV2(_Clicks):
    event_model = ClickV2


class ClicksRemoved(_Clicks):
    event_model = ClickRemoved


class ClicksRetyped(_Clicks):
    event_model = ClickRetyped


class ClicksRequired(_Clicks):
    event_model = ClickRequired


def _ingest(master: MasterDataset, tmp_path: Path, events: list[dict[str, object]]) -> int:
    file = tmp_path / f"{uuid.uuid4().hex[:8]}.jsonl"
    dump_jsonl(events, file)
    return master.ingest_file(file).version


def _events(n: int, *, referrer: bool = False) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [{"page": f"/p{i}", "ms": i, "event_time": T0} for i in range(n)]
    if referrer:
        for i, row in enumerate(rows):
            if i % 2 == 0:
                row["referrer"] = f"r{i}"  # odd ones leave the new optional field out: null
    return rows


def _rows(path: Path, version: int | None = None) -> Counter:
    """(page, ms, referrer) of every event row, read with deltalake (a missing column: None)."""
    table = DeltaTable(str(path), version=version).to_pyarrow_table()
    return Counter((r["page"], r["ms"], r.get("referrer")) for r in table.to_pylist() if r["_kind"] == "event")


def _streamed(spark, master: MasterDataset, settings) -> Counter:
    name = f"changes_{uuid.uuid4().hex[:8]}"
    query = master_changes(spark, master, settings, starting=0).writeStream.format("memory").queryName(name).start()
    try:
        query.processAllAvailable()
        rows = spark.table(name).collect()
    finally:
        query.stop()
    return Counter((r["page"], r["ms"], r["referrer"]) for r in rows if r["_kind"] == "event")


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_an_added_optional_field_evolves_the_master_and_old_rows_read_null(spark, make_settings, tmp_path: Path,
                                                                          storage_engine: str) -> None:
    path = tmp_path / "master"
    v1 = MasterDataset(path, ClicksV1(), get_engine(storage_engine))
    old_events = _events(3)
    old_version = _ingest(v1, tmp_path, old_events)

    v2 = MasterDataset(path, ClicksV2(), get_engine(storage_engine))
    assert v2.check_schema().names == ("referrer",)  # planned, nothing written yet
    assert DeltaTable(str(path)).version() == old_version
    new_events = _events(4, referrer=True)
    new_version = _ingest(v2, tmp_path, new_events)

    # One commit added the column (no rows), then the ingest committed: nothing else.
    assert new_version == old_version + 2
    added = DeltaTable(str(path), version=old_version + 1)
    assert "referrer" in added.schema().to_arrow().names
    assert _rows(path, old_version + 1) == _rows(path, old_version)

    expected = Counter((e["page"], e["ms"], None) for e in old_events)
    expected.update((e["page"], e["ms"], e.get("referrer")) for e in new_events)
    assert sum(1 for _, _, r in expected if r is not None) == 2
    assert _rows(path) == expected

    # Spark's snapshot (this engine's reader) at the newest version and at one before the column existed.
    snap = Counter((r["page"], r["ms"], r["referrer"]) for r in v2.snapshot(spark, new_version).collect())
    assert snap == expected
    before = Counter((r["page"], r["ms"], r["referrer"]) for r in v2.snapshot(spark, old_version).collect())
    assert before == Counter((e["page"], e["ms"], None) for e in old_events)

    # The speed layer's input (this engine's source) reads old rows with the new column as null.
    assert _streamed(spark, v2, make_settings(storage_engine=storage_engine)) == expected

    # A second start sees nothing to do; the event schema is part of the logic, so the views are recomputed.
    assert not MasterDataset(path, ClicksV2(), get_engine(storage_engine)).check_schema()
    assert ClicksV1().logic != ClicksV2().logic


def _refused(path: Path, pipeline: Pipeline, tmp_path: Path, events: list[dict[str, object]]) -> SchemaChangeError:
    """Ingest ``events`` with ``pipeline`` into the master at ``path``: it must be refused with nothing written."""
    before = DeltaTable(str(path)).version()
    master = MasterDataset(path, pipeline, get_engine("delta-rs"))
    with pytest.raises(SchemaChangeError) as check:
        master.check_schema()
    with pytest.raises(SchemaChangeError) as info:
        _ingest(master, tmp_path, events)
    assert DeltaTable(str(path)).version() == before
    assert str(check.value) == str(info.value)
    assert isinstance(info.value, BatchLayerError)  # the CLI reports it (exit 1)
    return info.value


def test_a_removed_field_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "master"
    _ingest(MasterDataset(path, ClicksV2(), get_engine("delta-rs")), tmp_path, _events(3, referrer=True))
    error = _refused(path, ClicksRemoved(), tmp_path, _events(2))
    assert error.fields == ("referrer",)
    message = str(error)
    assert "'referrer'" in message and "put the field back" in message and "referrer: str | None = None" in message


def test_a_retyped_field_is_refused_naming_both_types(tmp_path: Path) -> None:
    path = tmp_path / "master"
    _ingest(MasterDataset(path, ClicksV1(), get_engine("delta-rs")), tmp_path, _events(3))
    error = _refused(path, ClicksRetyped(), tmp_path, [{"page": "/x", "ms": "slow", "event_time": T0}])
    assert error.fields == ("ms",)
    assert "from int (in the master dataset) to str (in the event model)" in str(error)
    assert "add a new field" in str(error)


def test_a_new_required_field_is_refused_on_rows_and_added_on_an_empty_table(tmp_path: Path) -> None:
    path = tmp_path / "master"
    _ingest(MasterDataset(path, ClicksV1(), get_engine("delta-rs")), tmp_path, _events(3))
    error = _refused(path, ClicksRequired(), tmp_path, [{"page": "/x", "ms": 1, "country": "NL"}])
    assert error.fields == ("country",)
    assert "country: str | None = None" in str(error) and "new data dir" in str(error)

    empty = tmp_path / "empty"
    MasterDataset(empty, ClicksV1(), get_engine("delta-rs")).ensure()  # created, no rows
    required = MasterDataset(empty, ClicksRequired(), get_engine("delta-rs"))
    version = _ingest(required, tmp_path, [{"page": "/x", "ms": 1, "country": "NL", "event_time": T0}])
    assert _rows(empty, version) == Counter({("/x", 1, None): 1})
    assert DeltaTable(str(empty)).to_pyarrow_table().column("country").to_pylist() == ["NL"]


def test_every_problem_is_reported_at_once() -> None:
    table = pa.schema([("page", pa.string()), ("ms", pa.int64()), ("gone", pa.float64()),
                       ("event_time", pa.timestamp("us", tz="UTC")), ("_kind", pa.string())])
    with pytest.raises(SchemaChangeError) as info:
        plan_evolution(table, ClicksRequired().schema, holds_rows=True, where="t")
    assert set(info.value.fields) == {"gone", "country"}
    assert "gone: float | None = None" in str(info.value)
    # The same model on a table without rows: only the removed field is refused.
    with pytest.raises(SchemaChangeError) as info:
        plan_evolution(table, ClicksRequired().schema, holds_rows=False, where="t")
    assert info.value.fields == ("gone",)
