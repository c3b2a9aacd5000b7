"""Helpers for the speed-layer tests: run the speed layer, wait until it caught up, check exactness."""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import httpx
import redis

from batch_layer.master.delta_log import LogHead
from deploy.settings import Settings
from serving.store.connection import redis_client
from serving.store.keys import Keys
from shared_logic import load_pipeline
from tests import oracle
from tests.support import web


@contextmanager
def running_speed_layer(spark, settings: Settings, pipeline: Any = None) -> Iterator[threading.Thread]:
    """The speed layer running in a thread of this process (the session's SparkSession), for ``pipeline``
    (default: the settings' one)."""
    from speed_layer.runner import run_speed_layer

    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_speed_layer(spark, settings, pipeline or load_pipeline(settings.pipeline), redis_url=settings.redis_url,
                            stop=stop)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, name="speed-layer", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(120)
        if errors:  # also when the test failed meanwhile: the speed layer's death is then the cause to show
            raise errors[0]


def processed_version(settings: Settings) -> int | None:
    """The version the speed layer committed last (keys are named by the pipeline's name, not its module path)."""
    speed = Keys(load_pipeline(settings.pipeline).name).speed
    value = _client(settings.redis_url).hget(speed, "processed")
    return None if value is None else int(value)


@functools.lru_cache(maxsize=16)
def _client(url: str) -> redis.Redis:
    """One client per Redis URL for the polls above (a client per poll connected anew each time)."""
    return redis_client(url)


def wait_caught_up(settings: Settings, timeout: float = 240, *, speed: threading.Thread | None = None) -> int:
    """Block until the speed layer has processed the master dataset's newest version; return it.
    ``speed``: the speed layer's thread; its death ends the wait at once."""
    deadline, head = time.monotonic() + timeout, LogHead(str(settings.master_path))
    while True:
        assert speed is None or speed.is_alive(), "the speed layer died (its error follows)"
        latest = head.version()
        processed = processed_version(settings)
        if processed is not None and latest is not None and processed >= latest:
            return latest
        if time.monotonic() > deadline:
            raise AssertionError(f"speed layer did not catch up: processed {processed}, latest {latest}")
        time.sleep(0.2)


def _close(got: Any, want: Any, measure: str) -> bool:
    if measure.startswith("distinct_"):
        return abs(got - want) <= max(1, 0.03 * want)
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    return got == want


def assert_exact(base_url: str, settings: Settings, version: int, *, named: bool = False, routes: str = "/v1") -> int:
    """Every key of every view (and top-N) answered over HTTP (under ``routes``) equals the oracle at ``version``.

    Answers must name ``version`` or a later one, or exactly ``version`` when ``named``.
    Returns how many answers were compared.
    """
    events = oracle.read_events(settings.master_path, version)
    expected = oracle.views(settings.pipeline, events)
    compared = 0
    with web.client(base_url=base_url, timeout=30) as http:
        for view, rows in expected.items():
            for (key, window_start), measures in rows.items():
                params = {"window_start": window_start} if window_start is not None else {}
                response = http.get(f"{routes}/views/{view}/keys/{quote(key, safe='')}", params=params)
                assert response.status_code == 200, (view, key, window_start, response.text)
                body = response.json()
                assert body["version"] == version if named else body["version"] >= version, body
                for measure, want in measures.items():
                    got = body["value"][measure]
                    assert _close(got, want, measure), (view, key, window_start, measure, got, want, body)
                compared += 1
            _assert_top(http, f"{routes}/views/{view}", rows, version if named else None)
    return compared


def _assert_top(http: httpx.Client, view: str, rows: dict, version: int | None) -> None:
    """``view``: the view's route (``/v1/views/NAME``)."""
    all_time = {key: m for (key, ws), m in rows.items() if ws is None}
    if not all_time:
        window = min(ws for _, ws in rows)
        all_time = {key: m for (key, ws), m in rows.items() if ws == window}
        params: dict[str, Any] = {"window_start": window}
    else:
        params = {}
    for measure in ("count", "sum_amount", "max_amount"):
        if measure not in next(iter(all_time.values())):
            continue
        want = sorted(all_time.items(), key=lambda kv: (-kv[1][measure], kv[0]))[:5]
        body = http.get(f"{view}/top", params={**params, "n": 5, "measure": measure}).json()
        assert version is None or body["version"] == version, body
        assert [e["key"] for e in body["top"]] == [k for k, _ in want], (view, measure, body, want)
        for entry, (_, m) in zip(body["top"], want):
            assert _close(entry["value"], m[measure], measure)


def answer_matches(body: dict, expected: dict) -> bool:
    """An answer's measures (``body["value"]``) equal the oracle's ``expected`` measures of its row."""
    return all(_close(body["value"][measure], want, measure) for measure, want in expected.items())


class VersionedReader:
    """A thread asking the API for keys while other things happen; each answer is checked afterwards
    against the oracle at the version it names, and the versions one reader sees never go back."""

    def __init__(self, base_url: str, settings: Settings, items: list[tuple[str, str, int | None]]) -> None:
        self.base_url, self.settings, self.items = base_url, settings, items
        self.answers: list[tuple[str, str, int | None, dict]] = []
        self.unavailable = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="versioned-reader", daemon=True)

    def __enter__(self) -> VersionedReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        with web.client(base_url=self.base_url, timeout=30) as http:
            while not self._stop.is_set():
                for view, key, window_start in self.items:
                    params = {} if window_start is None else {
                        "window_start": datetime.fromtimestamp(window_start, tz=timezone.utc).isoformat()}
                    response = http.get(f"/v1/views/{view}/keys/{quote(key, safe='')}", params=params)
                    if response.status_code == 503:
                        self.unavailable += 1
                    elif response.status_code == 200:
                        self.answers.append((view, key, window_start, response.json()))
                    self._stop.wait(0.005)  # paced: a busy loop here takes the interpreter from the speed layer

    def check(self) -> int:
        """Assert every answer against the oracle at its version; returns how many were checked."""
        versions = [body["version"] for *_, body in self.answers]
        assert versions == sorted(versions), "an answer named an older version than one before it"
        oracles: dict[int, dict] = {}
        for view, key, window_start, body in self.answers:
            version = body["version"]
            if version not in oracles:
                oracles[version] = oracle.views(self.settings.pipeline, oracle.read_events(self.settings.master_path, version))
            want = oracles[version][view].get((key, window_start))
            assert want is not None and answer_matches(body, want), (view, key, window_start, body, want)
        return len(self.answers)
