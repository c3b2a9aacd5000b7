"""What a read of the serving store returns (``serving.store.reader``): the generation it met and the raw parts."""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.store.errors import StoreUnavailableError
from serving.store.generation_meta import GenerationMeta, MetaHeader
from serving.store.keys import Keys, suffix
from serving.store.replies import text

#: A bucket's realtime rows up to which a top-N reads them all rather than merging by a threshold:
#: reading about n of each list costs more calls than reading a small segment whole (about break-even
#: at 1,000 rows for top-10 in benchmarks/top_merge_bench.py).
SMALL_SEGMENT = 1_000


@dataclass(frozen=True)
class Generation:
    """The served batch generation (its master version) and what the speed layer added to it."""

    generation: int
    computed_at: float | None
    run_id: str | None
    events: int | None
    processed: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    #: The logic fingerprint it was computed under (``shared_logic.logic``); '' when published before it was recorded.
    logic: str = ""

    @property
    def version(self) -> int:
        """The master version answers are exact for: the generation, or what the speed layer applied after it."""
        return max(self.generation, self.processed or -1)

    @classmethod
    def from_header(cls, generation: bytes | str, processed: bytes | str, header: MetaHeader) -> Generation:
        """From a read script's reply: the pointer, the segment's ``processed`` ('' = none) and the record's header."""
        return cls(
            int(generation),
            float(header.computed_at) if header.computed_at else None,
            text(header.run_id) if header.run_id else None,
            int(header.events) if header.events else None,
            int(processed) if processed else None,
            logic=text(header.logic) if header.logic else "",
        )

    @classmethod
    def from_meta(cls, generation: int, processed: bytes | str | None, meta: GenerationMeta) -> Generation:
        """From the generation's whole record, with its rows per view."""
        return cls(generation, meta.computed_at, meta.run_id, meta.events, int(processed) if processed else None,
                   dict(meta.rows), meta.logic)


def definition_changed(view: str, served: Generation) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"view {view!r} is defined differently in the served batch generation {served.generation} (computed under "
        f"logic {served.logic or 'unrecorded'}) than in the pipeline code this API runs: it is served once a batch "
        "run under this code is (the scheduler starts one when it sees the change)", retry_after=30)


def not_in_generation(view: str, served: Generation) -> StoreUnavailableError:
    """A view the served generation does not hold: one added to the pipeline since it was computed."""
    return StoreUnavailableError(
        f"view {view!r} is not in the served batch generation {served.generation} (computed under logic "
        f"{served.logic or 'unrecorded'}, before the view was added): it is served once a batch run under the "
        "current pipeline code is (the scheduler starts one when it sees the change)", retry_after=30)


@dataclass(frozen=True)
class KeyRead:
    """Raw parts of one read, per item (key in a window): batch and realtime scalars and distinct counts."""

    generation: Generation
    batch: list[dict[str, float | None]]
    realtime: list[dict[str, float | None]]
    distinct_batch: list[dict[str, int]]
    distinct_realtime: list[dict[str, int]]
    distinct_merged: list[dict[str, int]]
    distinct_total: dict[str, int]


@dataclass(frozen=True)
class TopRead:
    generation: Generation
    batch: dict[str, float]
    realtime: dict[str, float]


@dataclass(frozen=True)
class RangeTopRead:
    """Candidates of a top-N over several panes: per key, its part in each ranked list, pane by pane
    (batch, then realtime; None: no part), in the order ``RANGE_TOP`` merged them."""

    generation: Generation
    parts: dict[str, list[float | None]]


@dataclass(frozen=True)
class PaneKeys:
    """One pane's candidates in a key listing (``ServingStore.list_keys``): its first batch keys after the
    listing's lower bound (at most the listing's ``each``: when as many came back there may be more) and every
    realtime key with the prefix (keys are bytes: their order is Redis's, bytewise)."""

    batch: list[bytes]
    realtime: list[bytes]


@dataclass(frozen=True)
class KeyListing:
    """One bucket's candidates for a page of keys, every pane asked, at the version ``generation`` names."""

    generation: Generation
    each: int
    panes: list[PaneKeys]

    def listed(self) -> set[bytes]:
        """Every key some pane listed."""
        return {k for pane in self.panes for k in (*pane.batch, *pane.realtime)}

    def complete_to(self) -> bytes | None:
        """The key up to which (inclusive) these are all the bucket's keys in the bound (None: all of them):
        the least last key of the panes that gave ``each`` batch keys (each may hold more after it)."""
        full = [pane.batch[-1] for pane in self.panes if pane.batch and len(pane.batch) >= self.each]
        return min(full) if full else None


@dataclass(frozen=True)
class TopAsk:
    """What a top-N asks each bucket (``TOP`` in ``serving.store.read_scripts``)."""

    view: str
    measure: str
    window_start: int | None
    n: int
    combines: str

    def args(self, bucket: Keys, ranked: str = "") -> list:
        return [bucket.prefix, self.view, self.measure, suffix(self.window_start), self.n, ranked, self.combines,
                SMALL_SEGMENT]

    @staticmethod
    def candidates(replies: list[list]) -> tuple[dict[str, float], dict[str, float]]:
        """The buckets' candidates (``TOP`` replies): batch parts and realtime parts, by key."""
        batch: dict[str, float] = {}
        rt: dict[str, float] = {}
        for _, _, _, top, realtime, under in replies:
            batch.update({top[i].decode(): float(top[i + 1]) for i in range(0, len(top), 2)})
            members = [realtime[i].decode() for i in range(0, len(realtime), 2)]
            batch.update({m: float(s) for m, s in zip(members, under) if s not in (b"", "")})
            rt.update({members[i // 2]: float(realtime[i + 1]) for i in range(0, len(realtime), 2)})
        return batch, rt


@dataclass(frozen=True)
class RangeTopAsk:
    """What a top-N over several panes asks each bucket (``RANGE_TOP`` in ``serving.store.read_scripts``)."""

    view: str
    measure: str
    window_starts: tuple[int, ...]
    n: int
    combines: str

    def args(self, bucket: Keys, ranked: str, built: frozenset[int], budget: int, state: bytes | str,
             token: str) -> list:
        """The call's arguments; ``built``: the panes whose ranking was just built for generation ``ranked``;
        ``budget``: the call's work at most; ``state``: where the last call stopped ('' = start); ``token``: the
        answer's own name for its scratch key."""
        if self.n < 1:
            raise ValueError(f"a top-N asks for at least one key, not n={self.n}")
        panes: list = []
        for start in self.window_starts:
            panes += [suffix(start), "1" if start in built else ""]
        return [bucket.prefix, self.view, self.measure, self.n, self.combines, ranked, len(self.window_starts), *panes,
                budget, state, token]

    def candidates(self, flat: list) -> dict[str, list[float | None]]:
        """A bucket's candidates (key, then a part per list, '' = none) by key."""
        width = 1 + 2 * len(self.window_starts)
        return {flat[i].decode(): [float(v) if v not in (b"", "") else None for v in flat[i + 1:i + width]]
                for i in range(0, len(flat), width)}
