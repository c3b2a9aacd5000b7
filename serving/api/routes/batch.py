"""Batch runs over HTTP: ask for a recompute, follow it, list recent ones.

The API process never runs Spark: ``POST /v1/batch/runs`` records a *queued* run in Redis (the
registry of ``serving.store.runs``), and a scheduler process (``lambda-platform batch schedule``) picks it
up within half a second. One run at a time: while one is queued or running, a new request
answers 409 naming it.

Scopes: starting a run needs ``admin``; reading runs (the list, one run) needs ``read``, which is
open on a loopback address like every read (``serving.api.auth``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal, overload

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from serving.api.auth import require
from serving.api.errors import ConflictError, NotFoundError
from serving.api.models import error_responses
from serving.api.pipelines import public_path
from serving.store.runs import BatchRun, RunConflictError, RunRegistry, SchedulerInfo
from shared_logic.event_values import echo

router = APIRouter(prefix="/v1/batch", tags=["batch"])
#: Longest run id ``GET /v1/batch/runs/{run_id}`` takes (ids are 12 hexadecimal digits; 422 above).
MAX_RUN_ID_CHARS = 64

class RunRequest(BaseModel):
    """What to run (the body is optional). Strict: ``force`` is a JSON boolean, unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")

    force: StrictBool = Field(
        False,
        description="Recompute even when the master dataset has not changed since the served generation "
                    "(after a change of the pipeline's logic, say). Without it such a run is recorded as skipped.",
    )


class StageInfo(BaseModel):
    """One stage of a batch run, in the order it ran."""

    name: Literal["barrier", "snapshot", "dedup", "gold", "publish", "flip"] = Field(
        description="barrier: the master version the run covers; snapshot: the events at it; dedup (a pipeline "
                    "declaring an event id): the duplicates left out; gold: the shared "
                    "transform and one view's aggregation, committed as its gold table; publish: that view's rows "
                    "loaded into Redis beside what is served; flip: the served generation switched (atomically)."
    )
    view: str | None = Field(default=None, description="The view of a gold or publish stage.")
    started_at: datetime = Field(description="When the stage started (UTC).")
    seconds: float | None = Field(default=None, description="How long it took; null while it runs.")
    count: int | None = Field(default=None, description="What it counted, in `unit` (null while it runs).")
    unit: str = Field(description="What `count` counts: master version, events, duplicates, rows, generation.")


class BatchRunInfo(BaseModel):
    """One batch run: what asked for it, where it is, what it produced."""

    id: str = Field(description="Run id (GET /v1/batch/runs/{id}).")
    pipeline: str = Field(description="Pipeline recomputed.")
    status: Literal["queued", "running", "succeeded", "failed", "skipped"] = Field(
        description="queued: waiting for a scheduler; running; succeeded: a generation was computed; failed (see "
                    "`error`; 'interrupted: ...' when its scheduler died); skipped: nothing to recompute (see "
                    "`skip_reason`)."
    )
    trigger: Literal["api", "schedule", "cli"] = Field(
        description="What asked for it: this API, the schedule, or the command line."
    )
    force: bool = Field(description="Recompute even if the master dataset had not changed.")
    requested_at: datetime = Field(description="When it was asked for (UTC).")
    started_at: datetime | None = Field(default=None, description="When a scheduler started it (UTC).")
    finished_at: datetime | None = Field(
        None, description="When it ended (UTC); for an interrupted run, its scheduler's last heartbeat."
    )
    duration_seconds: float | None = Field(
        None, description="Seconds from start to end (so far, while running)."
    )
    master_version: int | None = Field(
        None, description="Latest master-dataset version when the run started, before its barrier."
    )
    served_before: int | None = Field(default=None, description="Generation served when the run started.")
    generation: int | None = Field(
        None,
        description="The generation: for a succeeded run, the master version of its barrier, which it recomputed "
                    "through; for a skipped run, the generation still served.",
    )
    served: bool | None = Field(
        None, description="Succeeded runs: whether its generation was flipped to (false: a newer one already was)."
    )
    events: int | None = Field(default=None, description="Events recomputed (master rows through the generation).")
    rows: dict[str, int] = Field(default_factory=dict, description="Rows written per view (gold table and Redis).")
    stages: list[StageInfo] = Field(
        default_factory=list,
        description="The stages so far, in order. While running, the last one is in progress (`seconds` null); "
                    "in a failed run, a stage without `seconds` is where it failed.",
    )
    recompute_id: str | None = Field(
        None, description="Id the recompute wrote into its barrier commit and the generation's metadata."
    )
    owner: str | None = Field(default=None, description="Scheduler process that ran it (host:pid:instance).")
    heartbeat_at: datetime | None = Field(default=None, description="Last heartbeat of its scheduler while running (UTC).")
    skip_reason: str | None = Field(default=None, description="Why it was skipped.")
    error: str | None = Field(default=None, description="Why it failed.")


