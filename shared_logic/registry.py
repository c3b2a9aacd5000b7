"""The registry of pipelines: built-in names, or any importable module that follows the contract."""

from __future__ import annotations

import importlib
from functools import lru_cache

from shared_logic.errors import PipelineDefinitionError, UnknownNameError
from shared_logic.pipeline import Pipeline

#: Built-in pipelines by name. They are ordinary pipeline modules, loaded like a user's.
BUILTIN_PIPELINES: dict[str, str] = {
    "wordcount": "shared_logic.pipelines.wordcount",
    "payments": "shared_logic.pipelines.payments",
}


@lru_cache(maxsize=None)
def load_pipeline(name: str) -> Pipeline:
    """The pipeline called ``name`` (a built-in) or exposed as ``pipeline`` by the module ``name``.

    Raises UnknownNameError (listing the built-ins) when ``name`` is neither, and
    PipelineDefinitionError when the module does not follow the contract.
    """
    module_path = BUILTIN_PIPELINES.get(name, name)
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as e:
        if e.name and module_path.startswith(e.name):
            raise UnknownNameError("pipeline", name, [*BUILTIN_PIPELINES, "or a dotted module path on PYTHONPATH"]) from e
        raise
    pipeline = getattr(module, "pipeline", None)
    if not isinstance(pipeline, Pipeline):
        raise PipelineDefinitionError(
            f"module {module_path!r} must define `pipeline = <YourPipeline>()`, an instance of "
            f"shared_logic.Pipeline; found {type(pipeline).__name__}"
        )
    return pipeline
