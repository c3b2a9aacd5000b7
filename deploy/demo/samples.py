"""Sample events for the built-in pipelines (what `up` loads on a fresh data dir)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "lambda", "speed", "batch", "serving", "view", "version", "barrier", "monoid", "delta", "redis", "spark", "stream", "exact", "merge"]
_MERCHANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell")


def _wordcount(rng: random.Random, n: int, start: datetime) -> Iterator[dict[str, Any]]:
    for i in range(n):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        yield {"text": words, "event_time": (start + timedelta(seconds=i * 7)).isoformat()}


def _payments(rng: random.Random, n: int, start: datetime) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "user_id": f"user-{rng.randint(1, 50):03d}",
            "merchant": rng.choice(_MERCHANTS),
            "amount": round(rng.uniform(1, 250), 2),
            "event_time": (start + timedelta(seconds=i * 13)).isoformat(),
        }


SAMPLES: dict[str, Callable[[random.Random, int, datetime], Iterator[dict[str, Any]]]] = {
    "wordcount": _wordcount,
    "payments": _payments,
}


def sample_events(pipeline: str, n: int = 2_000, *, seed: int = 7) -> list[dict[str, Any]] | None:
    """``n`` reproducible events for a built-in pipeline, or None for a pipeline with no samples."""
    make = SAMPLES.get(pipeline)
    if make is None:
        return None
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
    return list(make(random.Random(seed), n, start))
