"""Schemathesis hooks for ``test_schemathesis``: how to send an NDJSON body (``SCHEMATHESIS_HOOKS``).

The OpenAPI document describes an NDJSON body by its events (OpenAPI 3.1 has no schema for a
sequence of documents); on the wire each event is one line.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson", "application/jsonl")
def ndjson(ctx: Any, value: Any) -> dict[str, Any]:
    items = value if isinstance(value, list) else [value]
    return {"data": "".join(json.dumps(item) + "\n" for item in items).encode()}