class SchedulerStatus(BaseModel):
    """A scheduler process that is alive (it announced itself within the last seconds)."""

    owner: str = Field(description="host:pid:instance of the scheduler.")
    schedule: str | None = Field(default=None, description="Its schedule (interval or cron, UTC); null: on-demand runs only.")
    started_at: datetime = Field(description="When it started (UTC).")
    seen_at: datetime = Field(description="When it last announced itself (UTC).")
    next_run_at: datetime | None = Field(default=None, description="Its next scheduled tick (UTC).")
    upkeep: str | None = Field(default=None, description="Its last upkeep of the master dataset (compaction, log "
                                                         "trim), or what failed; null before the first one.")


class BatchRunList(BaseModel):
    """Recent batch runs, newest first, and who runs them."""

    pipeline: str = Field(description="Pipeline the runs recompute.")
    active: str | None = Field(default=None, description="Id of the run queued or running now, if any.")
    schedulers: list[SchedulerStatus] = Field(
        description="Scheduler processes alive. Empty: queued runs wait until one starts (`lambda-platform batch schedule`)."
    )
    runs: list[BatchRunInfo] = Field(description="Runs, newest first.")




@overload
def _time(value: float) -> datetime: ...
@overload
def _time(value: float | None) -> datetime | None: ...
def _time(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=timezone.utc)


def _info(pipeline: str, run: BatchRun) -> BatchRunInfo:
    return BatchRunInfo(
        id=run.id, pipeline=pipeline, status=run.status, trigger=run.trigger, force=run.force,
        requested_at=_time(run.requested_at), started_at=_time(run.started_at), finished_at=_time(run.finished_at),
        duration_seconds=None if run.duration is None else round(run.duration, 3),
        master_version=run.master_version, served_before=run.served_before, generation=run.generation,
        served=run.flipped, events=run.events, rows=run.rows,
        stages=[StageInfo.model_validate({**stage, "started_at": _time(float(stage["started_at"] or 0))})
                for stage in run.stages],
        recompute_id=run.recompute_id, owner=run.owner,
        heartbeat_at=_time(run.heartbeat_at), skip_reason=run.skip_reason, error=run.error,
    )


def _scheduler(info: SchedulerInfo) -> SchedulerStatus:
    return SchedulerStatus(
        owner=info.owner, schedule=info.schedule, started_at=_time(info.started_at), seen_at=_time(info.seen_at),
        next_run_at=_time(info.next_run_at), upkeep=info.upkeep,
    )


def get_runs(request: Request) -> RunRegistry:
    """The app's run registry (``create_app`` makes one per pipeline's app)."""
    runs: RunRegistry = request.app.state.batch_runs
    return runs


RunsDep = Annotated[RunRegistry, Depends(get_runs)]


@router.post(
    "/runs", status_code=202, response_model=BatchRunInfo, summary="Start a batch recompute now",
    dependencies=[Depends(require("admin"))], responses=error_responses(400, 409, 422, 503),
)
def start_run(
    request: Request, response: Response, runs: RunsDep,
    body: Annotated[RunRequest | None, Body(description="Optional: `{\"force\": true}`.")] = None,
) -> BatchRunInfo:
    """Queue a recompute of every view; a scheduler process picks it up within a second. Answers 202
    with the queued run (follow it at `Location`), or 409 when a run is already queued or running
    (`Location` then names that run).
    A run finds nothing to do (and is recorded as skipped) when the master dataset has not changed
    since the served generation, unless `force` is true."""
    force = bool(body and body.force)
    try:
        run = runs.enqueue(trigger="api", force=force)
    except RunConflictError as e:
        location = public_path(request, f"{router.prefix}/runs/{e.active.id}")
        raise ConflictError(f"{e} (follow it at {location})", headers={"Location": location}) from e
    response.headers["Location"] = public_path(request, f"{router.prefix}/runs/{run.id}")
    return _info(runs.pipeline, run)


@router.get(
    "/runs", response_model=BatchRunList, summary="Recent batch runs, newest first",
    dependencies=[Depends(require("read"))], responses=error_responses(422, 503),
)
def list_runs(
    runs: RunsDep,
    limit: Annotated[int, Query(ge=1, le=500, description="How many runs, newest first.")] = 20,
) -> BatchRunList:
    """Recent runs (scheduled, asked for over HTTP or from the command line), the run in progress and
    the scheduler processes alive. A run whose scheduler died shows as failed ('interrupted')."""
    active, recent = runs.recent(limit=limit)
    schedulers = runs.schedulers()
    return BatchRunList(
        pipeline=runs.pipeline, active=active, schedulers=[_scheduler(s) for s in schedulers],
        runs=[_info(runs.pipeline, r) for r in recent],
    )


@router.get(
    "/runs/{run_id}", response_model=BatchRunInfo, summary="One batch run",
    dependencies=[Depends(require("read"))], responses=error_responses(404, 422, 503),
)
def get_run(runs: RunsDep, run_id: Annotated[str, Path(max_length=MAX_RUN_ID_CHARS,
                                                        description="Run id, as POST /v1/batch/runs answered.")]) -> BatchRunInfo:
    """The run's status, versions, rows per view, duration and error."""
    run = runs.get(run_id)
    if run is None:
        raise NotFoundError(
            f"no batch run {echo(run_id)} of pipeline {runs.pipeline!r} (the registry keeps the latest "
            f"{runs.keep}); GET /v1/batch/runs lists them"
        )
    return _info(runs.pipeline, run)
