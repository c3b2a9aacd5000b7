"""A test's master dataset: opened as the platform opens it, or a bare Delta table of a few versions."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from batch_layer.master.dataset import MasterDataset
from deploy.settings import Settings
from shared_logic.registry import load_pipeline


def open_master(settings: Settings) -> MasterDataset:
    """The master dataset of ``settings``' pipeline."""
    return MasterDataset.open(settings, load_pipeline(settings.pipeline))


def master_with_versions(settings: Settings, versions: int) -> None:
    """A Delta table at the master path with versions 0 .. versions - 1, in the pipeline's master layout
    (the API refuses at start a master dataset its event model does not fit)."""
    schema = load_pipeline(settings.pipeline).schema.arrow_schema()
    for i in range(versions):
        row = {"text": f"w{i}", "event_time": None, "_kind": "event"}
        write_deltalake(str(settings.master_path), pa.Table.from_pylist([row], schema=schema), mode="append")
