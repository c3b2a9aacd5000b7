"""Demo traffic: sample events of a built-in pipeline, posted to the HTTP API at a steady rate."""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import datetime, timezone

import httpx

from deploy.demo.samples import SAMPLES
from deploy.errors import ConfigError

log = logging.getLogger(__name__)

_TICK = 0.1  # seconds between posts


def generate(pipeline: str, api_url: str, api_key: str | None, rate: float, stop: threading.Event, *,
             routes: str = "/v1") -> int:
    """Post events at ``rate`` per second to ``{routes}/events`` until ``stop``; returns how many were accepted.

    Event times are "now", so windowed views move too. Transient API errors are logged and
    retried on the next tick: demo traffic never gives up.
    """
    make = SAMPLES.get(pipeline)
    if make is None:
        raise ConfigError(f"no demo traffic for pipeline {pipeline!r}: `generate` posts sample events of the "
                          f"built-in pipelines ({', '.join(SAMPLES)}); post your own events to /v1/events")
    rng = random.Random()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    accepted, owed, reported = 0, 0.0, time.monotonic()
    with httpx.Client(base_url=api_url, headers=headers, timeout=10) as http:
        while not stop.is_set():
            owed += rate * _TICK
            count, owed = int(owed), owed - int(owed)
            if count:
                events = list(make(rng, count, datetime.now(timezone.utc)))
                for event in events:
                    event["event_time"] = datetime.now(timezone.utc).isoformat()
                try:
                    response = http.post(f"{routes}/events", json=events)
                    if response.status_code == 202:
                        accepted += response.json().get("accepted", count)
                    else:
                        log.warning("ingest answered %d: %s", response.status_code, response.text[:200])
                except httpx.TransportError as e:
                    log.warning("API not reachable at %s (%s); retrying", api_url, e)
            if time.monotonic() - reported > 10:
                log.info("demo traffic: %d events accepted so far", accepted)
                reported = time.monotonic()
            stop.wait(_TICK)
    return accepted
