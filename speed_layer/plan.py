"""How a micro-batch is written: its plan, decided on its first attempt and reused by its replays.

A plan names the segment bases the micro-batch writes, the way it goes (read and written by the
driver, or by Spark's tasks) and the tag its writes carry. Bases and way decide how increments
are cut into chunks and what the chunks are named: a replay (after a flip, or with other settings)
must cut the same chunks for the guards to skip exactly what was applied. Segments that died
meanwhile are skipped by the writes and the commit themselves (``serving.store``).

The tag is the micro-batch's highest version, or, when the micro-batch before ended inside a
version and so was not committed, that one's tag: one *group* of micro-batches, one tag, whose
undo logs go on holding the rows as they were before the group, and whose last commit shows it
whole. A plan opening a group is on a replica before the group writes (``PipelineStore.save_plan``).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, NamedTuple

from speed_layer.input import Summary, ends_inside_version

if TYPE_CHECKING:
    from pathlib import Path

    from serving.store.session import PipelineStore

log = logging.getLogger(__name__)


class Plan(NamedTuple):
    """How a micro-batch is written: the segment bases it writes, the versions (first, end) the driver reads
    when it reads and writes it (None: Spark's tasks do), and the tag its writes carry."""

    bases: list[int]
    driver: tuple[int, int] | None
    tag: int
    #: The tag is that of the micro-batch before, left uncommitted: its undo logs go on.
    continues: bool = False


class Planner:
    """The plans of one query's micro-batches (``query``, of pipeline logic ``logic``)."""

    def __init__(self, store: PipelineStore, query: str, logic: str, checkpoint: Path, driver_rows: int) -> None:
        self.store, self.query, self.logic = store, query, logic
        self.checkpoint, self.driver_rows = checkpoint, driver_rows
        #: Why a segment this query would write is not its to write (another logic holds it), if one is not.
        self.waiting: str | None = None

    def plan(self, batch_id: int, summary: Summary, *, ends_inside: bool) -> Plan:
        """Micro-batch ``batch_id``'s plan: the stored one on a replay, else a new one, stored first.
        ``ends_inside``: the micro-batch ends inside a version (``speed_layer.input.ends_inside_version``)."""
        assert summary.last is not None, "a micro-batch without rows is not planned"
        stored = self.store.saved_plan(self.query)
        before: Plan | None = None
        if stored is not None:
            planned_id, planned = stored[0], _decoded(stored[1])
            if planned_id == batch_id:
                if ends_inside and not planned.continues:  # a replay, maybe after the wait for a replica failed
                    self.store.save_plan(self.query, batch_id, stored[1], opens_group=True)
                return planned
            if planned_id < batch_id and ends_inside_version(self.checkpoint, planned_id) is not None:
                before = planned
        bases = self._claimed(self.store.segments.live(summary.barriers))
        small = summary.rows is not None and summary.rows <= self.driver_rows
        versions = (summary.first, summary.end) if small and summary.first is not None and summary.end is not None \
            else None
        plan = Plan(bases, versions, before.tag if before is not None else summary.last, before is not None)
        record = {"bases": plan.bases, "driver": plan.driver, "tag": plan.tag, "continues": plan.continues}
        self.store.save_plan(self.query, batch_id, json.dumps(record), opens_group=ends_inside and before is None)
        return plan

    def _claimed(self, bases: list[int]) -> list[int]:
        """The bases whose segments this query may write: claimed for its logic and by it (``serving.store.logic``).
        The versions a refused segment would get are in the next generation of this logic."""
        mine, self.waiting = [], None
        for base in bases:
            held = self.store.claim_segment(base, self.logic, self.query)
            if held is None:
                mine.append(base)
            elif self.waiting is None:
                self.waiting = (f"waiting for a batch generation of logic {self.logic}: segment {base} holds "
                                f"{held.replace(':', ' ', 1)}, so its answers stay as they are")
        # The served segment (the lowest base) not ours: say which logic waits, so a scheduler of that logic
        # recomputes now (deploy.scheduling.scheduler), also when the served generation is of its logic (a rollback).
        self.store.mark_waiting(self.logic if bases and bases[0] not in mine else None)
        if self.waiting and not mine:
            log.info("speed layer %s", self.waiting)
        return mine


def _decoded(record: str) -> Plan:
    plan = json.loads(record)
    return Plan(plan["bases"], tuple(plan["driver"]) if plan["driver"] else None, plan["tag"], plan["continues"])
