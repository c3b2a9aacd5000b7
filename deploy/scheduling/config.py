"""What the batch scheduler needs to know, as a protocol: ``deploy``'s settings satisfy it.

Why a protocol: the settings' checks use ``schedule.py`` beside it, so the scheduler importing the
settings class would close a cycle; and this is the scheduler's whole contract with ``deploy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from batch_layer.recompute.job import RecomputeConfig


class SchedulerConfig(RecomputeConfig, Protocol):
    """A recompute's configuration, plus the schedule, the lock's folder and the master's upkeep
    (see ``deploy.settings.Settings`` for each field's meaning)."""

    @property
    def data_dir(self) -> Path: ...

    @property
    def pipeline_slug(self) -> str: ...

    @property
    def batch_schedule(self) -> str | None: ...

    @property
    def master_compact_every(self) -> str | None: ...

    @property
    def master_compact_commits(self) -> int: ...

    @property
    def master_log_keep_versions(self) -> int: ...

    @property
    def master_vacuum_retention_hours(self) -> float: ...
