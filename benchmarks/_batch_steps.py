"""Step timing for the batch benchmark: wrap platform functions (in the benchmark process only) and add
their wall-clock time to the active recording. Labels are ordered by their leading number when printed."""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any


class Steps:
    def __init__(self) -> None:
        self.active: dict[str, float] | None = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[dict[str, float]]:
        self.active = defaultdict(float)
        try:
            yield self.active
        finally:
            self.active = None

    def add(self, label: str, seconds: float) -> None:
        if self.active is not None:
            self.active[label] += seconds

    def wrap(self, owner: Any, attr: str, label: Callable[..., str] | str) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                name = label if isinstance(label, str) else label(*args, **kwargs)
                self.add(name, time.perf_counter() - started)

        setattr(owner, attr, timed)


STEPS = Steps()


def instrument(spark: Any) -> None:
    """Time the pieces run_batch and the variants call (module attributes looked up at call time)."""
    from pyspark.sql.readwriter import DataFrameWriter

    from batch_layer.master.dataset import MasterDataset
    from batch_layer.master.delta_rs import DeltaRsEngine
    from batch_layer.recompute import job as recompute
    from batch_layer.recompute import publish
    from serving.store.generations import Generations

    STEPS.wrap(MasterDataset, "append_barrier", "1 barrier append (delta-rs commit)")
    STEPS.wrap(MasterDataset, "snapshot", "2 snapshot (delta log, file list, Spark plan)")
    STEPS.wrap(recompute, "write_generation", lambda rows, table, *a, **k: f"3 gold {str(table).rstrip('/').rsplit('/', 1)[-1]}: write_generation")
    STEPS.wrap(DataFrameWriter, "parquet", "3.1  of which Spark job: scan+aggregate+write parquet")
    STEPS.wrap(DeltaRsEngine, "commit_files", "3.2  of which delta-rs commit_files (gold Delta commit)")
    STEPS.wrap(recompute, "redis_client", "4 redis: client + begin + flip")
    STEPS.wrap(Generations, "begin", "4 redis: client + begin + flip")
    STEPS.wrap(publish, "load_view", lambda rows, view, **k: f"5 redis load {view.name} (load_view)")
    STEPS.wrap(Generations, "flip", "4 redis: client + begin + flip")
    STEPS.wrap(Generations, "drop_stale", "7 redis drop_stale (SCAN + UNLINK of the previous generation)")
    STEPS.wrap(type(spark.range(1)), "count", "6 events.count() (another scan of the snapshot)")

