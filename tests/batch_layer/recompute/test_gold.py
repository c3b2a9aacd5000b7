"""Gold retention: the newest generations of a gold table, and the served one, stay readable.

A gold table is written as the batch run writes it: one overwrite commit per generation recording
the application transaction ("lambda-batch", generation). Oracle: generation g's rows, as written
here. VACUUM's own deletions are covered by ``test_vacuum``; here, which versions must stay.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from batch_layer.recompute.gold import APP_ID, prune_generations


def write_generations(table: Path, generations: list[int]) -> dict[int, int]:
    """Generation -> the table version holding it; generation g's rows are [g] * g."""
    versions = {}
    for g in generations:
        write_deltalake(str(table), pa.table({"g": [g] * g}), mode="overwrite",
                        commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, g)]))
        versions[g] = DeltaTable(str(table)).version()
    return versions


def test_the_newest_generations_and_the_served_one_are_kept(tmp_path: Path) -> None:
    table = tmp_path / "word_counts"
    versions = write_generations(table, [3, 7, 12, 20])
    assert prune_generations(str(table), keep=5, served=20) is None, "fewer generations than to keep"

    pruned = prune_generations(str(table), keep=2, served=20)
    assert pruned is not None and pruned.keep_from == versions[12]
    pruned = prune_generations(str(table), keep=2, served=7)  # a newer one was written but lost the flip
    assert pruned is not None and pruned.keep_from == versions[7]
    for g in (7, 12, 20):
        assert DeltaTable(str(table), version=versions[g]).to_pyarrow_table()["g"].to_pylist() == [g] * g
    with pytest.raises(ValueError, match="at least the newest"):
        prune_generations(str(table), keep=0, served=None)
