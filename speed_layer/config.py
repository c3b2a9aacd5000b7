"""What the speed layer needs to know, as a protocol: ``deploy``'s settings satisfy it."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from batch_layer.master.dataset import MasterConfig
from batch_layer.master.event_ids import EventIdConfig


class SpeedConfig(MasterConfig, EventIdConfig, Protocol):
    """The speed layer's configuration (see ``deploy.settings.Settings`` for each field's meaning)."""

    @property
    def speed_checkpoint_path(self) -> Path: ...

    @property
    def speed_trigger_seconds(self) -> float: ...

    @property
    def speed_max_versions_per_trigger(self) -> int: ...

    @property
    def speed_max_rows_per_trigger(self) -> int | None: ...

    @property
    def speed_write_partitions(self) -> int: ...

    @property
    def speed_chunk_rows(self) -> int: ...

    @property
    def speed_driver_rows(self) -> int: ...
