"""Reading GET /metrics in tests: the samples as ``{(name, labels): value}``, one sample, one metric's samples."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(client: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples of GET /metrics as {(name, labels): value}."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain"), response.headers
    return samples(response.text)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def by_name(found: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in found.items() if n == name}
