"""Ingest with an Idempotency-Key of events whose text holds a Unicode
line separator.

delta-rs writes U+0085, U+2028 and U+2029 unescaped in a commit's column statistics (and escapes the
others), so a Delta log read with ``str.splitlines()`` cut the commit's lines apart: the first
request was acknowledged (202), but every retry with the same key answered 503 forever. Here each
separator goes into the texts of a real server's request (so into the minimum and maximum
statistics of the commit); the retry must answer the first answer, byte for byte, and the master
dataset, read back independently with delta-rs' change data feed, holds the events exactly once,
at the version the answer named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deploy.settings import Settings
from tests.support import web

KEY = "test-ingest-key-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}

#: Everything Python's str.splitlines() splits on besides "\n" (and "\r\n").
SEPARATORS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]


def master_texts(settings: Settings) -> list[tuple[str, int]]:
    """(text, commit version) of every event row in the master dataset, read with delta-rs' change feed."""
    table = DeltaTable(str(settings.master_path))
    rows = pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=0)).read_all().to_pylist()
    return [(r["text"], r["_commit_version"]) for r in rows if r["_kind"] == "event" and r["_change_type"] == "insert"]


@pytest.mark.parametrize("sep", SEPARATORS, ids=[f"U+{ord(s):04X}" for s in SEPARATORS])
def test_a_retry_of_a_keyed_request_with_a_line_separator_in_its_text_answers_the_first_answer(
    api: Callable[..., Any], make_settings: Callable[..., Settings], sep: str
) -> None:
    settings = make_settings(pipeline="wordcount")
    # the separator inside, alone (the minimum) and last (the maximum) of the column's values
    events = [{"text": f"a{sep}b"}, {"text": sep}, {"text": f"z{sep}"}]
    key = {"Idempotency-Key": "order-1"}
    with api(pipeline="wordcount", api_keys={KEY: ["ingest"]}) as server, \
            web.client(base_url=server.base_url, headers=AUTH, timeout=30) as http:
        first = http.post("/v1/events", json=events, headers=key)
        assert first.status_code == 202, first.text
        for _ in range(2):
            retry = http.post("/v1/events", json=events, headers=key)
            assert (retry.status_code, retry.content) == (first.status_code, first.content), retry.text
            assert retry.headers["idempotent-replayed"] == "true"
        # a keyed request committed after it is found by its own retry too
        later = http.post("/v1/events", json=[{"text": f"later{sep}"}], headers={"Idempotency-Key": "order-2"})
        assert later.status_code == 202, later.text
        again = http.post("/v1/events", json=[{"text": f"later{sep}"}], headers={"Idempotency-Key": "order-2"})
        assert (again.status_code, again.content) == (later.status_code, later.content), again.text

    version, later_version = first.json()["version"], later.json()["version"]
    assert sorted(master_texts(settings)) == sorted(
        [(e["text"], version) for e in events] + [(f"later{sep}", later_version)]
    )
