"""``ServingStore``'s memory of checked replies never changes a verdict.

A read's reply parts (pointer, realtime version, the generation's metadata) are checked once (the
view is in the generation, recorded under this API's definition) and remembered. The oracle is the
check itself: the same parts under another definition, a definition missing from the generation,
or a generation whose recorded definition differs must still be refused, whatever was remembered.
No Redis is involved: the replies are built here as the Lua scripts return them.
"""

from __future__ import annotations

import pytest

from serving.store.errors import StoreUnavailableError
from serving.store.reader import ServingStore

LAYOUT = b'["count"]'


def _meta(definition: bytes | None, layout: bytes | None = LAYOUT) -> list[bytes | None]:
    """HEADER's metadata of a generation: computed_at, run_id, events, logic, layout, definition."""
    return [b"1700000000.5", b"run1", b"10", b"logic1", layout, definition]


def test_a_remembered_reply_is_checked_again_under_another_definition() -> None:
    store = ServingStore("redis://127.0.0.1:1/0", "wordcount", {"v": "View(A)"})
    served = store.served("v", b"3", b"5", _meta(b"View(A)"))
    assert (served.generation, served.processed, served.version, served.run_id) == (3, 5, 5, "run1")
    store.definitions = {"v": "View(B)"}
    with pytest.raises(StoreUnavailableError, match="defined differently"):
        store.served("v", b"3", b"5", _meta(b"View(A)"))


def test_refused_replies_stay_refused() -> None:
    store = ServingStore("redis://127.0.0.1:1/0", "wordcount", {"v": "View(A)"})
    for _ in range(2):
        with pytest.raises(StoreUnavailableError, match="defined differently"):
            store.served("v", b"3", b"", _meta(b"View(B)"))
        with pytest.raises(StoreUnavailableError, match="not in the served batch generation"):
            store.served("v", b"3", b"", _meta(b"View(A)", layout=None))


def test_every_reply_part_is_its_own_entry() -> None:
    store = ServingStore("redis://127.0.0.1:1/0", "wordcount", {"v": "View(A)"})
    first = store.served("v", b"3", b"", _meta(b"View(A)"))
    later = store.served("v", b"3", b"7", _meta(b"View(A)"))
    assert (first.version, later.version) == (3, 7)
    other_run = _meta(b"View(A)")
    other_run[1] = b"run2"  # the same generation republished (after Redis lost its data)
    assert store.served("v", b"3", b"7", other_run).run_id == "run2"
    with pytest.raises(StoreUnavailableError, match="older than version 7"):
        store.served("v", b"3", b"", _meta(b"View(A)"))  # remembered, and still never older than answered
