"""The shared transformation gives the same rows on a static and on a streaming DataFrame.

Both DataFrames are built from the same events; the streaming one runs through a real
Structured Streaming query (file source, memory sink). Rows are compared as multisets.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from shared_logic import load_pipeline

EVENTS = {
    "wordcount": [
        {"text": "Hello  world\thello", "event_time": "2026-01-01T00:00:05Z"},
        {"text": "  leading and trailing  ", "event_time": "2026-01-01T00:01:00Z"},
        {"text": "world", "event_time": "2026-01-01T00:02:30Z"},
    ],
    "payments": [
        {"user_id": "u1", "merchant": "acme", "amount": 12.5, "event_time": "2026-01-01T00:00:05Z"},
        {"user_id": "u2", "merchant": "hooli", "amount": 3.0, "event_time": "2026-01-01T01:00:00Z"},
    ],
}


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_transform_is_the_same_on_static_and_streaming_input(spark, tmp_path: Path, name: str) -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    pipeline = load_pipeline(name)
    source = tmp_path / "in"
    source.mkdir()
    (source / "events.json").write_text("\n".join(json.dumps(e) for e in EVENTS[name]))
    schema = from_arrow_schema(pipeline.schema.arrow_schema())

    static_rows = pipeline.transform(spark.read.schema(schema).json(str(source))).collect()

    stream = pipeline.transform(spark.readStream.schema(schema).json(str(source)))
    table = f"transform_{name}"
    query = stream.writeStream.format("memory").queryName(table).outputMode("append").start()
    try:
        query.processAllAvailable()
        streamed_rows = spark.table(table).collect()
    finally:
        query.stop()

    assert streamed_rows, "the streaming query produced nothing"
    assert Counter(tuple(r) for r in streamed_rows) == Counter(tuple(r) for r in static_rows)
