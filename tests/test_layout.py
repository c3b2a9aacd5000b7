"""The tests' layout: shared helpers live in ``tests/support/``, so no test module imports another test
module (``tests.<...>.test_*``) or a conftest (fixtures reach tests through pytest, not through imports).

Every ``tests/**/*.py`` is parsed with ``ast`` (nothing is imported or run); relative imports are resolved
against the file's own package. A failure names each offending import as ``file:line``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _forbidden(module: str) -> bool:
    """A test module (``test_*``) or a conftest, anywhere under ``tests``; or a bare ``conftest``."""
    parts = module.split(".")
    if "conftest" in parts:
        return True
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts[1:])


def _package(path: Path) -> list[str]:
    """The dotted package ``path`` (a file under the project root) belongs to."""
    return list(path.relative_to(ROOT).with_suffix("").parts[:-1])


def _imported(tree: ast.AST, package: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line, modules) for every ``import``/``from ... import`` statement: the modules it may name, ``from a
    import b`` giving both ``a`` and ``a.b`` (``b`` may be a module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, [alias.name]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level <= len(package) + 1 else []
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names = [f"{module}.{alias.name}" if module else alias.name for alias in node.names if alias.name != "*"]
            yield node.lineno, [module, *names] if module else names


def offending_imports(source: str, path: Path) -> list[str]:
    """``file:line: imports <module>`` for each import of a test module or a conftest in ``source``."""
    tree = ast.parse(source, filename=str(path))
    where = path.relative_to(ROOT)
    found = []
    for line, modules in _imported(tree, _package(path)):
        bad = next((module for module in modules if _forbidden(module)), None)
        if bad is not None:
            found.append(f"{where}:{line}: imports {bad}")
    return sorted(found, key=lambda hit: int(hit.split(":")[1]))


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    found = [hit for path in sorted(TESTS.rglob("*.py")) for hit in offending_imports(path.read_text(), path)]
    assert not found, ("shared test helpers belong in tests/support/ (CONTRIBUTING.md); these import a test "
                       "module or a conftest:\n" + "\n".join(found))


@pytest.mark.parametrize(("source", "caught"), [
    ("from tests.serving.api.test_metrics import scrape", True),
    ("import tests.speed_layer.test_exactness", True),
    ("from tests.serving.api import test_metrics", True),
    ("from .test_metrics import scrape", True),
    ("from . import conftest", True),
    ("from tests.object_store.conftest import SECRET", True),
    ("from tests.conftest import make_settings", True),
    ("import conftest", True),
    ("from conftest import x", True),
    ("from tests.support import wait_for", False),
    ("from tests.support.metrics import scrape", False),
    ("from tests import oracle", False),
    ("from serving.store.keys import Keys", False),
    ("from . import metrics", False),
])
def test_the_check_catches_each_spelling(source: str, caught: bool) -> None:
    path = TESTS / "serving" / "api" / "test_example.py"
    assert bool(offending_imports(source, path)) == caught, offending_imports(source, path)
