"""A pipeline module changed on disk stops the process watching it (the supervisor restarts it on the new code)."""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from deploy.supervision.code_watch import CodeWatch
from tests.support import CLICKS_PIPELINE, wait_for


@pytest.fixture
def module(tmp_path: Path) -> tuple[Path, object]:
    name = f"watched_{os.getpid()}_{tmp_path.name}".replace("-", "_")
    path = tmp_path / f"{name}.py"
    path.write_text(CLICKS_PIPELINE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield path, importlib.import_module(name).pipeline
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_an_edited_module_stops_the_process(module: tuple[Path, object]) -> None:
    path, pipeline = module
    stop = threading.Event()
    watch = CodeWatch([pipeline], stop, poll=0.05).start()  # type: ignore[list-item]
    path.write_text(CLICKS_PIPELINE)  # saved again unchanged (a new mtime): not a change
    time.sleep(0.5)
    assert not stop.is_set() and watch.changed is None
    path.write_text(CLICKS_PIPELINE.replace("class ", "# a fix\nclass ", 1))
    wait_for(stop.is_set, "the watch to stop the process", 10)
    assert watch.changed == path.resolve()


def test_a_stop_for_another_reason_ends_the_watch(module: tuple[Path, object]) -> None:
    _, pipeline = module
    stop = threading.Event()
    watch = CodeWatch([pipeline], stop, poll=0.05).start()  # type: ignore[list-item]
    stop.set()
    watch._thread.join(5)
    assert not watch._thread.is_alive() and watch.changed is None
