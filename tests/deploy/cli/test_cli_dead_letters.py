"""`lambda-platform ingest --dead-letters`, `dead-letters list` and `dead-letters replay`, in process, as a user
runs them: a pipeline module of their own in the current folder, a file with bad lines, then the model fixed
(the module edited) and the letters replayed, twice.

Oracle: the lines the test wrote (which are bad, and which the fixed model accepts, by a merchant name unique
to each line) and the master dataset read back with delta-rs, its rows counted by merchant.
"""

from __future__ import annotations

import io
import os
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deploy.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from deploy.cli.main import run
from deploy.terminal import out
from shared_logic.registry import load_pipeline

MODULE = """
from datetime import datetime

from shared_logic.pipeline import EventModel
from shared_logic.pipelines.payments import Payments


class Payment(EventModel):
    user_id: str
    merchant: str
    amount: float
    event_time: datetime | None = None{extra}


class Shop(Payments):
    name = "shop"
    event_model = Payment


pipeline = Shop()
"""

LINES = [
    '{"user_id": "u1", "merchant": "ok-1", "amount": 1}',
    '{"user_id": "u2", "merchant": "tip-json", "amount": 2, "tip": 0.5}',
    '{"user_id": "u3", "merchant": "bad-amount", "amount": "three"}',
    '{"user_id": "u4", "merchant": "ok-4", "amount": 4}',
    '{"user_id": "u5", "merchant": "tip-json-2", "amount": 5, "tip": 1}',
]


def _merchants(master: Path) -> Counter[str]:
    rows = DeltaTable(str(master)).to_pyarrow_table().to_pylist()
    return Counter(r["merchant"] for r in rows if r["_kind"] == "event")


@pytest.fixture
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str]]:
    """A folder with the user's pipeline module (strict: no tip) as the current folder; the module's name
    and the common arguments."""
    for name in [n for n in os.environ if n.startswith("LAMBDA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LAMBDA_STORAGE_ENGINE", "delta-rs")
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # load_pipeline adds the folder to it
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # ... and a finder for the folder's module
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal: nothing to ask
    monkeypatch.setattr(out, "_width", 240)  # tables as a wide terminal shows them (a cell on one line)
    monkeypatch.chdir(tmp_path)
    module = f"shop_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(MODULE.format(extra=""), encoding="utf-8")
    (tmp_path / "day.jsonl").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return module, ["--data-dir", str(tmp_path / "data"), "--pipeline", module]


def test_ingest_list_then_replay_after_the_model_is_fixed(user_folder: tuple[str, list[str]], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    module, common = user_folder
    master = tmp_path / "data" / "master" / module

    assert run([*common, "ingest", "day.jsonl"]) == EXIT_FAILED  # the default: nothing of the file
    assert "nothing was written" in capsys.readouterr().err

    assert run([*common, "ingest", "--dead-letters", "day.jsonl"]) == EXIT_OK
    said = capsys.readouterr().err
    assert "ingested 2 events" in said and "3 bad line(s) or row(s) went to the dead letters" in said
    assert _merchants(master) == Counter({"ok-1": 1, "ok-4": 1})

    assert run([*common, "dead-letters", "list"]) == EXIT_OK
    listing = capsys.readouterr().out
    assert "3 of 3" in listing and "day.jsonl:2" in listing and "day.jsonl:5" in listing
    assert run([*common, "dead-letters", "list", "--source", "kafka"]) == EXIT_OK
    assert "no dead letters match" in capsys.readouterr().out

    assert run([*common, "dead-letters", "replay"]) == EXIT_USAGE  # no terminal, no --yes: nothing done
    assert "add --yes" in capsys.readouterr().err
    assert run([*common, "dead-letters", "replay", "--id", "nope", "--yes"]) == EXIT_FAILED
    assert "no dead letter nope" in capsys.readouterr().err

    # The user fixes the model: tips are an optional field now.
    (tmp_path / f"{module}.py").write_text(MODULE.format(extra="\n    tip: float | None = None"), encoding="utf-8")
    monkeypatch.delitem(sys.modules, module)
    load_pipeline.cache_clear()  # a new process would import the edited module; this one forgets the old

    assert run([*common, "dead-letters", "replay", "--yes"]) == EXIT_FAILED  # one letter is still invalid
    captured = capsys.readouterr()
    assert "replayed 2 dead letter(s)" in captured.err
    assert "1 still invalid" in captured.out and "day.jsonl:3" in captured.out and "amount" in captured.out
    assert _merchants(master) == Counter({"ok-1": 1, "ok-4": 1, "tip-json": 1, "tip-json-2": 1})
    tips = {r["merchant"]: r["tip"] for r in DeltaTable(str(master)).to_pyarrow_table().to_pylist()}
    assert tips["tip-json"] == 0.5 and tips["tip-json-2"] == 1.0

    assert run([*common, "dead-letters", "replay", "--reason", "extra inputs", "--yes"]) == EXIT_OK  # again: nothing twice
    assert "2 replayed before: skipped" in capsys.readouterr().err
    assert _merchants(master) == Counter({"ok-1": 1, "ok-4": 1, "tip-json": 1, "tip-json-2": 1})

    assert run([*common, "dead-letters", "list", "--limit", "10"]) == EXIT_OK
    rows = [line for line in capsys.readouterr().out.splitlines() if "day.jsonl:" in line]
    assert sum("yes" in line for line in rows) == 2 and len(rows) == 3
