"""An ingest request's body: reading it within the size limit and validating its events.

1. **Read** (:func:`body_format`, :func:`read_body`): the Content-Type must be JSON (one event or
   an array of events) or NDJSON (one event per line), else 415. The body may not be larger than
   ``Settings.max_body_bytes``: the declared Content-Length is checked before reading, and the
   bytes actually read are counted while reading (chunked uploads declare no length), else 413.
2. **Validate** (:func:`parse_events`): every event is validated from its own bytes as sent,
   with the pipeline's schema in strict JSON mode (``EventSchema.validate_json_lines``: "12" is
   not a number, unknown fields are errors, a key given twice is an error, times and integers
   follow ``shared_logic.event_values``). Every problem is reported with the event's index
   (JSON array) or line (NDJSON) and the field; on any problem the request is rejected (422)
   before it is queued, so it can neither be partly written nor fail other requests. A body that
   is not JSON at all, or nests arrays and objects more than ``MAX_NESTING`` levels deep, is a 400.

Nothing here writes; the committer (``serving.api.ingestor``) does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic_core import from_json

from serving.api.errors import (
    BadRequestError,
    PayloadTooLargeError,
    UnprocessableError,
    UnsupportedMediaTypeError,
)
from shared_logic.errors import EventProblem, EventValidationError

if TYPE_CHECKING:
    from starlette.requests import Request

    from shared_logic.events import EventSchema

#: Content types read as JSON (one event object, or an array of event objects).
JSON_TYPES = ("application/json",)
#: Content types read as NDJSON / JSON Lines (one event object per line; blank lines skipped).
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl")
#: Bodies larger than this are parsed and validated in a worker thread (keeps the loop answering).
INLINE_PARSE_BYTES = 1 << 20
SOURCE = "the request body"

#: Deepest nesting of JSON arrays and objects read from a body (400 beyond). Events are flat, so a
#: valid body nests two levels: an array of event objects.
MAX_NESTING = 32

_JSON_WS = b" \t\n\r"
#: How pydantic-core's JSON parser says a document nests deeper than it reads (about 200 levels).
_PARSER_TOO_DEEP = "recursion limit exceeded"
_LINE = re.compile(r"line (\d+)")


# --------------------------------------------------------------------------------------------
# reading


def body_format(content_type: str | None) -> str:
    """'json' or 'ndjson' for a request's Content-Type; UnsupportedMediaTypeError otherwise."""
    accepted = ", ".join((*JSON_TYPES, *NDJSON_TYPES))
    if not content_type:
        raise UnsupportedMediaTypeError(f"no Content-Type given; send one of: {accepted}")
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaTypeError(f"charset {value.strip()!r} is not accepted: events are UTF-8 JSON")
    if media in JSON_TYPES:
        return "json"
    if media in NDJSON_TYPES:
        return "ndjson"
    raise UnsupportedMediaTypeError(
        f"Content-Type {media!r} is not accepted; send one of: {accepted} "
        "(JSON: one event object or an array of them; NDJSON: one event object per line)"
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or PayloadTooLargeError once it is known to exceed ``limit`` bytes.

    The declared Content-Length is checked before anything is read; the bytes actually received
    are counted while reading (a chunked upload declares no length, and a declared length proves
    nothing until the bytes are there), so an oversized body is never held in memory whole.
    """
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise UnsupportedMediaTypeError(f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequestError(f"Content-Length {declared!r} is not a number of bytes") from None
        if size > limit:
            raise PayloadTooLargeError(_too_large(f"{size} bytes", limit))
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise PayloadTooLargeError(_too_large(f"more than {limit} bytes", limit))
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(what: str, limit: int) -> str:
    return (f"the request body ({what}) is larger than the limit of {limit} bytes (LAMBDA_MAX_BODY_BYTES); "
            "nothing was written: send the events in several requests")


# --------------------------------------------------------------------------------------------
# validating


def parse_events(body: bytes, fmt: str, schema: EventSchema) -> pa.Table:
    """The body's events, validated strictly from the bytes as sent, as an Arrow table (master layout).

    Raises BadRequestError (not JSON, or nested deeper than ``MAX_NESTING``), UnprocessableError
    (JSON, but no events in it) or EventValidationError (every problem, located by index / line
    and field). A valid body nests at most two levels (an array of flat event objects), so the
    nesting is measured only when validation failed; no parser here recurses in Python.
    """
    if fmt == "ndjson":
        return _parse_ndjson(body, schema)
    start = len(body) - len(body.lstrip(_JSON_WS))
    if start == len(body):
        raise UnprocessableError("the body is empty: send one event (a JSON object) or an array of events")
    first = body[start]
    if first not in b"{[":
        _document(body, "the body")  # a body that is not JSON at all is a 400
        raise UnprocessableError(
            "the body is a JSON value but neither an event (a JSON object) nor an array of events; "
            "for one event per line send Content-Type: application/x-ndjson"
        )
    try:
        if first == ord("{"):  # one event
            return schema.validate_json_lines([(0, body)], source=SOURCE)
        events = schema.validate_json_array(body, source=SOURCE)
    except EventValidationError as e:
        _check_nesting(_document(body, "the body", array=first == ord("[")), "the body")
        if first == ord("{"):
            raise _relabel(e, lambda _: "the event") from None
        raise
    if events.num_rows == 0:
        raise UnprocessableError("the body is an empty array: there are no events to ingest")
    return events


def _parse_ndjson(body: bytes, schema: EventSchema) -> pa.Table:
    lines = []
    for number, line in enumerate(body.split(b"\n"), start=1):
        if line.strip(_JSON_WS):
            lines.append((number, line))
    if not lines:
        raise UnprocessableError("the body holds no events: send one JSON object per line")
    try:
        return schema.validate_json_lines(lines, source=SOURCE)  # problems are located by line already
    except EventValidationError as e:
        failed = {p.location for p in e.problems}
        for number, line in lines:
            if f"line {number}" in failed:
                _check_nesting_of(line, f"line {number}")  # a malformed line stays a located problem (422)
        raise


def _document(body: bytes, where: str, *, array: bool = False) -> Any:
    """``body`` parsed (by pydantic-core's parser, which does not recurse in Python), or BadRequestError
    naming the first syntax error, or saying ``where`` nests too deeply for the parser."""
    try:
        return from_json(body, allow_inf_nan=False)
    except ValueError as e:
        message = str(e)
        if message.startswith(_PARSER_TOO_DEEP):
            raise _too_deep(where) from None
        if message.startswith("trailing characters"):
            message = f"unexpected data after the {'array' if array else 'JSON value'}{message[19:]}"
        raise BadRequestError(f"malformed JSON body: {message}") from None


def _check_nesting_of(text: bytes, where: str) -> None:
    """:func:`_check_nesting` of ``text`` if it is JSON at all (a syntax error is left to the caller)."""
    try:
        document = from_json(text, allow_inf_nan=False)
    except ValueError as e:
        if str(e).startswith(_PARSER_TOO_DEEP):
            raise _too_deep(where) from None
        return
    _check_nesting(document, where)


def _check_nesting(document: Any, where: str) -> None:
    """BadRequestError if ``document`` nests arrays and objects more than ``MAX_NESTING`` levels deep."""
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_NESTING:
            raise _too_deep(where)
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _too_deep(where: str) -> BadRequestError:
    return BadRequestError(
        f"{where} nests JSON arrays and objects more than {MAX_NESTING} levels deep, the limit; nothing was "
        "written: events are flat JSON objects, sent one per request, as an array of them, or one per line (NDJSON)"
    )


def _relabel(error: EventValidationError, label: Callable[[int], str]) -> EventValidationError:
    """The same problems, located as this body format names them ("index 3" instead of "line 3")."""

    def locate(location: str) -> str:
        match = _LINE.fullmatch(location)
        return label(int(match.group(1))) if match else location

    return EventValidationError([EventProblem(locate(p.location), p.field, p.message) for p in error.problems],
                                error.source)


async def parse_events_async(body: bytes, fmt: str, schema: EventSchema) -> pa.Table:
    """:func:`parse_events`, in a worker thread for large bodies."""
    if len(body) <= INLINE_PARSE_BYTES:
        return parse_events(body, fmt, schema)
    return await asyncio.to_thread(parse_events, body, fmt, schema)
