"""The speed layer's memory of the horizon (``speed_layer.dedup.Horizon``), driven directly.

A seeded index holds every id of the snapshot at the seed version: a micro-batch spanning the seed
decides only the versions above its lowest segment base (the rows below reach no segment) and above the
seed, and counts what it left out among them, never the snapshot. Until the index reaches the base, while a run may
still seed it, a micro-batch waits, saying why, and then gives up as a wait (the query starts again).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.delta_log import inserted_rows
from batch_layer.master.event_ids import EventIdIndex
from deploy.settings import Settings
from shared_logic.events import KIND_COLUMN
from shared_logic.registry import load_pipeline
from speed_layer import dedup
from speed_layer.dedup import Horizon, IndexBehindError
from speed_layer.source import VERSION_COLUMN, source_schema

pytestmark = pytest.mark.slow  # over 10 s: the end-to-end tier

PIPELINE = "tests.support.dedup_pipeline"


def _pay(pid: str, user: str) -> dict[str, Any]:
    return {"payment_id": pid, "user_id": user, "amount": 1.0}


def _micro_batch(spark: Any, master: MasterDataset, first: int, last: int) -> Any:
    schema = source_schema(master.schema)
    table = pa.Table.from_batches(list(inserted_rows(master.path, first, last, schema, version_column=VERSION_COLUMN)),
                                  schema=schema)
    return spark.createDataFrame(table).where(f"{KIND_COLUMN} = 'event'").drop(KIND_COLUMN)


def test_a_micro_batch_spanning_a_seed_decides_only_above_its_base(
        spark: Any, make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(pipeline=PIPELINE)
    pipeline = load_pipeline(PIPELINE)
    master = MasterDataset.open(settings, pipeline)
    master.append(pipeline.schema.validate([_pay(f"p{i}", "ann") for i in range(200)]))          # v1
    master.append(pipeline.schema.validate([_pay("p1", "ann")]))                                  # v2
    DeltaTable(str(settings.master_path)).create_checkpoint()
    master.trim_log(2)
    master.append(pipeline.schema.validate([_pay("p2", "bob")]))                                  # v3
    seed = master.append_barrier("seeding run")                                                   # v4
    index = EventIdIndex(settings.event_ids_uri, master, "payment_id")
    index.extend(spark, seed, may_seed=True)
    last = master.append(pipeline.schema.validate([_pay("p3", "cy"), _pay("p900", "cy"), _pay("p900", "cy")]))
    horizon = Horizon(index, timedelta(days=7), lambda: True)

    kept, dropped = horizon.screen(_micro_batch(spark, master, 3, last), 3, last, base=seed, wait=pytest.fail)
    rows = sorted((r["payment_id"], r[VERSION_COLUMN]) for r in kept.collect())
    assert [r for r in rows if r[1] > seed] == [("p900", last)]  # p3 was seen at the seed; p900's copy dropped
    assert dropped == 2

    # A lower base (a run of this logic at version 2 died before it built the index; the seeding run's segment
    # is live beside its segment): versions up to the seed are not decided (no generation serving them will be).
    again = Horizon(index, timedelta(days=7), lambda: True)
    kept, dropped = again.screen(_micro_batch(spark, master, 3, last), 3, last, base=2, wait=pytest.fail)
    assert sorted((r["payment_id"], r[VERSION_COLUMN]) for r in kept.collect()) == [("p900", last)]
    assert dropped == 2


def test_a_micro_batch_waits_for_the_index_a_run_may_seed_then_gives_up_as_a_wait(
        spark: Any, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(pipeline=PIPELINE)
    pipeline = load_pipeline(PIPELINE)
    master = MasterDataset.open(settings, pipeline)
    version = master.append(pipeline.schema.validate([_pay("p1", "ann")]))
    monkeypatch.setattr(dedup, "_WAIT_SECONDS", 0.5)
    said: list[str] = []
    horizon = Horizon(EventIdIndex(settings.event_ids_uri, master, "payment_id"), timedelta(days=7), lambda: True)
    with pytest.raises(IndexBehindError, match="waiting for the event-id index .* to reach master version 1"):
        horizon.screen(_micro_batch(spark, master, 1, version), 1, version, base=1, wait=said.append)
    assert said and "the batch run whose barrier it is builds it" in said[0]
