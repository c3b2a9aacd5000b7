"""The registry of pipelines: built-in names, or any importable module that follows the contract.

The pipeline search path is the same for every command: installed packages and ``PYTHONPATH``
first, then the current folder (``./clicks.py`` is the pipeline ``clicks``, ``./shop/clicks.py``
is ``shop.clicks``). The current folder only provides the pipeline's own top-level module or
package, so a folder that happens to hold, say, a ``deploy/`` package never shadows the platform.
Once a user's module is loaded, the folder it came from is appended to ``PYTHONPATH``, so every
Python process started afterwards (the command's children, Spark's Python workers) finds it too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import sysconfig
import traceback
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

from shared_logic.errors import PipelineDefinitionError, PipelineModuleError, UnknownPipelineError
from shared_logic.pipeline import Pipeline

#: Built-in pipelines by name. They are ordinary pipeline modules, loaded like a user's.
BUILTIN_PIPELINES: dict[str, str] = {
    "wordcount": "shared_logic.pipelines.wordcount",
    "payments": "shared_logic.pipelines.payments",
}


@cache
def load_pipeline(name: str) -> Pipeline:
    """The pipeline called ``name`` (a built-in) or exposed as ``pipeline`` by the module ``name``.

    Raises UnknownPipelineError (listing the built-ins and the search path) when ``name`` is
    neither, PipelineModuleError (module, file, line, error) when the module fails to import, and
    PipelineDefinitionError when it does not follow the contract.
    """
    module_path = BUILTIN_PIPELINES.get(name, name)
    module = importlib.import_module(module_path) if name in BUILTIN_PIPELINES else _import(module_path, Path.cwd())
    pipeline = getattr(module, "pipeline", None)
    if not isinstance(pipeline, Pipeline):
        raise PipelineDefinitionError(
            f"module {module_path!r} ({getattr(module, '__file__', None) or 'no file'}) must define "
            f"`pipeline = YourPipeline()`, an instance of shared_logic.Pipeline; "
            + ("it defines no `pipeline`" if pipeline is None else f"its `pipeline` is a {type(pipeline).__name__}")
        )
    if name not in BUILTIN_PIPELINES:
        _export_to_children(module, module_path)
    return pipeline


def search_path(folder: Path) -> list[str]:
    """Where a pipeline module is looked for, in order (for messages)."""
    return ["installed packages and PYTHONPATH", f"the current folder {folder}"]


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Finds exactly one top-level module or package in one folder, after every other finder."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name, self.folder = name, folder

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.folder)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FolderFinder) and (self.name, self.folder) == (other.name, other.folder)

    def __hash__(self) -> int:
        return hash((self.name, self.folder))


def _import(module_path: str, folder: Path) -> ModuleType:
    top = module_path.partition(".")[0]
    finder = _FolderFinder(top, folder)
    if finder not in sys.meta_path:
        sys.meta_path.append(finder)  # last: anything importable otherwise wins
    try:
        return importlib.import_module(module_path)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_path == e.name or module_path.startswith(e.name + ".")):
            raise UnknownPipelineError(module_path, list(BUILTIN_PIPELINES), search_path(folder)) from None
        raise _module_error(module_path, e) from e
    except Exception as e:
        raise _module_error(module_path, e) from e


def _module_error(module_path: str, error: Exception) -> PipelineModuleError:
    """Where importing ``module_path`` failed: the innermost line of the user's own files (the module,
    or its package's folder), else the innermost line at all."""
    if isinstance(error, SyntaxError) and error.filename:
        return PipelineModuleError(module_path, error.filename, error.lineno, error)
    machinery = (Path(__file__).resolve(), Path(importlib.__file__).resolve().parent)
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<") and not any(_within(Path(f.filename), m) for m in machinery)]
    if not frames:
        return PipelineModuleError(module_path, None, None, error)
    first = Path(frames[0].filename)  # the module (or package __init__) whose import raised
    own = [f for f in frames if (Path(f.filename).is_relative_to(first.parent) if first.name == "__init__.py"
                                 else Path(f.filename) == first)]
    frame = (own or frames)[-1]
    return PipelineModuleError(module_path, frame.filename, frame.lineno, error)


def _within(file: Path, place: Path) -> bool:
    file = file.resolve()
    return file == place or file.is_relative_to(place) if place.is_dir() else file == place


def _export_to_children(module: ModuleType, module_path: str) -> None:
    """Append the folder ``module_path`` was imported from to ``PYTHONPATH`` (children, Spark workers)."""
    file = getattr(module, "__file__", None)
    if not file:
        return
    root = Path(file).resolve().parents[module_path.count(".")]
    if Path(file).name == "__init__.py":
        root = root.parent
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if str(root) not in entries and str(root) not in installed:
        os.environ["PYTHONPATH"] = os.pathsep.join([*entries, str(root)])
