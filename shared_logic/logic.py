"""A pipeline's logic version: a fingerprint of everything that decides its answers.

Two processes agree on the answers a pipeline gives exactly when they agree on its fingerprint:
the event schema (fields, types, the event-time field), the views (names, keys, windows, measures,
derived values), the source of the module defining the pipeline (its transform), and the
``logic_version`` string a user bumps for changes the source does not show (a library upgrade, a
helper module). Whitespace or a comment in the module changes it too: a needless recompute is
cheap, a missed one serves wrong answers.

The batch layer records it in each generation, the speed layer in each realtime segment it writes
(``serving.store.logic``); readers never combine parts of two fingerprints. ``pin_code`` makes the
fingerprint true on Spark's executors too: they run the module's functions (UDFs) as this process
imported them, never a newer file on disk.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from collections.abc import Sequence

#: Hex digits kept: short enough to read in a status line, long enough never to collide by chance.
_DIGITS = 12


def logic_fingerprint(*, module: str, schema: str, event_time_field: str | None, views: Sequence[object],
                      logic_version: str, event_id: str | None = None) -> str:
    """The fingerprint (hex) of a pipeline defined in ``module`` with these parts; the same in every process
    that loads the same code (``Pipeline.logic`` passes its own)."""
    loaded = sys.modules.get(module)
    try:
        source = inspect.getsource(loaded) if loaded is not None else ""
    except (OSError, TypeError):  # no source file (a frozen or interactive module): the definitions still count
        source = ""
    parts = {
        "schema": schema,
        "event_time_field": event_time_field,
        "views": [repr(view) for view in views],
        "source": source,
        "logic_version": logic_version,
    }
    if event_id is not None:  # only when declared: the fingerprints of pipelines without one stay as they were
        parts["event_id"] = event_id
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()
    return digest[:_DIGITS]


def pin_code(module: str) -> None:
    """Ship ``module``'s functions to Spark's Python workers by value (cloudpickle), not by name.

    By name, a worker imports the module itself: after an edit, the file's new code, while this
    process and its fingerprint still hold the old one (a worker started later, or one on another
    machine with a newer copy), and its answers would be labelled with the wrong logic."""
    loaded = sys.modules.get(module)
    if loaded is None or module == "__main__":  # __main__ is always pickled by value
        return
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(loaded)
