"""The record of a published batch generation (``Keys.meta``): the only place its field names are spelled.

The batch run writes it with the flip (``serving.store.generations``), in the same atomic call that
serves the generation, and nothing changes it afterwards; readers take it whole (``from_hash``) or,
in a read script, the fields of one view (``LUA_META``, ``MetaHeader``). Lua twins are generated
from the Python names, so the two cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from redis.typing import EncodableT

from serving.store.replies import HashReply, text_hash

RUN_ID, COMPUTED_AT, EVENTS, LOGIC, VERSION, PUBLISHED_AT = (
    "run_id", "computed_at", "events", "logic", "version", "published_at")
_ROWS, _MEASURES, _INTEGRAL, _VIEW = "rows:", "measures:", "integral:", "view:"


def measures_field(view: str) -> str:
    """The field holding ``view``'s row layout: the order of a row's parts (a JSON list)."""
    return _MEASURES + view


def integral_field(view: str) -> str:
    """The field holding ``view``'s measures whose values are integers (a JSON list)."""
    return _INTEGRAL + view


#: The Lua twins: ``meta_header(view)`` returns the fields a read script takes (``MetaHeader``'s order, for
#: ``HMGET``); ``META_VERSION`` is set once a generation is published, ``META_LOGIC`` names its logic.
LUA_META = f"""
local function meta_header(view) return '{COMPUTED_AT}', '{RUN_ID}', '{EVENTS}', '{LOGIC}', '{_MEASURES}' .. view, '{_VIEW}' .. view end
local META_VERSION, META_LOGIC = '{VERSION}', '{LOGIC}'
"""


class MetaHeader(NamedTuple):
    """What a read script takes from a generation's record for one view (``meta_header``), as Redis answers."""

    computed_at: bytes | str | None
    run_id: bytes | str | None
    events: bytes | str | None
    logic: bytes | str | None
    #: The view's row layout (``measures_field``); None: the generation does not hold the view.
    layout: bytes | str | None
    #: The view's definition (``repr``) the generation was computed with; None: not recorded.
    definition: bytes | str | None


def header_fields(view: str) -> tuple[str, ...]:
    """The fields of ``MetaHeader`` for ``view``, in its order (what ``meta_header`` returns in Lua)."""
    return COMPUTED_AT, RUN_ID, EVENTS, LOGIC, measures_field(view), _VIEW + view


@dataclass(frozen=True)
class GenerationMeta:
    """One generation's record. Every field is optional: a missing one is not written, and reads as its default."""

    run_id: str | None = None
    computed_at: float | None = None
    #: Events in the snapshot the generation was computed from.
    events: int | None = None
    #: The logic fingerprint it was computed under (``shared_logic.logic``); '' when not recorded.
    logic: str = ""
    #: Per view: rows published.
    rows: Mapping[str, int] = field(default_factory=dict)
    #: Per view: the order of a batch row's parts (``serving.store.keys.row_parts``).
    measures: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: Per view: the scalar measures whose values are integers.
    integral: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: Per view: its definition (``repr``) in the code that computed it.
    views: Mapping[str, str] = field(default_factory=dict)
    #: The generation (its master version), written by the flip: present means published.
    version: int | None = None
    #: When it was flipped in (epoch seconds).
    published_at: float | None = None

    def to_hash(self) -> dict[str, EncodableT]:
        """The hash to write: numbers as they are, lists as JSON; missing fields left out."""
        ordered: list[tuple[str, EncodableT | None]] = [
            (RUN_ID, self.run_id), (COMPUTED_AT, self.computed_at), (EVENTS, self.events), (LOGIC, self.logic or None),
            *((_ROWS + view, n) for view, n in self.rows.items()),
            *((measures_field(view), json.dumps(list(parts))) for view, parts in self.measures.items()),
            *((integral_field(view), json.dumps(list(parts))) for view, parts in self.integral.items()),
            *((_VIEW + view, definition) for view, definition in self.views.items()),
            (VERSION, self.version), (PUBLISHED_AT, self.published_at),
        ]
        return {name: value for name, value in ordered if value is not None}

    @classmethod
    def from_hash(cls, values: HashReply) -> GenerationMeta:
        """From ``HGETALL Keys.meta(G)`` (bytes or decoded); fields it does not know are ignored."""
        fields = text_hash(values)

        def per_view(prefix: str) -> dict[str, str]:
            return {name.removeprefix(prefix): value for name, value in fields.items() if name.startswith(prefix)}

        return cls(
            run_id=fields.get(RUN_ID) or None,
            computed_at=float(fields[COMPUTED_AT]) if fields.get(COMPUTED_AT) else None,
            events=int(fields[EVENTS]) if fields.get(EVENTS) else None,
            logic=fields.get(LOGIC, ""),
            rows={view: int(n) for view, n in per_view(_ROWS).items()},
            measures={view: json.loads(parts) for view, parts in per_view(_MEASURES).items()},
            integral={view: json.loads(parts) for view, parts in per_view(_INTEGRAL).items()},
            views=per_view(_VIEW),
            version=int(fields[VERSION]) if fields.get(VERSION) else None,
            published_at=float(fields[PUBLISHED_AT]) if fields.get(PUBLISHED_AT) else None,
        )
