"""Dead letters over HTTP: ``GET /v1/dead-letters``, the records a path refused, a page at a time.

A dead letter is a record an ingest path refused and kept, instead of stopping on it: a bad line
of a file ingested with ``--dead-letters``, a Kafka record that is not an event of the model
(``batch_layer.master.dead_letters``). Each pipeline has its own table; the route answers for the
default pipeline and, like every route, for each one at ``/v1/pipelines/{pipeline}/dead-letters``.

Scope ``read`` (reading what was refused is reading; open on a loopback address like every read).
Replaying letters is a command-line action (``lambda-platform dead-letters replay``), not a route.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from batch_layer.errors import BatchLayerError
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letter_replay import replayed_ids
from batch_layer.master.dead_letters import DeadLetters
from serving.api.auth import require
from serving.api.errors import NotFoundError, UnavailableError
from serving.api.models import error_responses

router = APIRouter(prefix="/v1/dead-letters", tags=["dead letters"])

#: Most letters one page answers (422 above).
MAX_LIMIT = 1000
#: Longest ``reason`` filter (422 above).
MAX_REASON_CHARS = 200
#: Largest ``offset`` (422 above): far beyond any table's letters.
MAX_OFFSET = 1_000_000_000

Source = Literal["kafka", "file", "backfill", "transform"]


class DeadLetterInfo(BaseModel):
    """One refused record: what it was, where it came from, why it was refused."""

    id: str = Field(description="The letter's id (`lambda-platform dead-letters replay --id ID`): the same record "
                                "refused at the same place has the same id.")
    raw: str = Field(description="The record as received (a JSON line, a CSV record under its header line, a Kafka "
                                 "value, a Parquet row as a JSON object); bytes that are not UTF-8 as `\\x..`.")
    source: Source = Field(description="Where it came from: kafka, file (one file ingested), backfill (several "
                                       "files or folders) or transform.")
    topic: str | None = Field(default=None, description="Kafka: its topic.")
    partition: int | None = Field(default=None, description="Kafka: its partition.")
    offset: int | None = Field(default=None, description="Kafka: its offset.")
    file: str | None = Field(default=None, description="Files: the file (absolute path).")
    line: int | None = Field(default=None, description="Files: its line (CSV: the record's first, the header being "
                                                       "line 1; Parquet: its row), from 1.")
    field: str | None = Field(default=None, description="The first field at fault ('(event)': the record as a whole).")
    reason: str = Field(description="Every problem, in words.")
    dead_at: datetime = Field(description="When it was refused (UTC).")
    record_time: datetime | None = Field(default=None, description="Kafka: the record's own timestamp (UTC; none "
                                         "when it has none), the event time a replay gives an event without one.")
    replayed: bool = Field(description="Whether `dead-letters replay` appended it to the master dataset already.")


class DeadLetterList(BaseModel):
    """A page of a pipeline's dead letters and how many match in all."""

    pipeline: str
    total: int = Field(description="Letters matching the filters, in all.")
    offset: int = Field(description="Letters skipped before this page.")
    limit: int = Field(description="Most letters this page holds.")
    order: Literal["oldest", "newest"] = Field(description="oldest: oldest first; newest: newest first.")
    letters: list[DeadLetterInfo]


def _letters(request: Request) -> DeadLetters:
    letters: DeadLetters | None = getattr(request.app.state, "dead_letters", None)
    if letters is None:
        raise NotFoundError(f"pipeline {request.app.state.pipeline.name} keeps no dead letters here: this "
                            "deployment's settings name no dead-letter table")
    return letters


@router.get(
    "", response_model=DeadLetterList, summary="The records ingest refused and kept (dead letters), paged",
    dependencies=[Depends(require("read"))], responses=error_responses(404, 422, 503),
)
def list_dead_letters(
    request: Request,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Letters to skip.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Most letters to answer.")] = 50,
    source: Annotated[Source | None, Query(description="Only letters from this source.")] = None,
    reason: Annotated[str | None, Query(min_length=1, max_length=MAX_REASON_CHARS,
                                        description="Only letters whose reason contains this text (any case).")] = None,
    order: Annotated[Literal["oldest", "newest"], Query(description="oldest first (stable pages while letters "
                                                                    "arrive) or newest first.")] = "oldest",
) -> DeadLetterList:
    """The pipeline's dead letters matching `source` and `reason`, `limit` from `offset`, with where each
    came from (file and line, or Kafka topic, partition and offset), why it was refused, its raw text and
    whether it was replayed into the master dataset already. After fixing the event model or the data,
    `lambda-platform dead-letters replay` appends the letters that are valid now, once each."""
    letters = _letters(request)
    try:
        page = letters.page(source=source, reason=reason, offset=offset, limit=limit, newest_first=order == "newest")
        master = MasterDataset.open(request.app.state.settings, request.app.state.pipeline)
        done = replayed_ids(master, [str(letter["id"]) for letter in page.letters])
    except BatchLayerError as e:
        raise UnavailableError(f"cannot read the dead letters now: {e}") from e
    answered: list[dict[str, Any]] = [{**letter, "replayed": letter["id"] in done} for letter in page.letters]
    return DeadLetterList(pipeline=letters.pipeline, total=page.total, offset=offset, limit=limit, order=order,
                          letters=[DeadLetterInfo.model_validate(letter) for letter in answered])
