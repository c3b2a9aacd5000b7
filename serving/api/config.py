"""What the HTTP API needs to know, as a protocol: ``deploy``'s settings satisfy it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from batch_layer.master.dataset import MasterConfig
from batch_layer.master.dead_letters import DeadLetterConfig


class ApiConfig(MasterConfig, DeadLetterConfig, Protocol):
    """The API's configuration (see ``deploy.settings.Settings`` for each field's meaning)."""

    @property
    def pipeline(self) -> str: ...

    @property
    def pipeline_names(self) -> Sequence[str]:
        """Every pipeline the API serves, the default (un-prefixed routes) first."""

    def for_pipeline(self, name: str) -> ApiConfig:
        """The configuration of pipeline ``name`` alone."""

    @property
    def http_host(self) -> str: ...

    @property
    def api_keys(self) -> Mapping[str, Sequence[str]] | None: ...

    @property
    def max_body_bytes(self) -> int: ...

    @property
    def ingest_group_commit_ms(self) -> float: ...

    @property
    def max_range_panes(self) -> int:
        """Most panes a key read or key listing combines."""

    @property
    def max_top_panes(self) -> int:
        """Most panes a top-N combines."""

    @property
    def max_top_cells(self) -> int:
        """Most n x panes of a top-N over several panes."""

    @property
    def top_call_budget(self) -> int:
        """Most work one Lua call of a top-N over several panes does."""

    @property
    def max_session_top_keys(self) -> int:
        """Most rows of a session view a session top-N reads (one bucket)."""

    @property
    def session_top_bytes(self) -> int:
        """Most bytes of session rows a session top-N reads, over every bucket (each call its share)."""
