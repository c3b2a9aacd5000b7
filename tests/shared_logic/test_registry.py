"""The pipeline registry and the plug-in contract: clear errors naming what is wrong."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from shared_logic import (
    Average,
    Count,
    PipelineDefinitionError,
    Sum,
    TumblingWindow,
    UnknownNameError,
    View,
    load_pipeline,
)


def test_unknown_pipeline_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_pipeline("wordcont")
    assert "wordcont" in str(info.value) and "wordcount" in str(info.value) and "payments" in str(info.value)


def test_unknown_view_lists_the_views() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_pipeline("wordcount").view("nope")
    assert "word_counts" in str(info.value) and "word_counts_per_minute" in str(info.value)


def test_module_without_a_pipeline_object_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not_a_pipeline_mod.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PipelineDefinitionError, match="pipeline = "):
        load_pipeline("not_a_pipeline_mod")


def test_dotted_path_loads_a_user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "clicks.py").write_text(
        "from pyspark.sql import DataFrame\n"
        "from shared_logic import Count, EventModel, Pipeline, View\n"
        "class Click(EventModel):\n    page: str\n"
        "class Clicks(Pipeline):\n    name = 'clicks'\n    event_model = Click\n    event_time_field = None\n"
        "    views = (View('page_views', keys=('page',), measures=(Count(),)),)\n"
        "    def transform(self, events: DataFrame) -> DataFrame:\n        return events\n"
        "pipeline = Clicks()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_pipeline("userpkg.clicks").view("page_views").keys == ("page",)
    finally:
        sys.modules.pop("userpkg.clicks", None)
        sys.modules.pop("userpkg", None)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: View("Bad Name", keys=("k",), measures=(Count(),)), "lower-case"),
        (lambda: View("v", keys=(), measures=(Count(),)), "key column"),
        (lambda: View("v", keys=("k",), measures=()), "measure"),
        (lambda: View("v", keys=("k",), measures=(Count(), Count())), "twice"),
        (lambda: View("v", keys=("k",), measures=(Count(),), derived=(Average("x"),)), "sum_x"),
        (lambda: TumblingWindow(timedelta(milliseconds=1500)), "whole number"),
        (lambda: View("v", keys=("count",), measures=(Count(), Sum("x"))), "clash"),
    ],
)
def test_bad_view_definitions_say_what_to_fix(build, message: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=message):
        build()


# --- the pipeline search path and its messages ------------------------------

CLICKS = '''
from pyspark.sql import DataFrame
from shared_logic import Count, EventModel, Pipeline, Sum, View


class Click(EventModel):
    page: str
    ms_on_page: int


class Clicks(Pipeline):
    name = "clicks_here"
    event_model = Click
    event_time_field = None
    views = (View("page_views", keys=("page",), measures=(Count(), Sum("ms_on_page"))),)

    def transform(self, events: DataFrame) -> DataFrame:
        return events


pipeline = Clicks()
'''


@pytest.fixture
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty current folder that is not on sys.path; every module and finder it leaves is removed."""
    folder = tmp_path / "mine"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PYTHONPATH", "")
    modules, finders = set(sys.modules), list(sys.meta_path)
    load_pipeline.cache_clear()
    yield folder
    for name in set(sys.modules) - modules:
        sys.modules.pop(name, None)
    sys.meta_path[:] = finders
    load_pipeline.cache_clear()


def test_a_module_in_the_current_folder_is_found_and_exported_to_children(user_folder: Path) -> None:
    """`lambda-platform` as installed (a console script) has no current folder on sys.path: the
    registry looks there itself, and hands the folder on to child processes and Spark's workers."""
    import os

    assert str(user_folder) not in sys.path and "" not in sys.path[1:]
    (user_folder / "clicks_here.py").write_text(CLICKS)
    assert load_pipeline("clicks_here").name == "clicks_here"
    assert str(user_folder) in os.environ["PYTHONPATH"].split(os.pathsep)
    (user_folder / "pkg_here").mkdir()
    (user_folder / "pkg_here" / "__init__.py").write_text("")
    (user_folder / "pkg_here" / "clicks.py").write_text(CLICKS)
    assert load_pipeline("pkg_here.clicks").views[0].name == "page_views"


def test_the_current_folder_provides_only_the_pipeline_module(user_folder: Path) -> None:
    """A folder holding, say, a `deploy/` package must not shadow anything else: only the pipeline's
    own top-level name is looked up there."""
    (user_folder / "clicks_here.py").write_text(CLICKS)
    (user_folder / "helper_not_a_pipeline.py").write_text("x = 1\n")
    load_pipeline("clicks_here")
    with pytest.raises(ModuleNotFoundError):
        __import__("helper_not_a_pipeline")


def test_unknown_pipeline_is_one_clear_sentence(user_folder: Path) -> None:
    with pytest.raises(UnknownNameError) as info:
        load_pipeline("clickz")
    message = str(info.value)
    assert "known pipelines: or" not in message and ", or a dotted" not in message
    assert "unknown pipeline 'clickz'" in message
    assert "not a built-in pipeline (payments, wordcount)" in message
    assert str(user_folder) in message and "pipeline = YourPipeline()" in message


@pytest.mark.parametrize(
    ("source", "line", "error"),
    [
        ("x = 1\ndef broken(:\n    pass\n", 2, "SyntaxError"),
        ("import os\nimport no_such_dependency_zz\n", 2, "ModuleNotFoundError: No module named 'no_such_dependency_zz'"),
        ("x = 1\n\nraise RuntimeError('boom at import')\n", 3, "RuntimeError: boom at import"),
        ("from shared_logic import View, Count\nV = View('Bad Name', keys=('k',), measures=(Count(),))\n", 2,
         "PipelineDefinitionError"),
    ],
)
def test_a_module_that_fails_to_import_names_module_file_and_line(
    user_folder: Path, source: str, line: int, error: str,
) -> None:
    from shared_logic.errors import PipelineModuleError

    (user_folder / "broken_here.py").write_text(source)
    with pytest.raises(PipelineModuleError) as info:
        load_pipeline("broken_here")
    message = str(info.value)
    assert "'broken_here'" in message and f"{user_folder / 'broken_here.py'}, line {line}" in message
    assert error in message


def test_a_module_whose_dependency_is_missing_is_not_reported_as_unknown(user_folder: Path) -> None:
    """`clicks` importing a missing `click` is a failed import of `clicks`, not an unknown pipeline."""
    from shared_logic.errors import PipelineModuleError

    (user_folder / "clicks_dep.py").write_text("import clicks_de\n")
    with pytest.raises(PipelineModuleError, match="No module named 'clicks_de'"):
        load_pipeline("clicks_dep")


def test_unknown_measure_and_view_read_as_sentences() -> None:
    view = View("page_views", keys=("section",), measures=(Count(), Sum("ms_on_page")))
    with pytest.raises(UnknownNameError) as info:
        view.measure("sum")
    assert str(info.value) == "view 'page_views' has no measure 'sum'; its measures are 'count', 'sum_ms_on_page'"
    with pytest.raises(UnknownNameError) as info:
        load_pipeline("wordcount").view("nope")
    assert str(info.value) == "unknown view 'nope'; the known views are 'word_counts', 'word_counts_per_minute'"
