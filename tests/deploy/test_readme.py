"""The README's "Bring your own pipeline", run as written.

The test takes the section's code blocks from README.md: the module goes where the README says to
save it (``~/clicks/clicks.py``, with HOME a temporary folder); the first shell block runs in bash
from a checkout (a folder whose ``.venv`` is this test run's virtualenv), as a user pastes it, and
ends in ``up``; the second runs, command by command, from ``~/clicks`` once the API answers. The
only change is the port (``localhost:8000`` -> a free port, LAMBDA_HTTP_PORT), so parallel runs
do not collide. Oracle: the events in the master dataset, read with ``deltalake``, summed per
section in plain Python; the answer the README shows must be the true one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from deploy.redis_server import stop_embedded_redis
from tests.support import free_port

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def section_blocks(title: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced code block in the README section ``title``."""
    text = README.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```(\w*)\n(.*?)```", text[start:end if end > 0 else None], re.S)


def commands(block: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comment lines dropped."""
    joined = block.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def oracle(master: Path) -> dict[str, tuple[int, int]]:
    table = DeltaTable(str(master)).to_pyarrow_table()
    table = table.filter(pc.equal(table["_kind"], "event"))
    sums: dict[str, tuple[int, int]] = {}
    for page, ms in zip(table["page"].to_pylist(), table["ms_on_page"].to_pylist()):
        section = page.split("/")[1]
        count, total = sums.get(section, (0, 0))
        sums[section] = (count + 1, total + ms)
    return sums


def test_bring_your_own_pipeline_as_written(tmp_path: Path) -> None:
    blocks = section_blocks("Bring your own pipeline")
    [module] = [text for lang, text in blocks if lang == "python"]
    setup, queries = [text for lang, text in blocks if lang == "bash"]
    port = free_port()
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    folder = home / "clicks"
    folder.mkdir(parents=True)
    checkout.mkdir()
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    (folder / "clicks.py").write_text(module)  # "Save it as clicks.py in a folder of yours (here ~/clicks)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_") and k != "VIRTUAL_ENV"}
    env.update({"HOME": str(home), "LAMBDA_HTTP_PORT": str(port), "LAMBDA_SPARK_MASTER": "local[2]",
                "LAMBDA_SPEED_TRIGGER_SECONDS": "0.5"})
    log = (tmp_path / "setup.log").open("w")
    shell = subprocess.Popen(["bash", "-e", "-c", setup], cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1200
        while True:
            assert shell.poll() is None, f"the README's commands stopped:\n{(tmp_path / 'setup.log').read_text()}"
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "setup.log").read_text()
            time.sleep(0.5)

        said = (tmp_path / "setup.log").read_text()
        assert "ingested 3 events" in said and "Traceback" not in said, said
        master = folder / "data" / "master" / "clicks"
        first = oracle(master)
        readme_says = re.search(r'"value":(\{[^}]*\})', queries)
        assert readme_says and json.loads(readme_says.group(1)) == {"count": first["news"][0],
                                                                    "sum_ms_on_page": first["news"][1]}
        outputs = []
        for command in commands(queries):
            command = command.replace("localhost:8000", f"localhost:{port}")
            done = subprocess.run(["bash", "-e", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, (command, done.stderr)
            outputs.append(json.loads(done.stdout))
        answer, accepted = outputs
        assert answer["view"] == "page_views" and answer["key"] == "news"
        assert answer["value"] == {"count": first["news"][0], "sum_ms_on_page": first["news"][1]}
        assert accepted["accepted"] == 1, accepted

        want = oracle(master)
        assert sum(c for c, _ in want.values()) == sum(c for c, _ in first.values()) + 1

        def merged() -> dict[str, tuple[int, int]]:
            got = {}
            for section in want:
                value = httpx.get(f"{base}/v1/views/page_views/keys/{section}", timeout=10).json()["value"]
                got[section] = (value["count"], value["sum_ms_on_page"])
            return got

        deadline = time.monotonic() + 300
        while merged() != want:
            assert time.monotonic() < deadline, (merged(), want)
            time.sleep(0.5)
    finally:
        _stop_group(shell)
        stop_embedded_redis(folder / "data" / "redis")
        log.close()


def _stop_group(shell: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the shell and `up` (its process group), as Ctrl-C would; `up` stops its children."""
    try:
        os.killpg(shell.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    shell.wait(60)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            os.killpg(shell.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(shell.pid, signal.SIGKILL)
