"""The command line as installed (the `lambda-platform` console script), from a user's own folder.

* `ingest` finds a pipeline module in the current folder (no PYTHONPATH), and says so once.
* A module with a syntax or import error, or an unknown name: exit 2 and one message naming the
  module, the file and the line; never a traceback.
* `status` on a platform that is down: every part listed as down, exit 1, and the same as JSON.
* `status` against an API serving another pipeline reports that, instead of mixing the two.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from deploy.cli.status import PARTS, platform_status
from tests.support import CLICKS_PIPELINE, cli, free_port


def test_ingest_finds_the_module_in_the_current_folder_and_reports_once(tmp_path: Path) -> None:
    (tmp_path / "clicks.py").write_text(CLICKS_PIPELINE)
    (tmp_path / "clicks.jsonl").write_text('{"page": "/news/a", "ms_on_page": 10}\n{"page": "/sport/b", "ms_on_page": 5}\n')
    done = cli(tmp_path, "ingest", "clicks.jsonl", LAMBDA_PIPELINE="clicks")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert said.count("ingested 2 events") == 1, said


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("clicks", "from shared_logic import Pipeline\ndef broken(:\n    pass\n", ["'clicks'", "clicks.py, line 2", "SyntaxError"]),
        ("clicks", "import os\nimport no_such_dependency_zz\n",
         ["'clicks'", "clicks.py, line 2", "No module named 'no_such_dependency_zz'"]),
        ("clickz", None, ["unknown pipeline 'clickz'", "not a built-in pipeline (payments, wordcount)", "current folder"]),
    ],
)
def test_bad_pipeline_modules_stop_with_exit_2_and_a_message(
    tmp_path: Path, module: str, source: str | None, expected: list[str],
) -> None:
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    (tmp_path / "events.jsonl").write_text("{}\n")
    done = cli(tmp_path, "ingest", "events.jsonl", LAMBDA_PIPELINE=module)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "LAMBDA_PIPELINE" in done.stderr
    for part in expected:
        assert part in done.stderr, done.stderr


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_status_of_a_platform_that_is_down_lists_every_part_and_exits_1(tmp_path: Path) -> None:
    port = str(free_port())
    table = cli(tmp_path, "status", LAMBDA_HTTP_PORT=port)
    assert table.returncode == 1, table.stdout + table.stderr
    for part in PARTS:
        assert part in table.stdout, table.stdout
    assert "not serving" in table.stdout
    as_json = cli(tmp_path, "status", "--json", LAMBDA_HTTP_PORT=port)
    assert as_json.returncode == 1
    status = json.loads(as_json.stdout)
    assert status["serving"] is False and status["pipeline"] == "wordcount"
    assert [p["part"] for p in status["parts"]] == list(PARTS)
    assert all(p["state"] == "down" for p in status["parts"])
    assert not (tmp_path / "data").exists(), "status must not create anything"


def test_status_does_not_mix_pipelines(api: Callable, make_settings: Callable, redis_url: str) -> None:
    with api(pipeline="payments") as server:
        settings = make_settings(pipeline="wordcount", http_port=server.port)
        status = platform_status(settings)
    by_name = {p.name: p for p in status.parts}
    assert [p.name for p in status.parts] == list(PARTS)
    assert not by_name["api"].up and "serves pipeline 'payments', not 'wordcount'" in by_name["api"].detail
    assert by_name["redis"].up and not status.serving
