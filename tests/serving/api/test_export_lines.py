"""The NDJSON export's only line breaks are the ones ending rows.

``GET /v1/views/{view}/keys`` with ``Accept: application/x-ndjson`` wrote U+0085, U+2028 and U+2029
raw inside keys: valid JSON, but a reader splitting lines on every Unicode line break (Python's
``str.splitlines``) cut such a row in two. Now they are JSON escapes. The oracle is the set of keys
sent (with their counts); the stream is read both with ``splitlines`` and by ``\\n`` alone.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, web

USERS = ["plain", "line\u2028separator", "paragraph\u2029separator", "next\u0085line", "vertical\x0btab",
         "form\x0cfeed", "group\x1dseparator", "new\nline", "carriage\rreturn", "both\u2028\u0085\u2029"]


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_ndjson_rows_are_one_line_each_for_every_line_reader(spark: Any, make_settings: Callable[..., Settings],
                                                              api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    sent = [u for i, u in enumerate(USERS) for _ in range(i + 1)]
    time = datetime(2024, 3, 1, 9, tzinfo=timezone.utc).isoformat()
    ingest_file(settings, [{"user_id": u, "merchant": "m", "amount": 1.0, "event_time": time} for u in sent],
                tmp_path / "events.jsonl")
    run_batch(spark, settings, load_pipeline("payments"), redis_url=settings.redis_url)
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=30) as client:
        response = client.get("/v1/views/spend_by_user/keys", headers={"Accept": "application/x-ndjson"})
        assert response.status_code == 200, response.text
        text = response.content.decode("utf-8")
        for raw in ("\u2028", "\u2029", "\u0085"):
            assert raw not in text
        by_newline = text.split("\n")
        assert by_newline[-1] == "" and text.splitlines() == by_newline[:-1]
        rows = [json.loads(line) for line in text.splitlines()]
        assert {r["key"]: r["value"]["count"] for r in rows} == dict(Counter(sent))
        page = client.get("/v1/views/spend_by_user/keys", params={"limit": 1000}).json()["keys"]
        assert rows == page
