"""The batch layer's side of the duplicates rule (``shared_logic.dedup``): the snapshot's events the
views read when the pipeline declares an event id.

The rule needs each occurrence's version and clock, which snapshot rows do not carry: the event-id
index (``batch_layer.master.event_ids``) does. It is extended through the run's barrier, the rule
picks the occurrences that count, and of each (id, content key) the snapshot keeps one row per
counted occurrence. The speed layer decides the versions after the barrier with the same rule over
the same index, so merged answers are exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from batch_layer.master.event_ids import EventIdIndex
from shared_logic.dedup import counted, keep, with_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from shared_logic.pipeline import Pipeline


def first_occurrences(spark: SparkSession, index: EventIdIndex, pipeline: Pipeline, events: DataFrame,
                      generation: int, *, served_logic: str | None) -> DataFrame:
    """The events of the snapshot at ``generation`` that count: duplicates within the horizon left out.
    ``served_logic``: the logic of the generation served now; the index may be seeded only under another."""
    assert pipeline.event_id_field is not None, "only for a pipeline declaring an event id"
    index.extend(spark, generation, may_seed=served_logic != pipeline.logic)
    kept = counted(index.read(spark, generation), pipeline.event_id_horizon)
    return keep(with_key(events, list(events.columns)), kept, pipeline.event_id_field)
