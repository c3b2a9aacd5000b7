"""HTTP ingest: reading and validating request bodies, group commit, idempotent retries.

A request goes through three steps; only the last one writes.

1. **Read** (:func:`body_format`, :func:`read_body`): the Content-Type must be JSON (one event or
   an array of events) or NDJSON (one event per line), else 415. The body may not be larger than
   ``Settings.max_body_bytes``: the declared Content-Length is checked before reading, and the
   bytes actually read are counted while reading (chunked uploads declare no length), else 413.
2. **Validate** (:func:`parse_events`): every event is validated from its own bytes as sent,
   with the pipeline's schema in strict JSON mode (``EventSchema.validate_json_lines``: "12" is
   not a number, unknown fields are errors). Every problem is reported with the event's index
   (JSON array) or line (NDJSON) and the field; on any problem the request is rejected (422)
   before it is queued, so it can neither be partly written nor fail other requests. A body that
   is not JSON at all, or nests arrays and objects more than ``MAX_NESTING`` levels deep, is a 400.
3. **Commit** (:class:`Ingestor`): validated requests wait in a queue; one committer task appends
   every request gathered for ``Settings.ingest_group_commit_ms`` to the master dataset in ONE
   Delta commit and answers each with that commit's version: ``{"accepted": n, "version": v}``.
   With an ``Idempotency-Key`` (:class:`IdempotencyKey`), a retry is answered with the first
   answer and writes nothing.

The three steps live in ``serving.api.request_body`` (read, validate), ``serving.api.ingestor``
(commit) and ``serving.api.idempotency`` (the ``Idempotency-Key`` header and replayed answers);
this module names them together.
"""

from __future__ import annotations

from serving.api.idempotency import (
    IDEMPOTENCY_KEY_PATTERN,
    KEYS_METADATA,
    MAX_KEY_LENGTH,
    IdempotencyKey,
    IngestReceipt,
)
from serving.api.ingestor import MAX_COMMIT_BYTES, MAX_CONFLICT_RETRIES, Ingestor
from serving.api.request_body import (
    INLINE_PARSE_BYTES,
    JSON_TYPES,
    MAX_NESTING,
    NDJSON_TYPES,
    SOURCE,
    body_format,
    parse_events,
    parse_events_async,
    read_body,
)

__all__ = [
    "IDEMPOTENCY_KEY_PATTERN", "INLINE_PARSE_BYTES", "JSON_TYPES", "KEYS_METADATA", "MAX_COMMIT_BYTES",
    "MAX_CONFLICT_RETRIES", "MAX_KEY_LENGTH", "MAX_NESTING", "NDJSON_TYPES", "SOURCE", "IdempotencyKey",
    "IngestReceipt", "Ingestor", "body_format", "parse_events", "parse_events_async", "read_body",
]
