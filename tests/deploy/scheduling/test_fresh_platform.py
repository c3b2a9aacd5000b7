"""A fresh platform with one's own pipeline: an empty master dataset is no error.

The scheduler skips a run over an empty master ("holds no events yet") instead of publishing an
empty generation, and as soon as the first events land it publishes a generation at once, without
waiting for its next tick (here an hour away). Oracle: the distinct words of the events ingested.
"""

from __future__ import annotations

import pytest

from batch_layer.master.dataset import MasterDataset
from shared_logic.registry import load_pipeline
from tests.support import ingest_texts, registry, runs_with, scheduler_thread, served_generation, wait_for


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_empty_master_is_skipped_and_the_first_events_are_published_at_once(spark, make_settings) -> None:
    settings = make_settings(batch_schedule="1h")
    pipeline = load_pipeline(settings.pipeline)
    MasterDataset.open(settings, pipeline).ensure()  # what `up` does
    runs = registry(settings)
    texts = ["first words here", "first light"]
    with scheduler_thread(spark, settings):
        [skipped] = wait_for(lambda: runs_with(runs, "skipped"), timeout=60, what="the first tick, on an empty master")
        assert "holds no events yet" in skipped.skip_reason
        assert served_generation(settings) is None, "nothing is published over an empty master"
        version = ingest_texts(settings, texts)
        [run] = wait_for(lambda: runs_with(runs, "succeeded"), timeout=240,
                         what="the first generation, without waiting for the hourly tick")
    assert run.master_version == version and served_generation(settings) == run.generation
    assert run.events == len(texts)
    assert run.rows["word_counts"] == len({w for t in texts for w in t.split()})
