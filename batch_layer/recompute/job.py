"""The batch recompute: snapshot at a barrier version V -> shared transform -> views -> gold -> Redis.

Exactness: the run first appends a barrier row and recomputes the snapshot *at the barrier's
version* V, so it covers exactly the rows with ``_version <= V``. The speed layer meets the same
barrier in the log and counts rows with ``_version > V`` into a realtime segment based at V: the
two never overlap and leave no gap, without clocks or locks.

Never older: the run reads Redis's epoch marker *before* appending its barrier, and the flip
checks it. If Redis loses its data anywhere after that, the speed layer may already have served
versions above V before the loss: the flip is refused, and the next run's barrier (after the
loss) is newer than anything served.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from batch_layer.errors import StorageError
from batch_layer.faults import fault_point
from batch_layer.master.dataset import MasterConfig, MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.master.event_ids import EventIdConfig, EventIdIndex
from batch_layer.master.object_store import join
from batch_layer.recompute import poison, publish
from batch_layer.recompute.dedup import first_occurrences
from batch_layer.recompute.gold import GoldGeneration, prune_generations, write_generation
from batch_layer.recompute.stages import StageListener, StageLog, StageRecord
from serving.store.columns import integral_parts
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.row_format import row_parts
from serving.store.session import PipelineStore
from shared_logic.pipeline import Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from shared_logic.views import View

log = logging.getLogger(__name__)


class RecomputeConfig(MasterConfig, EventIdConfig, Protocol):
    """What a recompute needs besides the master dataset: where gold tables go, Redis load chunking."""

    @property
    def gold_uri(self) -> str:
        """The folder of the gold tables, one per view: a local path or an ``s3://`` URI."""
        ...

    @property
    def redis_load_chunk(self) -> int: ...

    @property
    def gold_keep_generations(self) -> int:
        """Generations of each gold table kept readable by time travel (the served one always)."""
        ...

    @property
    def dead_letters_uri(self) -> str:
        """The pipeline's dead-letter table, where poison events are kept (``batch_layer.recompute.poison``)."""
        ...


@dataclass(frozen=True)
class BatchRunResult:
    """What one recompute produced."""

    run_id: str
    pipeline: str
    generation: int
    events: int
    view_rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    flipped: bool = True
    stages: tuple[StageRecord, ...] = ()
    #: Poison events the views left out (every copy counted): ``batch_layer.recompute.poison``.
    poisoned: int = 0


def run_batch(spark: SparkSession, settings: RecomputeConfig, pipeline: Pipeline, *, redis_url: str,
              run_id: str | None = None, on_stage: StageListener | None = None) -> BatchRunResult:
    """Recompute every view of ``pipeline`` and serve the result as a new generation; ``on_stage`` hears
    each stage start and end (``batch_layer.recompute.stages``).

    Guarantees: the served generation changes only in the final atomic flip; a run that fails or
    is killed before it leaves what was served, and the gold tables' current content, untouched. Poison
    events (``shared_logic.poison``) are left out of every view and kept as dead letters; they never fail it.
    """
    started = time.monotonic()
    run_id = run_id or uuid.uuid4().hex[:12]  # the scheduler passes its run's id: one id per run
    stages = StageLog(run_id, on_stage)
    engine = get_engine(settings.storage_engine)
    master = MasterDataset(settings.master_uri, pipeline, engine)
    keys = store_keys(pipeline.name, redis_url)
    with redis_client(redis_url) as client:  # closed also when the run fails
        store = PipelineStore(client, keys)
        # The epoch before the barrier: had Redis lost its data after the barrier, the speed layer may
        # have served versions above it before the loss, so the flip must refuse this generation. (A
        # loss between the two is refused too: harmless, the next run publishes.)
        epoch = store.ensure_epoch()
        with stages.stage("barrier") as barrier:
            generation = barrier.count = master.append_barrier(run_id)
        log.info("run %s: barrier appended; recomputing %s at master version %d", run_id, pipeline.name, generation)
        fault_point("after-barrier")
        with stages.stage("snapshot") as snapshot:
            events = master.snapshot(spark, generation)
            event_count = snapshot.count = events.count()
        if pipeline.event_id_field is not None:
            with stages.stage("dedup") as dedup:
                index = EventIdIndex(settings.event_ids_uri, master, pipeline.event_id_field)
                served = store.served_generation()
                served_logic = store.generation_logic(served) if served is not None else None
                events = first_occurrences(spark, index, pipeline, events, generation, served_logic=served_logic).cache()
                dedup.count = event_count - events.count()
            log.info("run %s: %d duplicate event(s) left out", run_id, dedup.count)
        screen = poison.Screen(pipeline, events)
        with publish.refusals():
            store.generations.begin(generation, epoch)

        view_rows: dict[str, int] = {}
        for view in pipeline.views:
            with stages.stage("gold", view.name) as computed:
                table = join(settings.gold_uri, view.name)

                def gold_of(rows: DataFrame, view: View = view, table: str = table) -> GoldGeneration:
                    return write_generation(view.aggregate(rows), table, engine, generation=generation)

                gold = screen.compute(gold_of)
                computed.count = gold.rows
            fault_point("after-gold")
            with stages.stage("publish", view.name) as loaded:
                loaded.count = publish.load_view(
                    gold.read(spark), view, pipeline=pipeline.name, generation=generation,
                    redis_url=redis_url, chunk=settings.redis_load_chunk,
                )
            view_rows[view.name] = gold.rows

        events.unpersist()  # cached only when duplicates were left out of it
        if screen.poison:
            poison.record(settings, pipeline.name, screen.poison, master=str(master.path), generation=generation)
        fault_point("before-flip")
        rows = screen.rows()
        meta = GenerationMeta(
            run_id=run_id, computed_at=time.time(), events=event_count, logic=pipeline.logic, rows=view_rows,
            measures={view.name: row_parts(view) for view in pipeline.views},
            integral={view.name: integral_parts(view, rows) for view in pipeline.views},
            views={view.name: repr(view) for view in pipeline.views},
        )
        with stages.stage("flip") as flip, publish.refusals():
            flipped = store.generations.flip(generation, epoch, meta)
            flip.count = generation if flipped else None
        if flipped:
            log.info("run %s: now serving generation %d", run_id, generation)
            store.generations.drop_stale()
            _prune_gold(settings, pipeline, generation)
        else:
            log.warning("run %s: a newer generation is already served; generation %d kept in gold only", run_id, generation)
        return BatchRunResult(run_id, pipeline.name, generation, event_count, view_rows,
                              time.monotonic() - started, flipped, tuple(stages.records), screen.left_out)


def _prune_gold(settings: RecomputeConfig, pipeline: Pipeline, served: int) -> None:
    """Keep ``gold_keep_generations`` generations of each view's gold table; a failure is logged, not the run's."""
    for view in pipeline.views:
        table = join(settings.gold_uri, view.name)
        try:
            pruned = prune_generations(table, keep=settings.gold_keep_generations, served=served)
        except (StorageError, OSError) as e:
            log.warning("gold table %s: older generations not pruned (tried again after the next run): %s", table, e)
            continue
        if pruned is not None and (pruned.vacuumed.files_deleted or pruned.trimmed.deleted):
            log.info("gold table %s: every version from %d kept; %d files vacuumed, %d log files trimmed", table,
                     pruned.keep_from, pruned.vacuumed.files_deleted, pruned.trimmed.deleted)
