"""The body of a key-listing cursor (``serving.api.key_pages``), read strictly.

A cursor is urlsafe base64 (unpadded) of a JSON object that ``key_pages.encode_cursor`` writes:
``f`` the filters' fingerprint (text), ``w`` the first pane's start (an integer, or null for all time),
``t`` the kind of position (always 0: at key ``k``; 1, after a window's last key, was written while a
listing walked its panes one after another, and is no longer), ``k`` the
key (urlsafe base64 of its UTF-8 bytes), ``g`` the generation the page was read at (an integer from
0), ``l`` the logic it was computed under (text; absent in cursors made before it was recorded,
read as unrecorded logic: ``key_pages`` answers those 409, start over), ``n`` the panes of a range whose
times were relative (an integer from 1; absent otherwise): with ``w``, the range the listing resolved on its
first page, which every later page reuses (``key_pages.Listing.relative``).
Anything else (another field, another type, a key that is not base64 of UTF-8, a character outside
the base64 alphabet) is not a cursor this route made: ``cursor_fields`` raises ValueError.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

_FIELDS = frozenset({"f", "w", "t", "k", "g", "l", "n"})
_REQUIRED = _FIELDS - {"l", "n"}


def _unbase64(text: str) -> bytes:
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except binascii.Error as e:
        raise ValueError(f"not urlsafe base64: {e}") from e


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool


def cursor_fields(cursor: str) -> tuple[str, int | None, int, bytes, int, str, int | None]:
    """(fingerprint, window start, kind, key, generation, logic, panes) of ``cursor``; ValueError unless it is
    exactly what a cursor holds."""
    try:
        body = json.loads(_unbase64(cursor))
    except RecursionError as e:  # arrays nested thousands deep: no cursor
        raise ValueError("not a cursor's JSON") from e
    if not isinstance(body, dict) or not _REQUIRED <= body.keys() <= _FIELDS:
        raise ValueError("not the fields of a cursor")
    fingerprint, window, kind, generation, logic, text = (body["f"], body["w"], body["t"], body["g"],
                                                         body.get("l", ""), body["k"])
    if not (isinstance(fingerprint, str) and _is_int(kind) and kind == 0 and (window is None or _is_int(window))
            and _is_int(generation) and generation >= 0 and isinstance(logic, str) and isinstance(text, str)):
        raise ValueError("a field of the wrong type or value")
    panes = body.get("n")
    if panes is not None and not (_is_int(panes) and panes >= 1 and _is_int(window)):
        raise ValueError("a field of the wrong type or value")
    key = _unbase64(text)
    key.decode()  # a key is UTF-8 text (UnicodeDecodeError is a ValueError)
    return fingerprint, window, kind, key, generation, logic, panes
