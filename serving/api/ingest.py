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
3. **Commit** (:class:`Ingestor`): validated requests wait in a queue; one committer task
   gathers requests for ``Settings.ingest_group_commit_ms`` (counted from the oldest waiting
   request's arrival, or from the end of the previous commit if that is later) and appends
   all of them to the master dataset in ONE Delta commit, off the event loop (a worker thread).
   Every request of the group is answered with that commit's version:
   ``{"accepted": n, "version": v}``. A delta-rs commit costs 10-20 ms of CPU here whatever its
   size, and commits to one table are serial anyway, so sharing them is what lets many small
   requests through: under load one commit takes every request in flight.

Idempotency (the ``Idempotency-Key`` header)
--------------------------------------------
A key is turned into a Delta application transaction id, ``ingest:<sha256(key)>``, recorded in
the same commit as the request's events. Nothing besides the Delta table is needed to know
whether a key was committed, so it holds across restarts, across server processes on the same
data dir, and cannot disagree with the data: the events and the key land in one atomic commit
or neither does. The first answer is kept in that same commit: its custom commit metadata
(``lambda.ingest.keys``) maps the transaction id to the number of events accepted and a hash
of the request body. The commit's version is the answer's other half; to find the commit again
without scanning the whole log, the transaction's app version is the table version the commit
was prepared on plus one, a lower bound of the version it lands at, so a retry reads the commit
files from there on (normally just one: the commit lands where it was prepared unless another
writer won the race). We chose this over a side store (a file or Redis key per idempotency key)
because a side store is written after the commit and can be lost or disagree with it (a crash
in between, Redis losing its data); the Delta log is the source of truth already.

* A retry (same key, same body) is answered with the first answer (same body, 202, plus the
  header ``Idempotent-Replayed: true``) and writes nothing; one sent while the first is still
  in flight is answered once the first is committed.
* The same key with a different body is a 422 (IdempotencyKeyReusedError), as in the IETF
  Idempotency-Key draft: a key names one request.
* Two server processes committing the same key at once: Delta's conflict check rejects the
  second commit (same app id in a concurrent commit); that one re-reads the log and answers
  with the first commit's answer.
* The answer can be found as long as the commit file is in the log (``delta.logRetentionDuration``,
  30 days by default); an older key is still known to be committed, and is answered with 422
  saying so. Keys stay in the table state; ``delta.setTransactionRetentionDuration`` expires them.

Every group commit also records one transaction of its own, ``ingest:server:<uuid>`` (one id per
process, one entry in the table state), so after an error whose outcome is unknown (the commit
may have landed before the error) the committer can tell from the log whether it landed, and
never commits the same events twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic_core import from_json

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.storage import Appender, CommitConflictError
from serving.api.errors import (
    BadRequestError,
    IdempotencyKeyReusedError,
    PayloadTooLargeError,
    UnavailableError,
    UnprocessableError,
    UnsupportedMediaTypeError,
)
from shared_logic.errors import EventProblem, EventValidationError

if TYPE_CHECKING:
    from starlette.requests import Request

    from serving.api.config import ApiConfig
    from shared_logic.events import EventSchema
    from shared_logic.pipeline import Pipeline

log = logging.getLogger(__name__)

#: Content types read as JSON (one event object, or an array of event objects).
JSON_TYPES = ("application/json",)
#: Content types read as NDJSON / JSON Lines (one event object per line; blank lines skipped).
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl")
#: Longest Idempotency-Key accepted (as in Stripe's API).
MAX_KEY_LENGTH = 255
#: What an Idempotency-Key may hold: printable ASCII (space to tilde).
IDEMPOTENCY_KEY_PATTERN = r"^[ -~]+$"
#: Bodies larger than this are parsed and validated in a worker thread (keeps the loop answering).
INLINE_PARSE_BYTES = 1 << 20
#: Most Arrow bytes gathered into one commit; the rest waits for the next commit.
MAX_COMMIT_BYTES = 256 << 20
#: Commits retried after losing a race on an application transaction id.
MAX_CONFLICT_RETRIES = 5
#: Custom commit metadata holding each idempotency key's first answer.
KEYS_METADATA = "lambda.ingest.keys"
SOURCE = "the request body"

#: Deepest nesting of JSON arrays and objects read from a body (400 beyond). Events are flat, so a
#: valid body nests two levels: an array of event objects.
MAX_NESTING = 32

_JSON_WS = b" \t\n\r"
#: How pydantic-core's JSON parser says a document nests deeper than it reads (about 200 levels).
_PARSER_TOO_DEEP = "recursion limit exceeded"
_LINE = re.compile(r"line (\d+)")
_KEY_CHARACTERS = re.compile(IDEMPOTENCY_KEY_PATTERN)


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


# --------------------------------------------------------------------------------------------
# idempotency keys and answers


@dataclass(frozen=True)
class IdempotencyKey:
    """A request's Idempotency-Key as a Delta application transaction id, with its body's hash."""

    app_id: str
    body_sha256: str

    @classmethod
    def of(cls, key: str, fmt: str, body: bytes) -> IdempotencyKey:
        if not 1 <= len(key) <= MAX_KEY_LENGTH or not _KEY_CHARACTERS.fullmatch(key):
            raise BadRequestError(f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable ASCII characters")
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
        body_hash = hashlib.sha256(fmt.encode() + b"\0" + body).hexdigest()
        return cls(f"ingest:{digest}", body_hash)


@dataclass(frozen=True)
class IngestReceipt:
    """The answer to an ingest request: how many events, at which master version."""

    accepted: int
    version: int
    #: True when this is a retry answered with the first answer (nothing written).
    replayed: bool = False

    def json(self) -> bytes:
        return b'{"accepted":%d,"version":%d}' % (self.accepted, self.version)


# --------------------------------------------------------------------------------------------
# group commit


@dataclass
class _Pending:
    events: pa.Table
    key: IdempotencyKey | None
    future: asyncio.Future[IngestReceipt]
    enqueued: float
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.events.get_total_buffer_size()


_STOP = object()


class Ingestor:
    """Appends validated requests to the master dataset, several requests per Delta commit.

    One committer task per process (started with the first request) gathers the queued
    requests and commits them with :meth:`_commit_sync` in a worker thread, one commit at a time;
    the Delta table handle lives in that thread's hands only.
    """

    def __init__(self, master: MasterDataset, *, group_commit_ms: float) -> None:
        self.master = master
        self.window = group_commit_ms / 1000
        self.server_txn = f"ingest:server:{uuid.uuid4().hex}"
        self.commits = 0  # commits made (for tests and metrics)
        self._appender: Appender | None = None
        self._queue: asyncio.Queue[_Pending | object] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def for_app(cls, settings: ApiConfig, pipeline: Pipeline) -> Ingestor:
        master = MasterDataset.open(settings, pipeline)
        return cls(master, group_commit_ms=settings.ingest_group_commit_ms)

    async def ingest(self, events: pa.Table, key: IdempotencyKey | None = None) -> IngestReceipt:
        """Queue validated ``events`` for the next group commit and wait for its answer.

        Retries racing their first attempt need no lock here: the committer is the only writer
        of this process and commits one group at a time, so a retry is either in the same group
        as its first attempt (the first commits, the retry replays it) or in a later one (the
        key's transaction is in the table state by then). A request whose client went away is
        still committed if it was queued; its retry gets its answer.
        """
        if self._closed:
            raise UnavailableError("the server is shutting down: nothing was written; retry the request")
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="ingest-group-commit")
        future: asyncio.Future[IngestReceipt] = loop.create_future()
        self._queue.put_nowait(_Pending(events, key, future, loop.time()))
        return await future

    async def close(self) -> None:
        """Commit what is queued, then stop the committer."""
        self._closed = True
        if self._task is not None:
            self._queue.put_nowait(_STOP)
            await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        stop, free_since = False, 0.0
        while not stop:
            first = await self._queue.get()
            if first is _STOP:
                break
            assert isinstance(first, _Pending)
            # Gather for the window, counted from when the request came or the last commit ended,
            # whichever is later: the clients answered by that commit send their next requests
            # meanwhile, so under load each commit takes everyone in flight (not every other half).
            delay = max(first.enqueued, free_since) + self.window - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            batch, size = [first], first.nbytes
            while size < MAX_COMMIT_BYTES:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                if item is _STOP:
                    stop = True
                    break
                assert isinstance(item, _Pending)
                batch.append(item)
                size += item.nbytes
            await self._commit(batch)
            free_since = loop.time()

    async def _commit(self, batch: list[_Pending]) -> None:
        try:
            outcomes = await asyncio.to_thread(self._commit_sync, batch)
        except Exception as e:
            log.exception("ingest commit failed")
            outcomes = [_unavailable(e)] * len(batch)
        except BaseException:  # cancelled (event loop closing): still answer every waiting request
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(UnavailableError("the server stopped before the commit finished"))
            raise
        for pending, outcome in zip(batch, outcomes):
            if pending.future.done():
                continue
            if isinstance(outcome, BaseException):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)

    # -- in the worker thread ------------------------------------------------------------------

    def _commit_sync(self, batch: list[_Pending]) -> list[IngestReceipt | Exception]:
        """Commit ``batch`` (as one commit if it can); one outcome per request, in order."""
        if self._appender is None:
            self._appender = self.master.appender()
        appender = self._appender
        outcomes: list[IngestReceipt | Exception | None] = [None] * len(batch)
        group: list[int] = []
        repeats: list[int] = []
        seen: set[str] = set()
        for i, pending in enumerate(batch):
            if pending.key is not None and pending.key.app_id in seen:
                repeats.append(i)  # same key twice in one group: the first commits, the others replay it
                continue
            if pending.key is not None:
                seen.add(pending.key.app_id)
            group.append(i)
        self._commit_group(appender, batch, group, outcomes, isolate=True)
        for i in repeats:
            outcomes[i] = self._replay(appender, batch[i])
        answered = [o for o in outcomes if o is not None]
        assert len(answered) == len(batch), "every request of the group has an outcome"
        return answered

    def _commit_group(self, appender: Appender, batch: list[_Pending], indices: list[int],
                      outcomes: list[IngestReceipt | Exception | None], *, isolate: bool) -> None:
        for _ in range(MAX_CONFLICT_RETRIES):
            todo = []
            for i in indices:
                key = batch[i].key
                if key is not None and appender.transaction_version(key.app_id) is not None:
                    outcomes[i] = self._replay(appender, batch[i])
                else:
                    todo.append(i)
            if not todo:
                return
            expected = appender.version() + 1  # lower bound of the version the commit lands at
            try:
                version = self._append(appender, [batch[i] for i in todo], expected)
            except CommitConflictError:
                appender.refresh()  # another process committed one of these keys: replay those
                indices = todo
                continue
            except Exception as e:
                landed = self._landed(appender, expected)
                if landed is None:
                    log.exception("ingest commit of %d request(s) failed", len(todo))
                    if isolate and len(todo) > 1:  # nothing landed: try each alone so one cannot fail all
                        for i in todo:
                            self._commit_group(appender, batch, [i], outcomes, isolate=False)
                    else:
                        for i in todo:
                            outcomes[i] = _unavailable(e)
                    return
                version = landed
            self.commits += 1
            for i in todo:
                outcomes[i] = IngestReceipt(batch[i].events.num_rows, version)
            return
        for i in indices:
            outcomes[i] = UnavailableError(
                "the commit kept losing races to other writers of the same Idempotency-Key; retry the request"
            )

    def _append(self, appender: Appender, items: list[_Pending], expected: int) -> int:
        tables = [p.events for p in items]
        events = tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()
        txns = [(self.server_txn, expected)]
        keys = {}
        for p in items:
            if p.key is not None:
                txns.append((p.key.app_id, expected))
                keys[p.key.app_id] = {"accepted": p.events.num_rows, "body_sha256": p.key.body_sha256}
        metadata = {"lambda.source": "http", "lambda.requests": str(len(items))}
        if keys:
            metadata[KEYS_METADATA] = json.dumps(keys, separators=(",", ":"))
        return appender.append(events, app_transactions=txns, metadata=metadata)

    def _landed(self, appender: Appender, expected: int) -> int | None:
        """After a failed commit: its version if it landed all the same (found by the server txn)."""
        try:
            appender.refresh()
            if appender.transaction_version(self.server_txn) != expected:
                return None
            found = appender.find_transaction(self.server_txn)
        except Exception:
            log.exception("cannot read the master dataset's log after a failed commit")
            return None
        return found.version if found is not None else None

    def _replay(self, appender: Appender, pending: _Pending) -> IngestReceipt | Exception:
        """The first answer for ``pending``'s key, read back from the commit that recorded it."""
        key = pending.key
        assert key is not None
        found = appender.find_transaction(key.app_id)
        if found is None:
            return UnavailableError("the first request with this Idempotency-Key was not committed; retry the request")
        version, record = found.version, None
        if version is not None:
            raw = found.commit_info.get(KEYS_METADATA)
            keys = json.loads(raw) if isinstance(raw, str) else raw
            record = keys.get(key.app_id) if isinstance(keys, dict) else None
        if version is None or record is None:  # (record is None whenever version is)
            return UnprocessableError(
                "this Idempotency-Key was used for events committed long ago (its commit is no longer in the "
                "master dataset's log, so its answer cannot be repeated); nothing was written: use a new key"
            )
        if record["body_sha256"] != key.body_sha256:
            return IdempotencyKeyReusedError(
                f"this Idempotency-Key was first used with a different request body (committed at master version "
                f"{version}); nothing was written: use a new key for new events"
            )
        return IngestReceipt(int(record["accepted"]), version, replayed=True)


def _unavailable(error: Exception) -> UnavailableError:
    return UnavailableError(
        f"the events could not be committed to the master dataset ({error}); nothing was acknowledged: "
        "retry the request (with an Idempotency-Key a retry can never write twice)"
    )
