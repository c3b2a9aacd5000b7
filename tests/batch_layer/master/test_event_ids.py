"""The event-id index: built in bounded chunks, the same as in one; idempotent; says how to recover.

The oracle is a plain-Python walk over the commits appended: each (id, version) with its clock (the
running max of the commit timestamps read from the log) and a marker for each version without an id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from deltalake import DeltaTable

from batch_layer.errors import EventIdIndexError, StorageError
from batch_layer.master import event_ids
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.delta_log import read_commit
from batch_layer.master.event_ids import EventIdIndex, clock_of
from deploy.settings import Settings
from shared_logic.registry import load_pipeline

pytestmark = pytest.mark.slow  # over 10 s each: the end-to-end tier

PIPELINE = "tests.support.dedup_pipeline"
COMMITS = [[("p1", "ann"), ("p1", "ann"), ("p2", "bob")], [("p2", "bob")], [], [("p3", "cy"), ("p1", "ann")]]


def _index(settings: Settings, name: str) -> tuple[MasterDataset, EventIdIndex]:
    pipeline = load_pipeline(PIPELINE)
    master = MasterDataset.open(settings, pipeline)
    return master, EventIdIndex(f"{settings.event_ids_uri}/{name}", master, "payment_id")


def _fill(master: MasterDataset) -> int:
    version = 0
    for payments in COMMITS:
        events = [{"payment_id": p, "user_id": u, "amount": 1.0} for p, u in payments]
        version = master.append(master.pipeline.schema.validate(events)) if events else master.append_barrier("none")
    return version


def _oracle(master: MasterDataset, through: int) -> list[tuple[str | None, int, int]]:
    rows, clock = [], 0
    for version, payments in zip(range(1, through + 1), COMMITS):
        commit = read_commit(master.path, version)
        assert commit is not None
        clock = clock_of(commit.timestamp, clock)
        ids = sorted({p for p, _ in payments})
        rows += [(i, version, clock) for i in ids] or [(None, version, clock)]
    return sorted(rows, key=repr)


def test_built_in_chunks_as_in_one_and_idempotent(spark: Any, make_settings: Callable[..., Settings],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(pipeline=PIPELINE)
    master, whole = _index(settings, "whole")
    through = _fill(master)
    state = whole.extend(spark, through, may_seed=False)
    assert (state.through, state.seed) == (through, 0)

    monkeypatch.setattr(event_ids, "FEED_CHUNK_ROWS", 1)
    _, chunked = _index(settings, "chunked")
    assert chunked.extend(spark, through, may_seed=False) == state
    for index in (whole, chunked):
        got = index._dataset().to_table().to_pylist()
        assert sorted(((r["event_id"], r["version"], r["clock"]) for r in got), key=repr) == _oracle(master, through)
        assert all((r["key"] is None) == (r["event_id"] is None) for r in got)
    version = master.append_barrier("later")
    commits = chunked._dataset().count_rows()
    assert chunked.extend(spark, version - 1, may_seed=False) == state and chunked._dataset().count_rows() == commits


def test_an_index_without_its_figures_says_how_to_rebuild_it(spark: Any, make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(pipeline=PIPELINE)
    master, index = _index(settings, "broken")
    index.extend(spark, _fill(master), may_seed=False)
    index._engine.append(index.path, index._dataset().to_table().slice(0, 0), app_id=event_ids.THROUGH_APP,
                         app_version=99)
    with pytest.raises(StorageError, match="delete the folder and the next batch run builds it again"):
        index.state()


def test_a_seed_that_would_change_served_answers_is_refused_with_the_remedies(
        spark: Any, make_settings: Callable[..., Settings]) -> None:
    """The index reaches version 4; the log then loses versions 1-6 (upkeep trimmed it, the index was restored
    from an old backup): a run of the served logic refuses to seed; a run of a new logic seeds."""
    settings = make_settings(pipeline=PIPELINE)
    master, index = _index(settings, "behind")
    index.extend(spark, _fill(master), may_seed=False)
    for _ in range(3):
        version = master.append_barrier("more")
    DeltaTable(str(settings.master_path)).create_checkpoint()
    assert master.trim_log(version).deleted
    with pytest.raises(EventIdIndexError, match="restore the index folder from a backup, or bump the pipeline's "
                                                "logic_version"):
        index.extend(spark, version, may_seed=False)
    assert index.extend(spark, version, may_seed=True) == event_ids.IndexState(version, version, index.state().clock)
    assert index.rows(last=version).num_rows == 3  # p1, p2, p3: each id once, at the seed
