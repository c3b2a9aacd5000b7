"""The group committer: validated ingest requests appended to the master dataset, many per Delta commit.

Validated requests wait in a queue; one committer task gathers requests for
``Settings.ingest_group_commit_ms`` (counted from the oldest waiting request's arrival, or from
the end of the previous commit if that is later) and appends all of them to the master dataset in
ONE Delta commit, off the event loop (a worker thread). Every request of the group is answered
with that commit's version: ``{"accepted": n, "version": v}``. A delta-rs commit costs 10-20 ms of
CPU here whatever its size, and commits to one table are serial anyway, so sharing them is what
lets many small requests through: under load one commit takes every request in flight.

Every group commit also records one transaction of its own, ``ingest:server:<uuid>`` (one id per
process, one entry in the table state), so after an error whose outcome is unknown (the commit
may have landed before the error) the committer can tell from the log whether it landed, and
never commits the same events twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.storage import Appender, CommitConflictError
from serving.api.errors import UnavailableError
from serving.api.idempotency import KEYS_METADATA, IdempotencyKey, IngestReceipt, first_answer

if TYPE_CHECKING:
    from serving.api.config import ApiConfig
    from shared_logic.pipeline import Pipeline

log = logging.getLogger(__name__)

#: Most Arrow bytes gathered into one commit; the rest waits for the next commit.
MAX_COMMIT_BYTES = 256 << 20
#: Commits retried after losing a race on an application transaction id.
MAX_CONFLICT_RETRIES = 5


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
        assert pending.key is not None
        return first_answer(appender, pending.key)

def _unavailable(error: Exception) -> UnavailableError:
    return UnavailableError(
        f"the events could not be committed to the master dataset ({error}); nothing was acknowledged: "
        "retry the request (with an Idempotency-Key a retry can never write twice)"
    )
