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
def test_bad_view_definitions_say_what_to_fix(build, message: str) -> None:  # noqa: ANN001
    with pytest.raises(PipelineDefinitionError, match=message):
        build()
