"""Arrow tables into Spark DataFrames, whole.

PySpark 4.2's ``createDataFrame(pyarrow.Table)`` returns no rows at all when the table's first two
record batches are empty (measured: batches empty, empty, 2 rows gives 0 rows; empty, 2 rows gives 2),
and filtering a pyarrow dataset or reading a stream in chunks yields such tables. Every conversion
of an Arrow table goes through :func:`spark_frame`, which leaves the empty batches out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


def spark_frame(spark: SparkSession, table: pa.Table, schema: StructType | None = None) -> DataFrame:
    """``table`` as a local DataFrame of ``spark``, every row in it (in ``schema``, if given)."""
    whole = pa.Table.from_batches([b for b in table.to_batches() if b.num_rows], schema=table.schema)
    return spark.createDataFrame(whole, schema=schema) if schema is not None else spark.createDataFrame(whole)
