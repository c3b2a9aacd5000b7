"""The storage engines by name: ``get_engine("delta-rs" | "delta-spark")``, and what each needs.

The engines' contract (``StorageEngine``, ``SparkStorage``, the result types) is ``storage``;
this module is the registry that knows the implementations.
"""

from __future__ import annotations

from pathlib import Path

from batch_layer.errors import StorageError
from batch_layer.master.delta_log import open_table
from batch_layer.master.delta_rs import DeltaRsEngine
from batch_layer.master.delta_spark import DeltaSparkEngine, delta_spark_conf
from batch_layer.master.object_store import Location, is_object_store
from batch_layer.master.s3a import merge_conf, s3a_spark_conf
from batch_layer.master.storage import SparkStorage, StorageEngine


def vacuum(engine: StorageEngine, path: Location, *, retention_hours: float, enforce_retention: bool = True) -> None:
    """Delete the files of ``path`` that no version within ``retention_hours`` needs (Delta's rules)."""
    if isinstance(engine, SparkStorage):
        engine.vacuum(path, retention_hours=retention_hours, enforce_retention=enforce_retention)
        return
    # delta-rs reads a retention of 0 as "the table's default": the shortest it takes is 1 hour.
    open_table(path).vacuum(retention_hours=int(retention_hours), dry_run=False,
                                 enforce_retention_duration=enforce_retention)


def engine_spark_conf(name: str, *, ivy_dir: Path, snapshot_partitions: int, tables: Location | None = None) -> dict[str, str]:
    """The Spark configuration engine ``name`` needs (delta-spark: the JVM Delta jars, resolved once
    into the Ivy cache ``ivy_dir``, and its SQL extension and catalog; delta-rs: nothing), plus, when
    ``tables`` is on object storage, Hadoop's S3A connector (both engines: Spark reads the snapshot's
    parquet files and writes gold files there), resolved into the same cache."""
    conf = delta_spark_conf(ivy_dir, snapshot_partitions=snapshot_partitions) if name == "delta-spark" else {}
    if tables is not None and is_object_store(tables):
        conf = merge_conf(conf, s3a_spark_conf())
        conf.setdefault("spark.jars.ivy", str(Path(ivy_dir).expanduser().resolve()))
    return conf


def get_engine(name: str) -> StorageEngine:
    """The engine registered as ``name`` (see ``Settings.storage_engine``)."""
    engines: dict[str, type] = {"delta-rs": DeltaRsEngine, "delta-spark": DeltaSparkEngine}
    try:
        return engines[name]()
    except KeyError:
        raise StorageError(f"unknown storage engine {name!r}; known engines: {', '.join(engines)}") from None
