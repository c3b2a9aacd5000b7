"""The batch benchmarks' data: a synthetic payments master dataset, generated as Arrow with numpy and
appended with ``MasterDataset.append`` in chunks (several files, so Spark gets several scan tasks)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

DAY_US = 86_400 * 1_000_000
START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def event_chunks(schema: pa.Schema, events: int, *, users: int, merchants: int, chunk_rows: int,
                 seed: int) -> Iterator[pa.Table]:
    """Payments in master layout: uniform users and merchants, amounts with 2 decimals in [0.50, 500),
    event times uniform over 24 hours UTC from 2026-01-01, ``_kind`` = 'event'."""
    rng = np.random.default_rng(seed)
    user_names = pa.array([f"user-{i:06d}" for i in range(users)], pa.string())
    merchant_names = pa.array([f"merchant-{i:04d}" for i in range(merchants)], pa.string())
    start_us = int(START.timestamp()) * 1_000_000
    for offset in range(0, events, chunk_rows):
        n = min(chunk_rows, events - offset)
        columns = {
            "user_id": user_names.take(pa.array(rng.integers(0, users, n, dtype=np.int32))),
            "merchant": merchant_names.take(pa.array(rng.integers(0, merchants, n, dtype=np.int32))),
            "amount": pa.array(np.round(rng.uniform(0.5, 500.0, n), 2), pa.float64()),
            "event_time": pa.array(start_us + rng.integers(0, DAY_US, n, dtype=np.int64), pa.timestamp("us", tz="UTC")),
            "_kind": pa.repeat("event", n).cast(pa.string()),
        }
        yield pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def chunk_rows(args: argparse.Namespace, events: int) -> int:
    """Rows per append: --chunk-rows, but at least --min-files appends (delta-rs writes one row group per
    file at these sizes, and Spark cannot split a row group: one file would leave one core idle)."""
    return max(1, min(args.chunk_rows, -(-events // args.min_files)))


def build_master(settings: Any, pipeline: Any, args: argparse.Namespace, events: int) -> tuple[int, float]:
    """Append the synthetic dataset; returns (master files, seconds)."""
    from deltalake import DeltaTable

    from batch_layer.master.dataset import MasterDataset

    master = MasterDataset.open(settings, pipeline)
    started = time.perf_counter()
    for chunk in event_chunks(master.schema, events, users=args.users, merchants=args.merchants,
                              chunk_rows=chunk_rows(args, events), seed=args.seed):
        master.append(chunk, metadata={"lambda.source": "benchmark"})
    return len(DeltaTable(str(settings.master_path)).file_uris()), time.perf_counter() - started

