"""The master dataset: an append-only Delta table of events, the platform's source of truth.

``dataset.MasterDataset`` is the only way in: validated appends (with idempotent commits),
barriers, snapshots at a version, compaction. ``storage`` chooses the engine (delta-rs or
delta-spark) behind it; ``delta_log`` is the only reader of ``_delta_log`` files.
"""
