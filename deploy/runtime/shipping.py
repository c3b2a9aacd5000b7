"""Getting the platform's code, and the user's pipeline, onto Spark executors.

On a cluster the executors run on other machines: they have neither this project's packages nor
the user's pipeline module, yet they import both (the Python data source reading the master
dataset's log, the Redis writers, every Python function a pipeline's transform uses).

**The choice: a zip of the running code on the job's Python path.** At session start
``build_bundle`` zips the five project packages (shared_logic, batch_layer, speed_layer, serving,
deploy) and the top-level module or package of the configured pipeline, *from the files the
driver is running*, and ``ship`` adds the zip with ``SparkContext.addPyFile``: every task's
Python worker puts it on ``sys.path``. Driver and executors therefore always run the same code,
with no build step and no artifact to publish; a change of code (or of pipeline) is shipped by
the next session. The zip is a few hundred kilobytes, content-addressed, and rebuilt only when
the code changes. A packed environment on ``spark.archives`` was the alternative: it carries the
third-party packages too, but it is hundreds of megabytes, has to be rebuilt and republished for
every change of code, and ties the executors to the packer's platform; so it is offered for
the third-party part (``LAMBDA_SPARK_ARCHIVES``), not for our code.

**What the executor Python must have.** The executors run ``LAMBDA_SPARK_EXECUTOR_PYTHON``
(default: the driver's own interpreter path, right when workers share the driver's image) at the
driver's major.minor version (PySpark refuses anything else), with the project's third-party
dependencies installed: ``EXECUTOR_REQUIREMENTS``. The same path must work on the driver's machine
too: Spark plans the speed layer's Python streaming source in a Python process on the driver,
started from the executors' interpreter path. ``check_local_python`` compares versions before
Spark starts when that Python exists on this machine, and ``check_executors`` runs one small job
at session start on a cluster that imports, on the executors, what they will import: a missing
package or a wrong Python fails there with a message naming the setting to fix, not later in the
middle of a micro-batch.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.errors import DeployError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: The project's packages, shipped whole.
PROJECT_PACKAGES = ("shared_logic", "batch_layer", "speed_layer", "serving", "deploy")
#: Third-party distributions the executors' Python must have installed (pip names), beyond pyspark's own.
EXECUTOR_REQUIREMENTS = ("pyarrow", "pandas", "numpy", "deltalake", "redis", "hiredis", "pydantic", "tenacity", "orjson")
#: Modules the executors import while running the layers; the start-up check imports them there.
_EXECUTOR_MODULES = ("pyarrow", "pandas", "deltalake", "redis", "hiredis", "pydantic", "tenacity", "orjson",
                     "speed_layer.source", "speed_layer.segments", "batch_layer.recompute.publish")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same code makes the same zip, byte for byte
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


class ShippingError(DeployError):
    """The code could not be shipped to the executors, or the executors cannot run it."""


class ExecutorPythonError(ShippingError):
    """The executors' Python cannot be started, or is not the driver's major.minor version."""


class ExecutorEnvironmentError(ShippingError):
    """The executors' Python lacks a package the platform (or the shipped code) needs."""


@dataclass(frozen=True)
class CodeBundle:
    """A zip of the project's packages and the pipeline's module, as the driver runs them."""

    path: Path
    #: Top-level names inside (packages and modules), in zip order.
    names: tuple[str, ...]
    digest: str


def pipeline_modules(pipeline: str) -> tuple[str, ...]:
    """Top-level modules or packages that the pipeline ``pipeline`` (a setting value) lives in, beyond ours.

    The module the setting names and the module defining the pipeline's class both count (a user
    module may import its pipeline class from a sibling package). Built-ins give ().
    """
    from shared_logic.registry import BUILTIN_PIPELINES, load_pipeline

    names = [BUILTIN_PIPELINES.get(pipeline, pipeline), type(load_pipeline(pipeline)).__module__]
    tops = dict.fromkeys(name.split(".")[0] for name in names)
    return tuple(top for top in tops if top not in PROJECT_PACKAGES)


