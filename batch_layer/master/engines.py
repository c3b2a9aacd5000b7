"""The storage engines by name: ``get_engine("delta-rs" | "delta-spark")``, and what each needs.

The engines' contract (``StorageEngine``, ``SparkStorage``, the result types) is ``storage``;
this module is the registry that knows the implementations.
"""

from __future__ import annotations

from pathlib import Path

from batch_layer.errors import StorageError
from batch_layer.master.delta_rs import DeltaRsEngine
from batch_layer.master.delta_spark import DeltaSparkEngine, delta_spark_conf
from batch_layer.master.object_store import Location, is_object_store
from batch_layer.master.s3a import merge_conf, s3a_spark_conf
from batch_layer.master.storage import StorageEngine


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
