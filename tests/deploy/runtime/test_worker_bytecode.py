"""Bytecode in the archives Spark's Python workers import: used when it matches, never when the source differs.

A small archive is built in ``tmp_path``; fresh interpreters import from it as Spark's workers do (the archive
first on PYTHONPATH), so Python's own zip importer is the judge of what the module wrote.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path

import pytest

from deploy.runtime import worker_bytecode

_ENTRIES = {
    "pkg/__init__.py": b"",
    "pkg/mod.py": b"VALUE = 'from the source'\n",
    "pkg/data.txt": b"not a module\n",
    "pkg/old.py": b"print 'python 2'\n",  # a module this Python cannot compile: left as source
}


def _archive(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def _contents(path: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def _value(archive: Path) -> str:
    """``pkg.mod.VALUE`` as a fresh interpreter with ``archive`` first on its path imports it."""
    env = {**os.environ, "PYTHONPATH": str(archive)}
    done = subprocess.run([sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE)"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def _replace(archive: Path, name: str, data: bytes) -> None:
    entries = dict(_contents(archive))
    entries[name] = data
    _archive(archive, entries)


def test_each_module_gets_bytecode_and_every_entry_is_kept_in_order(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "lib.zip", _ENTRIES)
    assert worker_bytecode.compile_archive(archive) == 2
    contents = _contents(archive)
    assert [(n, d) for n, d in contents if not n.endswith(".pyc")] == list(_ENTRIES.items())
    assert sorted(n for n, _ in contents if n.endswith(".pyc")) == ["pkg/__init__.pyc", "pkg/mod.pyc"]
    assert _value(archive) == "from the source"
    assert not [p for p in tmp_path.iterdir() if p != archive], "no temporary file is left beside it"

    written = archive.read_bytes()
    assert worker_bytecode.compile_archive(archive) == 0
    assert archive.read_bytes() == written, "an archive already compiled is left as it is"


def test_the_importer_takes_matching_bytecode_and_compiles_a_changed_source(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "lib.zip", _ENTRIES)
    worker_bytecode.compile_archive(archive)
    # Bytecode of other code, checked against mod.py's own source: the importer runs it, so it is read.
    other = compile("VALUE = 'from the bytecode'\n", "pkg/mod.py", "exec")
    _replace(archive, "pkg/mod.pyc", bytes(_code_to_hash_pyc(other, importlib.util.source_hash(
        _ENTRIES["pkg/mod.py"]), checked=True)))
    assert _value(archive) == "from the bytecode"
    # A source changed after its bytecode was written: the hash differs, the source is what runs.
    _replace(archive, "pkg/mod.py", b"VALUE = 'from the changed source'\n")
    assert _value(archive) == "from the changed source"


def test_a_file_that_is_not_an_archive_is_named_and_left_as_it_was(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"not a zip")
    with pytest.raises(SystemExit) as stopped:
        worker_bytecode.main([str(broken)])
    assert stopped.value.code == 1 and f"{broken}: not compiled, left as it was" in capsys.readouterr().err
    assert broken.read_bytes() == b"not a zip" and list(tmp_path.iterdir()) == [broken]


def test_the_installed_pyspark_archives_carry_bytecode() -> None:
    """`make install` compiled them: Spark's workers in this suite import PySpark's bytecode."""
    archives = {archive.name: archive for archive in worker_bytecode.worker_archives()}
    assert "pyspark.zip" in archives and any(name.startswith("py4j") for name in archives)
    for archive in archives.values():
        with zipfile.ZipFile(archive) as opened:
            names = set(opened.namelist())
        modules = {name for name in names if name.endswith(".py")}
        assert modules and all(name + "c" in names for name in modules), \
            f"{archive} lacks bytecode: run `python -m deploy.runtime.worker_bytecode` (make install does)"
