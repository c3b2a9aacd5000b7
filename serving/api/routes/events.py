"""HTTP ingest, ``POST /v1/events``: read, validate, commit; only the last step writes.

1. **Read and validate** (``serving.api.request_body``): JSON or NDJSON within ``max_body_bytes``,
   every event checked strictly from its own bytes; any problem rejects the whole request before it
   is queued (415, 413, 400, 422 naming the event and field), so nothing is ever half-written.
2. **Commit** (``serving.api.ingestor``): requests gathered for ``ingest_group_commit_ms`` go to the
   master dataset in ONE Delta commit; each is answered with that commit's version.
3. **Retries** (``serving.api.idempotency``): with an ``Idempotency-Key`` a retry gets the first
   answer and writes nothing, across restarts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from serving.api.idempotency import IDEMPOTENCY_KEY_PATTERN, MAX_KEY_LENGTH, IdempotencyKey
from serving.api.ingestor import Ingestor
from serving.api.metrics import EVENTS_INGESTED
from serving.api.models import ErrorBody
from serving.api.request_body import JSON_TYPES, MAX_NESTING, NDJSON_TYPES, body_format, parse_events_async, read_body
from shared_logic.pipeline import Pipeline


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """One group committer per app; at shutdown what is queued is committed before it stops."""
    _document_pipeline(app)
    ingestor = _ingestor(app)
    try:
        yield
    finally:
        await ingestor.close()


router = APIRouter(prefix="/v1/events", tags=["ingest"], lifespan=_lifespan)


class IngestAnswer(BaseModel):
    """What an ingest request committed."""

    accepted: int = Field(description="Events of this request now in the master dataset.", examples=[3])
    version: int = Field(
        description="Master-dataset version (Delta commit) holding them. Concurrent requests may share a commit.",
        examples=[42],
    )


_EXAMPLE_TIME = "2024-03-01T09:00:00Z"

DESCRIPTION = f"""
Appends events to the pipeline's master dataset and answers **202** with how many were accepted
and the master version holding them. From that version on the speed layer counts them (when it
runs); a batch run recomputing at or after it includes them.

**Body**, by `Content-Type`:

* `application/json`: one event (a JSON object) or an array of events;
* `application/x-ndjson` (or `application/jsonl`): one event object per line, blank lines skipped.

Each event is validated strictly against the pipeline's event model, from the bytes as sent:
no type coercion (`"12"` is not a number), unknown fields are errors, a field given twice in
one object is an error (naming it), a missing optional `event_time` becomes the ingest time. **All or nothing:** if any event is invalid the answer is
422, listing every problem with the event's position (`index 3` of an array, `line 7` of NDJSON,
or `the event`) and its field, and nothing of the request is written.

Concurrent requests are committed together (group commit: one Delta commit per
`LAMBDA_INGEST_GROUP_COMMIT_MS` window), so several requests may answer with the same `version`.

**Idempotency-Key** (optional, 1 to 255 printable ASCII characters, as in the IETF Idempotency-Key draft):
a retried request with the same key and body writes nothing and gets the first answer again
(with `Idempotent-Replayed: true`), also after a server restart; the key is recorded in the
master dataset's Delta log in the same commit as the events. The same key with another body is
a 422. Send one whenever a request might be retried (timeouts, 503). A malformed key is a 400.