def build_bundle(extra: tuple[str, ...] = (), directory: Path | None = None) -> CodeBundle:
    """Zip the project's packages and the top-level modules ``extra`` from the files this process imported.

    Packages go whole (every file but caches: pure Python, loaded by zipimport); a top-level
    module goes as ``name.py``. The zip is written once per content, atomically, under
    ``directory`` (default: a folder in the system temp dir) and named by its digest.
    Raises ShippingError for a module that is not plain Python source (a compiled extension
    cannot be shipped in a zip: install it on the executors instead).
    """
    names = tuple(dict.fromkeys((*PROJECT_PACKAGES, *extra)))
    entries = sorted(entry for name in names for entry in _entries(name))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for arcname, source in entries:
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, source.read_bytes())
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    directory = directory or Path(tempfile.gettempdir()) / f"lambda-platform-code-{os.getuid()}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"lambda-code-{digest}.zip"
    if not path.exists():
        fd, partial = tempfile.mkstemp(dir=directory, suffix=".partial")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    return CodeBundle(path=path, names=names, digest=digest)


def _entries(name: str) -> Iterator[tuple[str, Path]]:
    """(name in the zip, file) of the top-level module or package ``name``, imported here to find it."""
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise ShippingError(f"cannot ship module {name!r} to the executors: it does not import here ({e})") from e
    locations = list(getattr(module, "__path__", []) or [])
    if locations:  # a package (namespace packages may have several folders)
        for root in map(Path, locations):
            for file in root.rglob("*"):
                parts = file.relative_to(root).parts
                if file.is_file() and not _SKIP_DIRS.intersection(parts) and not file.name.endswith(_SKIP_SUFFIXES):
                    yield "/".join((name, *parts)), file
        return
    source = Path(getattr(module, "__file__", None) or "")
    if source.suffix != ".py":
        raise ShippingError(
            f"cannot ship module {name!r} ({source or 'no file'}) to the executors: only Python source can be "
            f"shipped; install it in the executors' Python and set LAMBDA_SPARK_SHIP_CODE=never"
        )
    yield f"{name}.py", source


def ship(spark: SparkSession, bundle: CodeBundle) -> None:
    """Put ``bundle`` on the Python path of every task of ``spark`` from now on (``addPyFile``).

    Every shipped name is imported on the driver first, so that the driver keeps running its
    own files (``addPyFile`` also prepends the zip to the driver's ``sys.path``).
    """
    for name in bundle.names:
        importlib.import_module(name)
    spark.sparkContext.addPyFile(str(bundle.path))


def python_version(python: str) -> str:
    """The major.minor version of the interpreter ``python`` (a path on this machine)."""
    try:
        done = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise ExecutorPythonError(f"LAMBDA_SPARK_EXECUTOR_PYTHON={python}: cannot run it here: {e}") from e
    return done.stdout.strip()


def check_versions(driver: str, executor: str, python: str) -> None:
    """ExecutorPythonError unless the executor's major.minor version ``executor`` is the driver's."""
    if driver != executor:
        raise ExecutorPythonError(
            f"the executors' Python {python} is Python {executor}, the driver runs Python {driver}: PySpark "
            f"needs the same major.minor version on both. Set LAMBDA_SPARK_EXECUTOR_PYTHON to a Python {driver} "
            f"present on every worker (or run the driver on a Python {executor})"
        )


def check_local_python(python: str) -> None:
    """Before Spark starts: when the executors' Python is also on this machine, compare its version.

    It should be: Spark plans the speed layer's Python streaming source in a Python process on the
    driver started from the same path, so a path that exists only on the workers (an unpacked
    archive) stops the speed layer; that is logged as a warning here, and the executors' side is
    left to ``check_executors``.
    """
    if python == sys.executable:
        return
    local = python if os.sep in python else shutil.which(python)
    if local is None or not os.path.exists(local):
        log.warning("LAMBDA_SPARK_EXECUTOR_PYTHON=%s is not on this machine: the executors may have it, but the speed "
                    "layer also starts it here (Spark plans its Python streaming source on the driver); unpack the "
                    "same environment here too (see README, Running on a cluster)", python)
        return
    check_versions("{}.{}".format(*sys.version_info[:2]), python_version(local), python)


