"""Where a speed-layer query starts: its identity, kept in the checkpoint, and the restart policy.

The identity (``lambda_query.json``) names the query, the Redis epoch it writes under, the write
layout its replays must keep (partitions, chunk rows), the logic it counts with, the generation it
started after, the segment layout (``SEGMENT_LAYOUT``) and the checkpoint's format
(``CHECKPOINT_FORMAT``: the identity, the offsets the sources log, the plans kept in Redis).

A checkpoint is resumed only when all of these are this code's and Redis's. Otherwise:

* Redis lost its data (another epoch), or another format: a fresh query after the served generation,
  which drops this logic's realtime segments and rebuilds them from it on;
* another logic (the pipeline's code changed): a new query after the served generation, which
  keeps the segments: they hold the old logic's counts, which answers go on using until a
  generation of the new logic is served, and the new query cannot claim them (``speed_layer.plan``);
* another segment layout: a fresh query that drops every segment, of any logic (no code reads them right).

A fresh query needs a served generation: with none it raises NothingServedError (``waiting_reason``
says why; the runner waits for one).
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from typing import TYPE_CHECKING, NamedTuple

from serving.store.segments import SEGMENT_LAYOUT
from speed_layer.errors import NothingServedError

if TYPE_CHECKING:
    from pathlib import Path

    from serving.store.session import PipelineStore
    from shared_logic.pipeline import Pipeline
    from speed_layer.config import SpeedConfig

log = logging.getLogger(__name__)

#: The format of the checkpoint this code keeps: its identity, its offsets, its query's plans. A checkpoint
#: of any other format starts a fresh query (there is no reading of older ones).
CHECKPOINT_FORMAT = 1

_IDENTITY = "lambda_query.json"


class Identity(NamedTuple):
    """A query to run: its id, the epoch it writes under, its write layout, and the version it reads after
    when Spark has no offsets for it (a fresh query; one stopped before its first micro-batch)."""

    query: str
    epoch: str
    partitions: int
    chunk: int
    starting: int


def waiting_reason(store: PipelineStore, checkpoint: Path) -> str | None:
    """Why the query cannot start now (None: it can): a fresh start needs a served generation."""
    epoch = store.ensure_epoch()
    if _saved(checkpoint, epoch) is not None or store.served_generation() is not None:
        return None
    return ("waiting for a batch generation to be published (none is served: no batch run yet, or Redis lost "
            "its data); the speed layer starts after it")


def query_identity(store: PipelineStore, pipeline: Pipeline, settings: SpeedConfig) -> Identity:
    """The checkpoint's query if it can be resumed, else a new query (the policy above), its identity saved."""
    checkpoint = settings.speed_checkpoint_path
    epoch = store.ensure_epoch()
    saved = _saved(checkpoint, epoch)
    relaid = False
    if saved is not None and saved.get("layout") != SEGMENT_LAYOUT:
        # Segments of an older layout read as absent under this code (key reads) while top-N still ranks their
        # sorted sets: drop them all, whichever logic holds them, and rebuild, as after a loss of Redis.
        log.warning("the realtime segments were written in layout %s, this code writes layout %d: dropping them; "
                    "this logic's are rebuilt from the served generation", saved.get("layout", 1), SEGMENT_LAYOUT)
        shutil.rmtree(checkpoint)
        saved, relaid = None, True
    elif saved is not None and saved.get("format") != CHECKPOINT_FORMAT:
        log.warning("the speed layer's checkpoint is in format %s, this code keeps format %d: starting a fresh query "
                    "after the served generation; this logic's segments are rebuilt from it",
                    saved.get("format", "unrecorded"), CHECKPOINT_FORMAT)
        shutil.rmtree(checkpoint)
        saved = None
    if saved is not None and saved["logic"] == pipeline.logic:
        return _resumed(saved, epoch, settings)
    served = store.served_generation()
    if served is None:
        raise NothingServedError(f"no batch generation of {pipeline.name!r} is served to start after")
    if saved is not None:
        # Other logic made the checkpoint: a new query, which writes only segments it claims itself
        # (serving.store.logic), so the old logic's segments keep their counts and readers keep them apart.
        log.warning("the pipeline's logic changed (checkpoint %s, code %s): starting a new query after generation "
                    "%d; its answers stay as they are until a batch run under the new logic is served",
                    saved["logic"], pipeline.logic, served)
        shutil.rmtree(checkpoint)
    else:
        _fresh_segments(store, pipeline.logic, checkpoint, served, relaid=relaid)
    return _started(store, pipeline.logic, settings, epoch, served)


def _saved(checkpoint: Path, epoch: str) -> dict | None:
    """The checkpoint's identity if the query can resume it (made under this Redis epoch)."""
    identity = checkpoint / _IDENTITY
    if not identity.exists():
        return None
    saved = json.loads(identity.read_text())
    return saved if saved["epoch"] == epoch else None


def _resumed(saved: dict, epoch: str, settings: SpeedConfig) -> Identity:
    """The saved query, with the write layout it started with: replays must cut the same chunks."""
    partitions, chunk = saved["partitions"], saved["chunk"]
    if (partitions, chunk) != (settings.speed_write_partitions, settings.speed_chunk_rows):
        log.warning("keeping write partitions %d and chunk rows %d of the existing checkpoint; "
                    "new values apply after a fresh start", partitions, chunk)
    # Spark resumes from the checkpoint's offsets; where the query stopped before its first micro-batch
    # (an idle master) it has none, and starts where the query was started: after that generation, not
    # at version 0 (a master's log trimmed below it would stop the query there for good).
    return Identity(saved["query"], epoch, partitions, chunk, int(saved["starting"]))


def _fresh_segments(store: PipelineStore, logic: str, checkpoint: Path, served: int, *, relaid: bool) -> None:
    """Before a fresh query: drop the segments if they are this logic's (or of another layout) to rebuild them
    from ``served`` on; a checkpoint left from before Redis lost its data goes."""
    if (checkpoint / _IDENTITY).exists():
        log.warning("Redis lost its data since the last run (epoch changed): rebuilding the realtime segments")
        shutil.rmtree(checkpoint)
    if relaid or store.generation_logic(served) == logic:
        store.segments.reset(served)  # rebuilt from the served generation on
        store.health.rebuilt_from(served)
    else:  # not ours to rebuild: they stay, as after a change of logic (a checkpoint lost in between)
        log.warning("generation %d was computed under other logic than this code's %s: its segments are kept "
                    "and answers stay as they are until a batch run under this logic is served", served, logic)


def _started(store: PipelineStore, logic: str, settings: SpeedConfig, epoch: str, served: int) -> Identity:
    """A new query after generation ``served``: the other queries' guards and plans dropped, its identity saved."""
    store.segments.forget_queries()
    identity = Identity(uuid.uuid4().hex[:12], epoch, settings.speed_write_partitions, settings.speed_chunk_rows,
                        served)
    checkpoint = settings.speed_checkpoint_path
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / _IDENTITY).write_text(json.dumps({
        "query": identity.query, "epoch": epoch, "partitions": identity.partitions, "chunk": identity.chunk,
        "logic": logic, "layout": SEGMENT_LAYOUT, "format": CHECKPOINT_FORMAT, "starting": served}))
    store.health.started(query=identity.query, started_after=served)
    return identity
