"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request

from serving.api.deps import StoreDep
from serving.api.errors import UnavailableError
from serving.api.models import Health, error_responses

router = APIRouter(tags=["health"])



@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=error_responses(503), summary="Readiness: answers can be served")
async def readyz(request: Request, store: StoreDep) -> Health:
    """200 when Redis answers and a batch generation is published (answers are exact as of
    ``version``), 503 with the reason otherwise. The detail tells the speed layer's heartbeat,
    processed version and lag; a stopped speed layer leaves answers exact, only older."""
    await store.ping()
    served = await store.generation()
    if served is None:
        raise UnavailableError("no batch generation is published yet: run `lambda-platform batch run`")
    speed = await store.speed_status()
    fresh = await request.app.state.master_clock.freshness(speed.processed, served.generation)
    beat = speed.seconds_ago()
    speed_state = "speed layer never ran" if beat is None else (
        f"speed layer {'up' if speed.alive() else 'DOWN'} (heartbeat {beat:.0f}s ago)")
    return Health(
        status="ready",
        detail=f"serving generation {served.generation}, exact as of version {served.version}; {speed_state}; "
               f"lag {fresh.lag_versions} versions, {fresh.lag_seconds or 0:.1f}s",
    )
