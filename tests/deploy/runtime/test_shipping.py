"""Shipping code to executors: what the zip holds, that it runs in a Python without the project, and
the checks that name what to fix (executor Python version, missing packages)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deploy.runtime.shipping import (
    PROJECT_PACKAGES,
    ExecutorEnvironmentError,
    ExecutorPythonError,
    ShippingError,
    build_bundle,
    check_executors,
    check_local_python,
    check_versions,
    pipeline_modules,
)
from tests.support.clusters import bare_python, daemon_env

CLICKS = '''
from datetime import datetime

from pyspark.sql import DataFrame, functions as F
from shared_logic import Count, EventModel, Pipeline, View


def section(page):
    return page.split("/")[1]


class Click(EventModel):
    page: str
    event_time: datetime | None = None


class Clicks(Pipeline):
    name = "{name}"
    event_model = Click
    views = (View("page_views", keys=("section",), measures=(Count(),)),)

    def transform(self, events: DataFrame) -> DataFrame:
        return events.withColumn("section", F.udf(section)("page"))


pipeline = Clicks()
'''


@pytest.fixture
def user_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on the driver's path with a one-file pipeline ``clicks_one`` and a package ``acme``."""
    folder = tmp_path / "user_code"
    (folder / "acme" / "pipes").mkdir(parents=True)
    (folder / "clicks_one.py").write_text(CLICKS.format(name="clicks_one"))
    (folder / "acme" / "__init__.py").write_text("")
    (folder / "acme" / "pipes" / "__init__.py").write_text("")
    (folder / "acme" / "pipes" / "clicks.py").write_text(CLICKS.format(name="acme_clicks"))
    (folder / "acme" / "pipes" / "__pycache__").mkdir()
    (folder / "acme" / "pipes" / "__pycache__" / "clicks.cpython-311.pyc").write_bytes(b"stale")
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_the_bundle_holds_the_project_and_a_one_file_pipeline_and_runs_without_the_project(
    tmp_path: Path, user_code: Path,
) -> None:
    assert pipeline_modules("wordcount") == ()
    assert pipeline_modules("clicks_one") == ("clicks_one",)
    bundle = build_bundle(pipeline_modules("clicks_one"), tmp_path / "code")
    names = zipfile.ZipFile(bundle.path).namelist()
    assert bundle.names == (*PROJECT_PACKAGES, "clicks_one")
    assert {"shared_logic/__init__.py", "speed_layer/source.py", "serving/store/keys.py", "deploy/runtime/shipping.py",
            "clicks_one.py"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    again = build_bundle(pipeline_modules("clicks_one"), tmp_path / "code")
    assert again.path == bundle.path and again.digest == bundle.digest, "the same code makes the same zip"

    python = bare_python(tmp_path / "bare")
    script = ("import sys; sys.path.insert(1, sys.argv[1]); import clicks_one, speed_layer.source, shared_logic; "
              "print(clicks_one.pipeline.name, clicks_one.__file__, shared_logic.__file__)")
    ran = subprocess.run([str(python), "-c", script, str(bundle.path)], cwd=tmp_path, env=daemon_env(),
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    name, module_file, project_file = ran.stdout.split()
    assert name == "clicks_one"
    assert module_file.startswith(str(bundle.path)) and project_file.startswith(str(bundle.path))


def test_a_pipeline_in_a_package_ships_its_whole_top_level_package(tmp_path: Path, user_code: Path) -> None:
    assert pipeline_modules("acme.pipes.clicks") == ("acme",)
    bundle = build_bundle(pipeline_modules("acme.pipes.clicks"), tmp_path / "code")
    names = set(zipfile.ZipFile(bundle.path).namelist())
    assert {"acme/__init__.py", "acme/pipes/__init__.py", "acme/pipes/clicks.py"} <= names
    assert "acme/pipes/__pycache__/clicks.cpython-311.pyc" not in names


def test_a_compiled_module_cannot_be_shipped_and_the_error_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ShippingError, match="install it in the executors' Python and set LAMBDA_SPARK_SHIP_CODE=never"):
        build_bundle(("_json",), tmp_path / "code")  # a C extension (or built into the interpreter)


def test_an_executor_python_of_another_version_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ExecutorPythonError, match=r"Python 3\.9, the driver runs Python 3\.11.*LAMBDA_SPARK_EXECUTOR_PYTHON"):
        check_versions("3.11", "3.9", "/opt/py39/bin/python")
    check_versions("3.11", "3.11", "/usr/bin/python3.11")
    check_local_python(sys.executable)  # the default: nothing to check


def test_a_local_executor_python_is_checked_before_spark_starts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    check_local_python("./environment/bin/python")  # only on the workers: a warning, the executors check it
    assert "is not on this machine" in caplog.text and "Python streaming source" in caplog.text
    not_a_python = tmp_path / "python"
    not_a_python.write_text("not executable")
    with pytest.raises(ExecutorPythonError, match="LAMBDA_SPARK_EXECUTOR_PYTHON=.*cannot run it here"):
        check_local_python(str(not_a_python))
    other = shutil.which("pypy3")  # a real interpreter of another version, when the machine has one
    if other is None:
        pytest.skip("no Python of another version on this machine (apt-get install pypy3)")
    with pytest.raises(ExecutorPythonError, match=r"is Python 3\.\d+, the driver runs Python"):
        check_local_python(other)


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_the_start_up_check_runs_on_the_executors_and_names_what_they_lack(
    spark, monkeypatch: pytest.MonkeyPatch,
) -> None:
    reports = check_executors(spark)
    assert {version.rsplit(".", 1)[0] for _, version, _ in reports} == {"{}.{}".format(*sys.version_info[:2])}
    with pytest.raises(ExecutorEnvironmentError, match=r"no_such_pipeline_module .*LAMBDA_SPARK_SHIP_CODE=auto"):
        check_executors(spark, ("no_such_pipeline_module",))
    # A third-party package the executors lack (one more name on the list the check imports there).
    monkeypatch.setattr("deploy.runtime.shipping._EXECUTOR_MODULES", ("no_such_package", "pyarrow"))
    with pytest.raises(ExecutorEnvironmentError, match=r"lacks packages .*no_such_package .*Install pyarrow, pandas"):
        check_executors(spark, ("no_such_pipeline_module",))


def test_the_start_up_check_explains_an_executor_python_that_cannot_run_pyspark(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What LAMBDA_SPARK_EXECUTOR_PYTHON (PYSPARK_PYTHON) sets: the interpreter Python tasks start.
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(tmp_path / "no-such-python"))
    with pytest.raises(ExecutorPythonError, match="the executors cannot start Python .*no-such-python"):
        check_executors(spark)
    other = shutil.which("pypy3")  # Python 3.9: PySpark 4 does not even import there
    if other is None:
        pytest.skip("no Python of another version on this machine (apt-get install pypy3)")
    monkeypatch.setattr(spark.sparkContext, "pythonExec", other)
    with pytest.raises(ExecutorPythonError, match=r"cannot run PySpark's worker \(\w+Error: .*LAMBDA_SPARK_EXECUTOR_PYTHON"):
        check_executors(spark)
