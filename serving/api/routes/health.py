"""Liveness and readiness probes.

Readiness tells the truth about every pipeline the deployment serves (``/readyz``): 200 ``ready``
only when, for each one, Redis answers, a batch generation is published, and the speed layer is
not failing and has done its job at least once (applied a micro-batch, or had nothing to apply:
answers already cover the master's newest version). A failing speed layer (it failed since its
last success: restarting, or given up) answers 503 with its last error and how many times it
failed; so does one that has not applied a micro-batch while answers lag the master. A stopped
speed layer that had not failed leaves answers exact, only older: still ready, the detail says
DOWN. ``serving_only=true`` asks only whether answers can be served (Redis, a generation): for a
load balancer's probe, which should not take every replica out of service because the speed
layer fails.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter, FastAPI, Query, Request

from serving.api.deps import StoreDep
from serving.api.errors import UnavailableError
from serving.api.models import Health, error_responses
from serving.store.heartbeat import SpeedHeartbeat

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=error_responses(422, 503),
            summary="Readiness: every part has done its job and none is failing")
async def readyz(
    request: Request, store: StoreDep,
    serving_only: bool = Query(False, description="true: ready when answers can be served (Redis answers, a "
                                                  "generation is published), whatever the speed layer's state"),
) -> Health:
    """200 when, for every pipeline, Redis answers, a batch generation is published (answers are exact
    as of ``version``) and the speed layer is not failing and has applied a micro-batch (or had none
    to apply); 503 with the reason otherwise (``speed layer failing: <error> (failed N times since its
    last success)``, ``speed layer has not applied a micro-batch yet``). The detail tells each speed
    layer's heartbeat, processed version and lag."""
    await store.ping()
    apps: Mapping[str, FastAPI] = getattr(request.app.state, "pipeline_apps", None) or {"": request.app}
    details, problems = [], []
    for name, app in apps.items():
        detail, problem = await _pipeline_readiness(app, serving_only)
        prefix = f"pipeline {name}: " if len(apps) > 1 else ""
        details.append(prefix + detail)
        if problem is not None:
            problems.append(prefix + problem)
    if problems:
        raise UnavailableError("; ".join(problems))
    return Health(status="ready", detail=" | ".join(details))


async def _pipeline_readiness(app: FastAPI, serving_only: bool) -> tuple[str, str | None]:
    """(what to say of this pipeline, why it is not ready or None)."""
    store = app.state.store
    served = await store.generation()
    if served is None:
        problem = "no batch generation is published yet: run `lambda-platform batch run`"
        return problem, problem
    speed = await store.speed_status()
    fresh = await app.state.master_clock.freshness(speed.processed, served.generation)
    lag = fresh.lag_versions or 0
    detail = (f"serving generation {served.generation}, exact as of version {served.version}; {_speed_state(speed)}; "
              f"lag {fresh.lag_versions} versions, {fresh.lag_seconds or 0:.1f}s")
    if serving_only:
        return detail, None
    if speed.failing:
        return detail, f"speed layer failing: {speed.failure()}; answers lag the master by {lag} versions"
    if not speed.applied and lag > 0:
        return detail, (f"speed layer has not applied a micro-batch yet ({_speed_state(speed)}); answers lag the "
                        f"master by {lag} versions")
    return detail, None


def _speed_state(speed: SpeedHeartbeat) -> str:
    beat = speed.seconds_ago()
    if beat is None:
        return "speed layer never ran"
    return f"speed layer {'up' if speed.alive() else 'DOWN'} (heartbeat {beat:.0f}s ago)"
