"""A view's rows as a stream: ``GET /v1/views/{view}/keys`` with ``Accept: text/csv`` or ``application/x-ndjson``.

The stream pages through the view internally (``serving.api.key_pages``, ``MAX_LIMIT`` rows a
page) with the filters of the request, from its ``cursor`` if one is given; ``limit`` does not
apply. It holds what paging holds (every row once, each page at one version), so it equals the
concatenation of the pages; it is not one snapshot: pages read after a flip or a micro-batch
commit are at the newer version. The first page is read before the answer starts, so its errors
answer with their status; if a later page fails (Redis went away), the stream stops without its
end (the chunked body is cut), so a client never takes a partial export for a whole one.

* CSV: a header row (the key columns, ``window_start`` for windowed views, then the measures and
  derived values), one row per key (``window_start``: the first pane its row combines, ISO 8601); empty
  cells for nulls, and
  ``overflow`` for a sum beyond what a double holds (``shared_logic.measures.OVERFLOW``: never ``inf``).
* NDJSON: one JSON object per line, each a ``KeyEntry`` as a page lists it, in UTF-8 with every
  character as is except U+0085, U+2028 and U+2029, written as JSON escapes (``\u2028``): JSON
  allows them raw, but a reader that splits lines on every Unicode line break (Python's
  ``str.splitlines``) would cut a row in two. So the only line breaks in the stream are the ``\n``
  ending each row. (CSV has no escapes: a cell holds such characters as they are, quoted only
  when it holds a comma, a quote or ``\r``/``\n``; read CSV with a CSV reader.)
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from serving.api.key_pages import Listing, every_page
from serving.api.models import KeyEntry
from serving.store.keys import decode_key
from serving.store.reader import ServingStore
from shared_logic.measures import OVERFLOW, overflowed

CSV, NDJSON = "text/csv", "application/x-ndjson"
FORMATS = (CSV, NDJSON)


def export_format(accept: str | None) -> str | None:
    """The export format an ``Accept`` header asks for (the first one it names without q=0), or None for JSON."""
    for part in (accept or "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.lower() in FORMATS and not any(p.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params):
            return media.lower()
    return None


def _cell(value: Any) -> Any:
    """A CSV cell: '' for null, ``OVERFLOW`` for an overflowed sum (answers carry it already; a number that is
    not finite never reaches a cell)."""
    return "" if value is None else OVERFLOW if overflowed(value) else value


def csv_header(listing: Listing) -> list[str]:
    view = listing.view
    return [*view.keys, *(["window_start"] if view.window else []), *(m.name for m in view.measures),
            *(d.name for d in view.derived)]


def csv_row(listing: Listing, entry: KeyEntry) -> list[Any]:
    view = listing.view
    window = [entry.window.start.isoformat().replace("+00:00", "Z")] if view.window and entry.window else []
    names = csv_header(listing)[len(view.keys) + len(window):]
    return [*decode_key(entry.key, len(view.keys)), *window, *(_cell(entry.value.get(n)) for n in names)]


#: Unicode line breaks JSON leaves raw (control characters below U+0020 are escaped already), as JSON escapes.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def ndjson_lines(entries: list[KeyEntry]) -> str:
    """``entries`` as NDJSON: one JSON object a line, no line break inside one (see the module doc)."""
    text = "".join(json.dumps(e.model_dump(mode="json"), ensure_ascii=False) + "\n" for e in entries)
    for raw, escaped in _LINE_BREAKS.items():
        if raw in text:  # only inside JSON strings: outside them JSON has no such character
            text = text.replace(raw, escaped)
    return text


async def export(store: ServingStore, listing: Listing, cursor: str | None, media: str) -> StreamingResponse:
    pages = await every_page(store, listing, cursor)

    async def lines() -> AsyncIterator[str]:
        if media == CSV:
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\r\n")
            writer.writerow(csv_header(listing))
            async for entries in pages:
                for entry in entries:
                    writer.writerow(csv_row(listing, entry))
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
        else:
            async for entries in pages:
                yield ndjson_lines(entries)

    media_type = f"{CSV}; charset=utf-8" if media == CSV else NDJSON
    return StreamingResponse(lines(), media_type=media_type)
