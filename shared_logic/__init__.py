"""What both layers compute: pipelines, their event schemas, transformations and views.

Pure definitions and DataFrame-in, DataFrame-out functions; no I/O. The batch layer and the speed
layer import the same objects from here, so neither carries its own copy of any logic.
"""

from shared_logic.errors import (
    EventValidationError,
    PipelineDefinitionError,
    SharedLogicError,
    UnknownNameError,
)
from shared_logic.measures import Average, Count, Derived, Distinct, Max, Measure, Min, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.registry import BUILTIN_PIPELINES, load_pipeline
from shared_logic.views import SlidingWindow, TumblingWindow, View

__all__ = [
    "Average", "BUILTIN_PIPELINES", "Count", "Derived", "Distinct", "EventModel", "EventValidationError",
    "Max", "Measure", "Min", "Pipeline", "PipelineDefinitionError", "SharedLogicError", "SlidingWindow", "Sum",
    "TumblingWindow", "UnknownNameError", "View", "load_pipeline",
]
