"""A pipeline's store session: one Redis client and one pipeline's keys, and every operation on them.

Each caller (the batch run, the speed layer's driver, the scheduler, the CLI) builds one
``PipelineStore`` and asks it, rather than handing a client and keys to each call. The protocols stay
in their modules (``generations``: the epoch and the pointer; ``logic``: claims and the wait;
``segment_commits``: the commit and the plan); the session's methods are their one public face.
A generation's lifecycle, the realtime segments' index and the speed heartbeat's writer are reached
the same way, bound to the session (``generations``, ``segments``, ``health``), as
``deltalake.DeltaTable.optimize`` is to its table.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from serving.store import generations, segment_commits
from serving.store import logic as store_logic  # its steps take a `logic` fingerprint argument
from serving.store.generation_meta import GenerationMeta
from serving.store.generations import Generations
from serving.store.heartbeat import SpeedHealth, SpeedHeartbeat
from serving.store.keys import Keys
from serving.store.segments import Segments


class PipelineStore:
    """Pipeline ``keys.pipeline``'s serving store in the Redis ``client`` talks to (one Redis or a cluster).

    Cheap to build and holds no state of its own besides its three parts: build one per caller and keep it.
    """

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys
        #: The lifecycle of the batch generations: begin, flip, drop stale (``serving.store.generations``).
        self.generations = Generations(client, keys)
        #: The realtime segments' index and reset (``serving.store.segments``).
        self.segments = Segments(client, keys)
        #: The writer of the speed layer's heartbeat hash (``serving.store.heartbeat``).
        self.health = SpeedHealth(client, keys.speed)

    # --- the epoch and the generation served (serving.store.generations)

    def ensure_epoch(self) -> str:
        """The store's epoch (every bucket's marker joined by ``,``, global first); a later different value means
        Redis lost data. Markers are created only where missing (SET NX): concurrent callers agree on one.

        Raises LayoutError when the store was laid out with another bucket count (its rows would be looked for
        in the wrong buckets)."""
        return generations.ensure_epoch(self.client, self.keys)

    def read_epoch(self) -> str | None:
        """The store's epoch as it is now, or None when a marker is gone (that Redis lost its data); writes
        nothing. One GET per marker: compare it with an epoch from ``ensure_epoch``."""
        return generations.read_epoch(self.client, self.keys)

    def served_generation(self) -> int | None:
        """The generation readers are served (its master version), or None before the first publish.

        One GET of the global pointer, which a flip moves last: every bucket serves the generation it names."""
        return generations.served_generation(self.client, self.keys)

    def generation_meta(self, generation: int) -> GenerationMeta:
        """Generation ``generation``'s metadata record (empty fields when it is not published): written whole by
        the flip that serves it."""
        return GenerationMeta.from_hash(self.client.hgetall(self.keys.meta(generation)))

    def speed_heartbeat(self) -> SpeedHeartbeat:
        """The speed layer's heartbeat as it is now (what ``health`` last wrote; all empty before its first run)."""
        return SpeedHeartbeat.from_hash(self.client.hgetall(self.keys.speed))

    # --- which logic a generation and a segment hold, and the speed layer's wait (serving.store.logic)

    def claim_segment(self, base: int, logic: str, query: str = "") -> str | None:
        """Claim segment ``base`` for ``logic`` (and the speed layer's ``query``; '' = the batch), in one atomic
        call; None when claimed, else what holds it (``generation:<logic>`` when generation ``base`` is served
        under another logic, ``segment:<logic>[/<query>]`` when another logic or query wrote the segment).
        A claimed segment is indexed, so it is dropped with the others below the served generation."""
        return store_logic.claim_segment(self.client, self.keys, base, logic, query)

    def generation_logic(self, generation: int) -> str | None:
        """The logic ``generation`` was computed under ('' for one published before logic was recorded), or None
        when it is not published. Its record is written whole by the flip that serves it."""
        return store_logic.generation_logic(self.client, self.keys, generation)

    def mark_waiting(self, logic: str | None) -> None:
        """Say (``logic``) or unsay (None), in one write, that the speed layer cannot write the served segment
        and waits for a generation of ``logic``: a scheduler of that logic then recomputes at once
        (``deploy.scheduling.scheduler``)."""
        store_logic.mark_waiting(self.client, self.keys, logic)

    def waiting_for(self) -> str | None:
        """The logic the speed layer waits for a generation of (``mark_waiting``), if it waits."""
        return store_logic.waiting_for(self.client, self.keys)

    def satisfy_waiting(self, logic: str) -> None:
        """A generation of ``logic`` was just served: the wait for it is over, and only a wait for ``logic``
        (atomic compare and delete). The speed layer says so again at its next micro-batch if it still
        cannot write; without this a stopped speed layer's stale wait would make the scheduler recompute
        over and over."""
        store_logic.satisfy_waiting(self.client, self.keys, logic)

    # --- the speed layer's commit point and plans (serving.store.segment_commits)

    def commit_processed(self, bases: Sequence[int], processed: int) -> None:
        """Make every increment tagged ``processed`` visible in the live segments among those based at ``bases``
        (a dead one, below its bucket's pointer, is skipped).

        Atomic per bucket (on one Redis, in every bucket at once: one MULTI). Returns once it is visible
        in every bucket and, where a bucket's master has replicas, once one replica acknowledged it;
        raises ReplicationError otherwise (the micro-batch must be replayed)."""
        segment_commits.commit_processed(self.client, self.keys, bases, processed)

    def save_plan(self, query: str, batch_id: int, plan: str, *, opens_group: bool) -> None:
        """Keep ``plan`` as the plan of micro-batch ``batch_id`` of ``query`` (one plan per query: the latest),
        in one write.

        When it ``opens_group`` (the micro-batch ends inside a version: the next ones carry its tag on
        until the group's commit) and the plan's master has replicas (a Redis Cluster), returns once one
        acknowledged it; raises ReplicationError otherwise (the micro-batch must be replayed)."""
        segment_commits.save_plan(self.client, self.keys, query, batch_id, plan, opens_group=opens_group)

    def saved_plan(self, query: str) -> tuple[int, str] | None:
        """The micro-batch id and plan ``save_plan`` kept last for ``query``, or None."""
        return segment_commits.saved_plan(self.client, self.keys, query)