def check_executors(spark: SparkSession, modules: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """Run one small job on the executors that imports what they will import; return (host, version, python).

    Raises ExecutorPythonError when the executors' Python cannot start or has another
    major.minor version than the driver, and ExecutorEnvironmentError naming the modules it lacks
    (third-party packages: install ``EXECUTOR_REQUIREMENTS`` there; ours: the code was not shipped).
    """
    sc = spark.sparkContext
    python = sc.pythonExec
    wanted = (*_EXECUTOR_MODULES, *modules)
    tasks = max(2, sc.defaultParallelism)
    try:
        reports = sc.parallelize(range(tasks), tasks).map(_probe(wanted)).collect()
    except Exception as e:
        raise _explain(str(e), python) from e
    ours = (*PROJECT_PACKAGES, *modules)
    missing = sorted({(host, m) for host, _, _, lacking in reports for m in lacking})
    code = [f"{host}: {m}" for host, m in missing if m.split(" ", 1)[0].split(".")[0] in ours]
    packages = [f"{host}: {m}" for host, m in missing if m.split(" ", 1)[0].split(".")[0] not in ours]
    if packages:
        raise ExecutorEnvironmentError(
            f"the executors' Python {python} lacks packages the platform runs there: {'; '.join(packages)}. "
            f"Install {', '.join(EXECUTOR_REQUIREMENTS)} (the versions in pyproject.toml) in that Python, or ship "
            f"a packed environment (LAMBDA_SPARK_ARCHIVES)"
        )
    if code:
        raise ExecutorEnvironmentError(
            f"the executors cannot import the platform's code: {'; '.join(code)}. Ship it with the job "
            f"(LAMBDA_SPARK_SHIP_CODE=auto or always) or install it in the executors' Python {python}"
        )
    return sorted({(host, version, executable) for host, version, executable, _ in reports})


def _explain(text: str, python: str) -> ShippingError:
    """What a failed start-up check means, as an error naming the setting to fix."""
    driver = "{}.{}".format(*sys.version_info[:2])
    mismatch = re.search(r"different version:? (\d+\.\d+)\S* than that in driver:? (\d+\.\d+)", text)
    if mismatch:
        try:
            check_versions(mismatch.group(2), mismatch.group(1), python)
        except ExecutorPythonError as e:
            return e
    if "PYTHON_VERSION_MISMATCH" in text:
        return ExecutorPythonError(f"the executors' Python {python} is not Python {driver}, the driver's version: "
                                   f"set LAMBDA_SPARK_EXECUTOR_PYTHON to a Python {driver} present on every worker")
    if "Cannot run program" in text:
        return ExecutorPythonError(f"the executors cannot start Python {python!r}: set LAMBDA_SPARK_EXECUTOR_PYTHON "
                                   f"to a Python {driver} present on every worker")
    cause = next((m.group(0).strip() for m in re.finditer(r"^\s*\w+(Error|Exception): .*$", text, re.MULTILINE)),
                 text.strip().splitlines()[0] if text.strip() else "no detail")
    if "Error from python worker" in text or "pyspark.daemon" in text:
        return ExecutorPythonError(
            f"the executors' Python {python} cannot run PySpark's worker ({cause}): set LAMBDA_SPARK_EXECUTOR_PYTHON "
            f"to a Python {driver} with {', '.join(EXECUTOR_REQUIREMENTS)} installed, present on every worker"
        )
    return ExecutorEnvironmentError(f"the executors failed the start-up check: {cause}")


def _probe(modules: tuple[str, ...]) -> Callable[[int], tuple[str, str, str, list[str]]]:
    def probe(_: int) -> tuple[str, str, str, list[str]]:
        import importlib as _importlib
        import socket
        import sys as _sys

        lacking = []
        for name in modules:
            try:
                _importlib.import_module(name)
            except ImportError as e:
                lacking.append(f"{name} ({e})")
        return socket.gethostname(), "{}.{}.{}".format(*_sys.version_info[:3]), _sys.executable, lacking

    return probe
