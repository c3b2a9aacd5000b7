"""A commit the speed layer reads over several micro-batches is shown whole or not at all.

Delta's own streaming source (the delta-spark engine) admits a commit's files one by one against a
micro-batch's limits, so a bulk ingest of several files (a Parquet file of six row groups, ingested
by Spark: a file each) under a small row cap is read over several micro-batches. Every answer names
a version; each must equal the oracle (plain Python over the master dataset at that version): never
part of a version named as all of it, and never a micro-batch half shown. Real Spark, Delta, Redis
and HTTP.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_layer.master.dataset import MasterDataset
from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic import load_pipeline
from tests import oracle
from tests.support.speed import VersionedReader, assert_exact, running_speed_layer, wait_caught_up

pytestmark = pytest.mark.slow

START = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)
READ_ITEMS = [(view, user, window) for user in oracle.PAYMENT_USERS
              for view, window in (("spend_by_user", None), ("spend_by_user_hourly", int(START.timestamp()) + 3600))]


def _bulk_file(path: Path, rng: random.Random, n: int, rows_per_group: int) -> None:
    pq.write_table(pa.table({
        "user_id": [rng.choice(oracle.PAYMENT_USERS) for _ in range(n)],
        "merchant": [rng.choice(oracle.MERCHANTS) for _ in range(n)],
        "amount": [round(rng.uniform(0.01, 500), 2) for _ in range(n)],
        "event_time": pa.array([START + timedelta(seconds=rng.randrange(3 * 3600)) for _ in range(n)],
                               pa.timestamp("us", tz="UTC")),
    }), path, row_group_size=rows_per_group)


def _ended_inside_a_version(checkpoint: Path) -> int:
    """How many micro-batches' end offsets (as Spark logged them) stop inside a version (a file index, not -1)."""
    ends = [json.loads(f.read_text().split("\n")[2]) for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()]
    return sum(1 for end in ends if end.get("index", -1) >= 0)


def test_a_commit_split_across_micro_batches_is_shown_whole_or_not_at_all(
        spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments", storage_engine="delta-spark", speed_max_rows_per_trigger=20)
    pipeline = load_pipeline("payments")
    master = MasterDataset.open(settings, pipeline)
    rng = random.Random(5)
    master.append(pipeline.schema.validate(oracle.payments_events(rng, 40, START, seconds=3 * 3600)))
    run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    bulk = tmp_path / "bulk.parquet"
    _bulk_file(bulk, rng, 60, rows_per_group=10)  # three micro-batches of 20 rows: two end inside the version

    with api(pipeline="payments") as server, running_speed_layer(spark, settings) as speed:
        wait_caught_up(settings, speed=speed)
        with VersionedReader(server.base_url, settings, READ_ITEMS) as reader:
            version = master.ingest_file(bulk).version
            assert wait_caught_up(settings, speed=speed) == version
        assert_exact(server.base_url, settings, version)

    assert _ended_inside_a_version(settings.speed_checkpoint_path) >= 1, "the commit should have been split"
    assert reader.check() > 0
