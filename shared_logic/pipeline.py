"""The plug-in contract: what a user implements to bring their own pipeline.

A pipeline is one Python module exposing ``pipeline = MyPipeline()``, where ``MyPipeline``
subclasses :class:`Pipeline` and declares three things::

    class Event(EventModel):               # 1. the events: flat, validated fields
        text: str
        event_time: datetime | None = None

    class WordCount(Pipeline):
        name = "wordcount"
        event_model = Event
        views = (View("word_counts", keys=("word",), measures=(Count(),)),)   # 3. the views

        def transform(self, events: DataFrame) -> DataFrame:                  # 2. one transform
            return events.select(F.explode(F.split("text", r"\\s+")).alias("word"), "event_time")

``transform`` must use DataFrame operations only (no actions, no I/O, no driver-side state), so
the same function runs unchanged on a static snapshot (batch layer) and on a streaming
DataFrame or micro-batch (speed layer). Point the platform at the module with
``LAMBDA_PIPELINE=my_package.my_pipeline``; the built-ins are written exactly this way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import timedelta
from typing import ClassVar

from pydantic import BaseModel, ConfigDict
from pyspark.sql import DataFrame

from shared_logic.dedup import MIN_HORIZON
from shared_logic.errors import PipelineDefinitionError, UnknownNameError
from shared_logic.events import EventSchema
from shared_logic.logic import logic_fingerprint, pin_code
from shared_logic.views import View


class EventModel(BaseModel):
    """Base for event models: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Pipeline(ABC):
    """A user pipeline: events, one transformation, views. Subclass it and set the class attributes."""

    #: Name of the pipeline (lower-case); names its master dataset and Redis keys.
    name: ClassVar[str]
    #: The events' pydantic model (subclass EventModel).
    event_model: ClassVar[type[BaseModel]]
    #: Datetime field windowed views use; a missing value is set to the ingest time.
    event_time_field: ClassVar[str | None] = "event_time"
    #: The views computed over the transform's output.
    views: ClassVar[tuple[View, ...]]
    #: Bump it for a change of the answers the module's source does not show (a library upgrade, a helper
    #: module): it is part of the logic fingerprint (``shared_logic.logic``), so the views are recomputed.
    logic_version: ClassVar[str] = ""
    #: Field (str or int) naming each event: events repeating an id within ``event_id_horizon`` (master time)
    #: are counted once, the first in master order (``shared_logic.dedup``). None: every event counts.
    event_id_field: ClassVar[str | None] = None
    #: How long an id is remembered (at least ``shared_logic.dedup.MIN_HORIZON``).
    event_id_horizon: ClassVar[timedelta] = timedelta(days=7)

    def __init__(self) -> None:
        cls = type(self)
        for attr in ("name", "event_model", "views"):
            if not hasattr(cls, attr):
                raise PipelineDefinitionError(f"pipeline class {cls.__name__} must set the class attribute {attr!r}")
        if not self.views:
            raise PipelineDefinitionError(f"pipeline {self.name!r} declares no views")
        names = [v.name for v in self.views]
        if len(set(names)) != len(names):
            raise PipelineDefinitionError(f"pipeline {self.name!r} declares a view name twice: {names}")
        self.schema = EventSchema(self.event_model, self.event_time_field)
        self._check_event_id()
        self._views = {v.name: v for v in self.views}
        #: The fingerprint of this pipeline's logic (``shared_logic.logic``): what every answer is computed under.
        #: Taken now, as the module is imported (pipelines are made at import): the source read is the one
        #: that runs, even if the file is edited while this process lives.
        self.logic = logic_fingerprint(
            module=cls.__module__, schema=str(self.schema.arrow_schema()), event_time_field=self.event_time_field,
            views=self.views, logic_version=self.logic_version, event_id=self._event_id_part(),
        )
        pin_code(cls.__module__)

    def _check_event_id(self) -> None:
        field, horizon = self.event_id_field, self.event_id_horizon
        if field is None:
            return
        kind = self.schema.fields.get(field, (None,))[0]
        if kind not in (str, int):
            raise PipelineDefinitionError(
                f"pipeline {self.name!r}: event_id_field {field!r} must name a str or int field of "
                f"{self.event_model.__name__} (its fields: {', '.join(self.schema.fields)})")
        if not isinstance(horizon, timedelta) or horizon < MIN_HORIZON:
            raise PipelineDefinitionError(
                f"pipeline {self.name!r}: event_id_horizon must be a timedelta of at least {MIN_HORIZON} "
                f"(commit times come from writers' clocks), not {horizon!r}")

    def _event_id_part(self) -> str | None:
        if self.event_id_field is None:
            return None
        return f"{self.event_id_field}/{self.event_id_horizon.total_seconds()}"

    @abstractmethod
    def transform(self, events: DataFrame) -> DataFrame:
        """Rows ready for the views, from event rows. Pure: same result on static and streaming input."""


    def view(self, name: str) -> View:
        """The view called ``name``; UnknownNameError lists the pipeline's views otherwise."""
        try:
            return self._views[name]
        except KeyError:
            raise UnknownNameError("view", name, list(self._views)) from None

    def __repr__(self) -> str:
        return f"<Pipeline {self.name!r} views={[v.name for v in self.views]}>"
