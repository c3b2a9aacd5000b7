"""Bytecode in the archives Spark's Python workers import: used when it matches, never when the source differs.

A small archive is built in ``tmp_path``; fresh interpreters import from it as Spark's workers do (the archive
first on PYTHONPATH), so Python's own zip importer is the judge of what the module wrote: it sets a module's
``__file__`` to the ``.pyc`` it ran, or to the ``.py`` it compiled instead.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from deploy.runtime import worker_bytecode

_ENTRIES = {
    "pkg/__init__.py": b"",
    "pkg/mod.py": b"VALUE = 'from the source'\n\ndef fail():\n    raise ValueError('here')\n",
    "pkg/data.txt": b"not a module\n",
    "pkg/old.py": b"print 'python 2'\n",  # a module this Python cannot compile: left as source
}
_PROBE = """
import json, traceback, pkg.mod
try:
    pkg.mod.fail()
except ValueError as e:
    where = traceback.extract_tb(e.__traceback__)[-1].filename
print(json.dumps({"file": pkg.mod.__file__, "value": pkg.mod.VALUE, "raised_in": where}))
"""


def _archive(path: Path, entries: dict[str, bytes], comment: bytes = b"") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.comment = comment
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def _contents(path: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def _imported(archive: Path) -> dict[str, Any]:
    """What a fresh interpreter with ``archive`` first on its path imports: ``pkg.mod``'s file and VALUE, and the
    file a traceback through it names."""
    env = {**os.environ, "PYTHONPATH": str(archive)}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    said: dict[str, Any] = json.loads(done.stdout)
    return said


def _replace(archive: Path, name: str, data: bytes) -> None:
    entries = dict(_contents(archive))
    entries[name] = data
    _archive(archive, entries)


def test_the_importer_runs_the_bytecode_written_and_names_the_file_as_the_source_would(tmp_path: Path) -> None:
    (tmp_path / "source").mkdir()
    source_only = _archive(tmp_path / "source" / "lib.zip", _ENTRIES)
    archive = _archive(tmp_path / "lib.zip", _ENTRIES)
    assert worker_bytecode.compile_archive(archive) == 2

    compiled, plain = _imported(archive), _imported(source_only)
    assert compiled["file"] == f"{archive}/pkg/mod.pyc" and plain["file"] == f"{source_only}/pkg/mod.py"
    assert compiled["value"] == plain["value"] == "from the source"
    assert compiled["raised_in"] == f"{archive}/pkg/mod.py", "tracebacks name the source, as without bytecode"
    assert plain["raised_in"] == f"{source_only}/pkg/mod.py"


def test_every_entry_is_kept_in_order_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "lib.zip", _ENTRIES, comment=b"the archive's own comment")
    worker_bytecode.compile_archive(archive)
    contents = _contents(archive)
    assert [(n, d) for n, d in contents if not n.endswith(".pyc") and not n.startswith(".")] == list(_ENTRIES.items())
    assert sorted(n for n, _ in contents if n.endswith(".pyc")) == ["pkg/__init__.pyc", "pkg/mod.pyc"]
    assert [n for n, _ in contents].index("pkg/mod.pyc") == [n for n, _ in contents].index("pkg/mod.py") + 1
    with zipfile.ZipFile(archive) as opened:
        assert opened.comment == b"the archive's own comment"
    assert not [p for p in tmp_path.iterdir() if p != archive], "no temporary file is left beside it"

    written = archive.read_bytes()
    assert worker_bytecode.compile_archive(archive) == 0
    assert archive.read_bytes() == written, "an archive compiled already is left as it is"


def test_a_changed_source_runs_and_bytecode_of_another_python_is_written_again(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "lib.zip", _ENTRIES)
    worker_bytecode.compile_archive(archive)
    # A source changed after its bytecode was written: the hash differs, so the importer compiles the source.
    _replace(archive, "pkg/mod.py", b"VALUE = 'from the changed source'\n\ndef fail():\n    raise ValueError\n")
    changed = _imported(archive)
    assert changed["value"] == "from the changed source" and changed["file"].endswith("mod.py")

    # Bytecode of another Python (another magic number) and no mark of this one: written again, and then used.
    with zipfile.ZipFile(archive) as opened:
        entries = {i.filename: opened.read(i) for i in opened.infolist() if not i.filename.startswith(".")}
    entries["pkg/mod.pyc"] = b"\x00\x00\r\n" + entries["pkg/mod.pyc"][4:]
    _archive(archive, entries)
    assert worker_bytecode.compile_archive(archive) == 2
    with zipfile.ZipFile(archive) as opened:
        assert opened.read("pkg/mod.pyc")[:4] == importlib.util.MAGIC_NUMBER
    assert _imported(archive)["file"].endswith("mod.pyc")


def test_a_failure_midway_leaves_the_archive_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _archive(tmp_path / "lib.zip", _ENTRIES)
    before = archive.read_bytes()

    def fail(source: bytes, filename: str) -> bytes:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(worker_bytecode, "_bytecode", fail)
    with pytest.raises(OSError, match="No space left"):
        worker_bytecode.compile_archive(archive)
    assert archive.read_bytes() == before and list(tmp_path.iterdir()) == [archive]


def test_a_file_that_is_not_an_archive_is_named_and_left_as_it_was(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"not a zip")
    good = _archive(tmp_path / "lib.zip", _ENTRIES)
    assert worker_bytecode.main([str(broken), str(good)]) == 1
    said = capsys.readouterr()
    assert f"{broken}: not compiled, left as it was" in said.err and f"{good}: bytecode written for 2" in said.out
    assert broken.read_bytes() == b"not a zip" and sorted(tmp_path.iterdir()) == [broken, good]


def test_the_installed_pyspark_archives_carry_bytecode_of_this_python() -> None:
    """`make install` compiled them: Spark's workers in this suite import PySpark's bytecode."""
    archives = {archive.name: archive for archive in worker_bytecode.worker_archives()}
    assert "pyspark.zip" in archives and any(name.startswith("py4j") for name in archives)
    for archive in archives.values():
        with zipfile.ZipFile(archive) as opened:
            names = set(opened.namelist())
            modules = {name for name in names if name.endswith(".py")}
            headers = {name: opened.read(name + "c")[:4] for name in modules if name + "c" in names}
            first = marshal.loads(opened.read(min(modules) + "c")[16:])
        fix = "run `python -m deploy.runtime.worker_bytecode` (make install does)"
        assert modules and set(headers) == modules and set(headers.values()) == {importlib.util.MAGIC_NUMBER}, \
            f"{archive} lacks bytecode of this Python: {fix}"
        assert first.co_filename == f"{archive}/{min(modules)}", f"{archive}'s bytecode names its files otherwise: {fix}"
