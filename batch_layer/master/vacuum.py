"""Vacuum: deleting the data files of a Delta table that no version still read needs.

Delta's VACUUM deletes the files commits removed (tombstones) once the removal is older than a
retention period, measured from the removing commit's time. A reader of version V needs every file
of V's snapshot; a file removed by commit K belongs to the snapshots of versions before K only. So
to keep every version from ``keep_from`` on readable, the files removed by commits after
``keep_from`` must stay: the retention has to reach back to the commit right after ``keep_from``.
:func:`retention_hours` computes that, in whole hours rounded up (as VACUUM takes it) with a margin
for the time VACUUM itself takes to start, and never below the configured floor;
:func:`vacuum_table` runs delta-rs's VACUUM with it, on any Delta table whichever engine wrote it.

VACUUM here deletes tombstoned files only (delta-rs's default "lite" mode), never files no commit
names: an ingest's file written but not committed yet is not at risk. It records itself as two
commits that change no data (VACUUM START and END); ``Commit.changes_data`` tells them from a change.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from deltalake import CommitProperties
from deltalake.exceptions import DeltaError

from batch_layer.errors import StorageError
from batch_layer.master.delta_log import newest_version, open_table, read_commit
from batch_layer.master.object_store import Location

#: Added to the age of the oldest commit to keep (seconds): VACUUM measures from its own clock, later.
MARGIN_SECONDS = 600.0


class VacuumRefusedError(StorageError):
    """VACUUM cannot be run safely: when the commit after the version to keep was made is unknown."""


@dataclass(frozen=True)
class Vacuumed:
    """What one VACUUM did: the retention it used (hours) and the files it deleted."""

    retention_hours: int
    files_deleted: int


def retention_hours(table: Location, keep_from: int, *, floor_hours: float, now: float | None = None) -> int:
    """The retention (whole hours) that keeps every version from ``keep_from`` on readable, at least ``floor_hours``."""
    latest = newest_version(table)
    floor = math.ceil(floor_hours)
    if latest is None or keep_from >= latest:
        return floor  # no commit after it: nothing it reads has been removed
    commit = read_commit(table, keep_from + 1)
    if commit is None or commit.timestamp is None:
        raise VacuumRefusedError(
            f"cannot tell when version {keep_from + 1} of {table} was committed (its commit file is gone or has no "
            f"timestamp), so no retention is known to keep version {keep_from} readable; nothing was vacuumed")
    age = max(0.0, (time.time() if now is None else now) - commit.timestamp) + MARGIN_SECONDS
    return max(floor, math.ceil(age / 3600))


def vacuum_table(table: Location, keep_from: int, *, floor_hours: float, what: str) -> Vacuumed:
    """VACUUM ``table`` keeping every version from ``keep_from`` on readable (see the module docstring)."""
    hours = retention_hours(table, keep_from, floor_hours=floor_hours)
    try:
        deleted = open_table(table).vacuum(
            retention_hours=hours, dry_run=False, enforce_retention_duration=False,
            commit_properties=CommitProperties(custom_metadata={"lambda.upkeep": f"vacuum {what}"}))
    except DeltaError as e:
        raise StorageError(f"cannot vacuum {what} at {table}: {e}") from e
    return Vacuumed(hours, len(deleted))