Limits: bodies up to `LAMBDA_MAX_BODY_BYTES` (413 above); JSON nested at most
{MAX_NESTING} levels deep (events are flat; 400 above). A time is a JSON string: ISO 8601 with
date and time (`2024-03-01T09:00:00Z`; no offset means UTC) or epoch seconds (`"1709283600"`, at
most 6 decimals, always seconds, never milliseconds); a JSON number is not a time. Times lie from
0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z (a time with an offset must fall inside once
converted). Integers lie within 64 bits (-2^63 to 2^63-1), in float fields too: write a float
beyond that with a decimal point or an exponent.
"""

_JSON_EXAMPLES: dict[str, Any] = {
    "one": {"summary": "One event (wordcount)", "value": {"text": "the quick brown fox", "event_time": _EXAMPLE_TIME}},
    "array": {
        "summary": "Several events (wordcount)",
        "value": [{"text": "the quick brown fox"}, {"text": "jumps over the lazy dog", "event_time": _EXAMPLE_TIME}],
    },
}
_NDJSON_EXAMPLE = (
    '{"text": "the quick brown fox"}\n'
    f'{{"text": "jumps over the lazy dog", "event_time": "{_EXAMPLE_TIME}"}}\n'
)

_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One event: the fields of the served pipeline's event model (unknown fields are rejected).",
    "additionalProperties": True,
}


def _request_body(event_schema: dict[str, Any], json_examples: dict[str, Any], ndjson: str) -> dict[str, Any]:
    json_content = {
        "schema": {"oneOf": [event_schema, {"type": "array", "items": event_schema, "minItems": 1}]},
        "examples": json_examples,
    }
    ndjson_content = {
        # OpenAPI 3.1 has no schema for a sequence of documents (3.2's itemSchema): this one describes the
        # events, and the description says each is sent as one line.
        "schema": {"type": "array", "items": event_schema, "minItems": 1,
                   "description": "The events, each sent as one JSON object per line (NDJSON / JSON Lines)."},
        "examples": {"lines": {"summary": "Events, one per line", "value": ndjson}},
    }
    return {
        "required": True,
        "description": "One event, an array of events, or NDJSON (one event per line).",
        "content": {**dict.fromkeys(JSON_TYPES, json_content), **dict.fromkeys(NDJSON_TYPES, ndjson_content)},
    }


RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {
        "description": "Committed: the events are in the master dataset at `version`.",
        "headers": {
            "Idempotent-Replayed": {
                "description": "`true` when a retried Idempotency-Key was answered with the first answer.",
                "schema": {"type": "string"},
            }
        },
    },
    400: {"model": ErrorBody,
          "description": "The body is not JSON (the detail gives line and column), JSON nested too deeply, or a "
                         "malformed Idempotency-Key."},
    413: {"model": ErrorBody, "description": "The body is larger than `LAMBDA_MAX_BODY_BYTES`; nothing was written."},
    415: {"model": ErrorBody, "description": "Content-Type is not application/json or application/x-ndjson."},
    422: {
        "model": ErrorBody,
        "description": "Invalid events (every problem with its index or line and field), no events, or an "
                       "Idempotency-Key reused with a different body. Nothing was written.",
        "content": {"application/json": {"example": {
            "error": "EventValidationError",
            "detail": "2 problem(s) in the request body; nothing was written:\n"
                      "  index 1, field 'amount': Input should be a valid number\n"
                      "  index 2, field 'colour': Extra inputs are not permitted",
        }}},
    },
    503: {"model": ErrorBody,
          "description": "The commit failed; nothing was acknowledged. Retry (with the same Idempotency-Key)."},
}


@router.post(
    "",
    status_code=202,
    response_model=IngestAnswer,
    summary="Ingest events (one, an array, or NDJSON)",
    description=DESCRIPTION,
    responses=RESPONSES,
    openapi_extra={"requestBody": _request_body(_EVENT_SCHEMA, _JSON_EXAMPLES, _NDJSON_EXAMPLE)},
)
async def ingest_events(
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Makes a retry of this request a no-op answered with the first answer "
                        f"(1-{MAX_KEY_LENGTH} printable ASCII characters; 400 otherwise).",
            min_length=1, max_length=MAX_KEY_LENGTH, pattern=IDEMPOTENCY_KEY_PATTERN,
        ),
    ] = None,
) -> Response:
    app = request.app
    fmt = body_format(request.headers.get("content-type"))
    body = await read_body(request, app.state.settings.max_body_bytes)
    key = IdempotencyKey.of(idempotency_key, fmt, body) if idempotency_key is not None else None
    events = await parse_events_async(body, fmt, app.state.pipeline.schema)
    receipt = await _ingestor(app).ingest(events, key)
    if not receipt.replayed:
        EVENTS_INGESTED.inc(receipt.accepted)
    headers = {"Idempotent-Replayed": "true"} if receipt.replayed else None
    return Response(receipt.json(), status_code=202, media_type="application/json", headers=headers)


def _ingestor(app: FastAPI) -> Ingestor:
    ingestor = getattr(app.state, "ingestor", None)
    if ingestor is None:  # also without a lifespan (an app driven directly)
        ingestor = app.state.ingestor = Ingestor.for_app(app.state.settings, app.state.pipeline)
    return ingestor


# --------------------------------------------------------------------------------------------
# OpenAPI: the request body documented with the served pipeline's own event model


def _document_pipeline(app: FastAPI) -> None:
    """Make /openapi.json show the served pipeline's event model and examples valid for it."""
    pipeline: Pipeline = app.state.pipeline
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        name = f"{pipeline.event_model.__name__}Event"
        model_schema = pipeline.event_model.model_json_schema(ref_template="#/components/schemas/{model}")
        schema.setdefault("components", {}).setdefault("schemas", {})[name] = model_schema
        example = _example_event(pipeline)
        required = {k: v for k, v in example.items() if pipeline.event_model.model_fields[k].is_required()}
        operation = schema.get("paths", {}).get(router.prefix, {}).get("post")
        if operation is not None:
            operation["requestBody"] = _request_body(
                {"$ref": f"#/components/schemas/{name}"},
                {
                    "one": {"summary": f"One event ({pipeline.name})", "value": example},
                    "array": {"summary": f"Several events ({pipeline.name})", "value": [example, required]},
                },
                f"{_json_line(example)}\n{_json_line(required)}\n",
            )
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _example_event(pipeline: Pipeline) -> dict[str, Any]:
    samples = {str: "example", int: 1, float: 1.5, bool: True, datetime: _EXAMPLE_TIME}
    event: dict[str, Any] = {}
    for name, info in pipeline.event_model.model_fields.items():
        if info.examples:
            event[name] = info.examples[0]
        else:
            kind = pipeline.schema.fields[name][0]
            event[name] = samples.get(kind, "example")
    return event


def _json_line(event: dict[str, Any]) -> str:
    import json

    return json.dumps(event)
