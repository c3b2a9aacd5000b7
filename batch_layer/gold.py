"""Gold tables: one Delta table per view, one commit per generation.

Spark writes the view's rows as parquet files into a fresh folder inside the table; one
delta-rs commit (mode overwrite, application transaction ``("lambda-batch", V)``) then makes
them the table's content. Until that commit the files are invisible to every Delta reader, so a
run killed midway leaves the previous generation as the table's content; repeating the commit
for the same V is a no-op. Older generations stay reachable by time travel until vacuumed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema

from batch_layer.storage import StorageEngine

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

APP_ID = "lambda-batch"


@dataclass(frozen=True)
class GoldGeneration:
    """The files and row count of one view's generation in its gold table."""

    table: Path
    generation: int
    files: tuple[Path, ...]
    rows: int

    def read(self, spark: SparkSession) -> DataFrame:
        return spark.read.parquet(*(str(f) for f in self.files))


def write_generation(rows: DataFrame, table: Path, engine: StorageEngine, *, generation: int) -> GoldGeneration:
    """Write ``rows`` as generation ``generation`` of the gold table at ``table`` (one Delta commit)."""
    staging = table / f"gen-{generation:020d}-{uuid.uuid4().hex[:8]}"
    rows.write.parquet(str(staging))
    files = tuple(sorted(staging.glob("*.parquet")))
    schema = pq.read_schema(files[0]) if files else to_arrow_schema(rows.schema, timezone="UTC")
    schema = schema.remove_metadata()
    engine.ensure_table(table, schema, name=table.name, change_feed=False)
    engine.commit_files(
        table, files, schema, app_id=APP_ID, app_version=generation, metadata={"lambda.generation": str(generation)}
    )
    count = sum(pq.read_metadata(f).num_rows for f in files)
    return GoldGeneration(table, generation, files, count)
