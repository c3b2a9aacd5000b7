"""The query benchmark's data: random wordcount lines, and the setup step (run in a child process) that
appends them to the master dataset and publishes one generation."""

from __future__ import annotations

import collections
import json
import random
import string
import time
from pathlib import Path

PIPELINE = "wordcount"
VIEW = "word_counts"


def make_events(lines: int, vocab: int, seed: int) -> tuple[list[dict[str, str]], collections.Counter[str]]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < vocab:
        words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))))
    vocabulary = sorted(words)
    events, counts = [], collections.Counter()
    for i in range(lines):
        line = [rng.choice(vocabulary) for _ in range(rng.randint(4, 12))]
        counts.update(line)
        events.append({"text": " ".join(line),
                       "event_time": f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"})
    return events, counts


def setup(data_dir: Path, redis_url: str, lines: int, vocab: int, seed: int, out: Path) -> None:
    """Master dataset + one published generation; writes the expected counts to ``out``."""
    from batch_layer.master.dataset import MasterDataset
    from batch_layer.recompute.job import run_batch
    from deploy.runtime.spark import build_spark
    from deploy.settings import load_settings
    from shared_logic.registry import load_pipeline

    settings = load_settings(data_dir=data_dir, pipeline=PIPELINE, redis_url=redis_url)
    pipeline = load_pipeline(PIPELINE)
    events, counts = make_events(lines, vocab, seed)
    master = MasterDataset.open(settings, pipeline)
    version = master.append(pipeline.schema.validate(events))
    started = time.perf_counter()
    spark = build_spark(settings, "query-bench-setup")
    try:
        result = run_batch(spark, settings, pipeline, redis_url=redis_url)
    finally:
        spark.stop()
    out.write_text(json.dumps({"version": version, "generation": result.generation, "events": result.events,
                               "rows": result.view_rows, "seconds": time.perf_counter() - started,
                               "counts": dict(counts)}))

