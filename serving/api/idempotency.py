"""Idempotent ingest: the ``Idempotency-Key`` header, and the answers a retry repeats.

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
* The answer can be found as long as the commit file is in the log: upkeep trims the log after
  each compaction, keeping at least the newest ``LAMBDA_MASTER_LOG_KEEP_VERSIONS`` commits (and
  every version a served generation or the speed layer still reads). An older key is still known
  to be committed (its transaction is in the checkpoint), so a retry writes nothing and is
  answered with 422 saying so. Keys stay in the table state; ``delta.setTransactionRetentionDuration``
  expires them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serving.api.errors import (
    BadRequestError,
    IdempotencyKeyReusedError,
    UnavailableError,
    UnprocessableError,
)

if TYPE_CHECKING:
    from batch_layer.master.storage import Appender

#: Longest Idempotency-Key accepted (as in Stripe's API).
MAX_KEY_LENGTH = 255
#: What an Idempotency-Key may hold: printable ASCII (space to tilde).
IDEMPOTENCY_KEY_PATTERN = r"^[ -~]+$"
#: Custom commit metadata holding each idempotency key's first answer.
KEYS_METADATA = "lambda.ingest.keys"

_KEY_CHARACTERS = re.compile(IDEMPOTENCY_KEY_PATTERN)


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


def first_answer(appender: Appender, key: IdempotencyKey) -> IngestReceipt | Exception:
    """The first answer for ``key``, read back from the commit that recorded it (``replayed``), or the
    error to answer with: not committed (503), committed too long ago to repeat (422), or first used
    with another body (422)."""
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
