"""The master clock (``serving.api.freshness``) on a master dataset whose commits hold Unicode line
separators in their texts (so in the statistics, unescaped for U+0085, U+2028, U+2029) and in
their metadata: versions, commit times and lags are still right.

Oracles: the versions the appends returned, delta-rs' own reading of the commit timestamps
(``DeltaTable.history``) and the wall clock around the calls.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from serving.api.freshness import Freshness, MasterClock
from shared_logic import load_pipeline

SEPARATORS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]


def test_commit_times_and_lag_over_commits_holding_line_separators(tmp_path: Path) -> None:
    clock = MasterClock(tmp_path / "master", ttl=0)
    assert asyncio.run(clock.freshness(None, None)) == Freshness(None, None, None, None)

    master = MasterDataset(tmp_path / "master", load_pipeline("wordcount"), get_engine("delta-rs"))
    versions = [
        master.append(master.pipeline.schema.validate([{"text": f"a{sep}b"}, {"text": sep}]),
                      app_id=f"id{sep}", app_version=1, metadata={"note": sep})
        for sep in SEPARATORS
    ]
    latest = versions[-1]
    assert versions == list(range(1, latest + 1))
    history = {h["version"]: h["timestamp"] / 1000 for h in DeltaTable(str(master.path)).history()}
    assert [clock.commit_time(v) for v in versions] == [history[v] for v in versions]
    assert clock.commit_time(latest + 1) is None

    for processed in (0, 4, latest):
        before = time.time()
        fresh = asyncio.run(clock.freshness(processed, None))
        after = time.time()
        assert (fresh.latest_version, fresh.processed_version, fresh.lag_versions) == (
            latest, processed, latest - processed)
        if processed == latest:
            assert fresh.lag_seconds == 0.0
        else:  # the age of the oldest commit not covered yet
            oldest = history[processed + 1]
            assert before - oldest <= fresh.lag_seconds <= after - oldest
    served = asyncio.run(clock.freshness(2, 6))  # the served generation covers more than the speed layer
    assert (served.lag_versions, served.processed_version) == (latest - 6, 2)
