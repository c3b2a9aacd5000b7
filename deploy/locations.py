"""Where a pipeline's things are, derived from its settings: its Delta tables (a local folder or ``s3://``),
its checkpoints, its embedded Redis's folder and the local API key.

``Locations`` is a part of ``deploy.settings.Settings`` (as ``deploy.kafka_settings`` is): it holds no values
of its own, only what follows from ``data_dir``, ``tables_uri`` and ``pipeline``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from deploy.errors import ConfigError

LOCAL_API_KEY_FILE = "local_api_key"


class Locations:
    """The places of one pipeline of one installation (``Settings.for_pipeline`` picks the pipeline)."""

    if TYPE_CHECKING:  # the settings' fields these derive from
        data_dir: Path
        tables_uri: str | None
        pipeline: str

    @property
    def tables_root(self) -> str:
        """Where the Delta tables live: an absolute local path or an ``s3://`` URI."""
        from batch_layer.master.object_store import table_uri

        return table_uri(self.tables_uri or self.data_dir.resolve())

    @property
    def tables_on_object_store(self) -> bool:
        from batch_layer.master.object_store import is_object_store

        return is_object_store(self.tables_root)

    def _pipeline_table(self, kind: str) -> str:
        from batch_layer.master.object_store import join

        return join(self.tables_root, kind, self.pipeline_slug)

    @property
    def master_uri(self) -> str:
        """The pipeline's master dataset (one Delta table): a local path or an ``s3://`` URI."""
        return self._pipeline_table("master")

    @property
    def dead_letters_uri(self) -> str:
        """The pipeline's dead-letter table (``batch_layer.master.dead_letters``): a local path or an ``s3://`` URI."""
        return self._pipeline_table("dead_letters")

    @property
    def event_ids_uri(self) -> str:
        """The pipeline's event-id index (``batch_layer.master.event_ids``), for a pipeline declaring an event id."""
        return self._pipeline_table("event_ids")

    @property
    def gold_uri(self) -> str:
        """Folder of the pipeline's gold tables, one Delta table per view: a local path or an ``s3://`` URI."""
        return self._pipeline_table("gold")

    @property
    def master_path(self) -> Path:
        """The master dataset as a local folder (tables on a local folder only: ConfigError on object storage)."""
        return self._local(self.master_uri)

    @property
    def gold_path(self) -> Path:  # the gold tables' folder as a local folder (tables on a local folder only)
        return self._local(self.gold_uri)

    def _local(self, uri: str) -> Path:
        if self.tables_on_object_store:
            raise ConfigError(f"the tables are on object storage ({uri}): use the URI, not a local path")
        return Path(uri)

    @property
    def speed_checkpoint_path(self) -> Path:
        """The speed layer's streaming checkpoint (offsets = master versions)."""
        return self.data_dir.resolve() / "checkpoints" / self.pipeline_slug / "speed"

    @property
    def kafka_checkpoint_path(self) -> Path:
        """The Kafka ingest query's checkpoint (offsets = Kafka offsets; its id names the master's transactions)."""
        return self.data_dir.resolve() / "checkpoints" / self.pipeline_slug / "kafka-ingest"

    @property
    def redis_dir(self) -> Path:
        return self.data_dir.resolve() / "redis"

    @property
    def local_api_key_path(self) -> Path:
        """The local API key ``up`` (and ``serve``) make when LAMBDA_API_KEYS is unset (0600)."""
        return self.data_dir.resolve() / LOCAL_API_KEY_FILE

    @property
    def pipeline_slug(self) -> str:
        """The pipeline setting as a safe folder / key name (dotted paths keep their dots)."""
        return self.pipeline.replace("/", "_")
