"""View definitions and the one aggregation both layers run.

A view groups the transformed rows by its key columns (and, for a windowed view, by an event-time
pane) and computes monoid measures per group. The batch layer runs ``aggregate``
over a snapshot; the speed layer runs the very same function over each micro-batch, and the
serving layer combines the two parts with each measure's monoid.

**Windows are panes.** A windowed view stores one row per key and *pane*: a tumbling window is its
own pane; a sliding (hopping) window of ``size`` every ``slide`` is stored as panes of ``slide``
and answered by combining the ``size / slide`` panes it covers with each measure's monoid. So an
event is stored once (not ``size / slide`` times), both layers compute panes exactly as they compute
tumbling windows, and a sliding window's answer is exact for the same reason any merged answer is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shared_logic.errors import PipelineDefinitionError, UnknownNameError
from shared_logic.measures import Derived, Distinct, Measure
from shared_logic.session_parts import check_session_inputs, encode_part, part_of_events
from shared_logic.sessions import SESSION_FIELDS, SESSIONS_COLUMN, SessionWindow, check_session_measures

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
#: The column holding a session view's event times as epoch microseconds on their way to ``part_of_events``
#: (a key or measure column of that name is refused).
_SESSION_TIME = "__session_micros"
#: Column holding a windowed row's pane start (UTC timestamp) in gold tables.
WINDOW_START = "window_start"
#: Most panes one sliding window may cover (``size / slide``): a window is read by combining its panes.
MAX_PANES_PER_WINDOW = 1_440


def _whole_seconds(what: str, value: timedelta) -> int:
    seconds = value.total_seconds()
    if seconds < 1 or seconds != int(seconds):
        raise PipelineDefinitionError(f"window {what} must be a whole number of seconds >= 1, got {value}")
    return int(seconds)


@dataclass(frozen=True)
class TumblingWindow:
    """Fixed, non-overlapping event-time windows ``[start, start + size)`` aligned to the Unix epoch (UTC)."""

    size: timedelta
    time_column: str = "event_time"

    def __post_init__(self) -> None:
        _whole_seconds("size", self.size)

    @property
    def seconds(self) -> int:
        return int(self.size.total_seconds())

    @property
    def pane_seconds(self) -> int:
        """The stored pane: the window itself."""
        return self.seconds

    @property
    def panes(self) -> int:
        """Panes one window covers."""
        return 1

    def start_of(self, epoch_seconds: float) -> int:
        """The start (epoch seconds) of the window holding ``epoch_seconds``."""
        return int(epoch_seconds // self.seconds) * self.seconds

    def column(self) -> Column:
        return _pane_column(self.time_column, self.seconds)


@dataclass(frozen=True)
class SlidingWindow:
    """Overlapping event-time windows ``[start, start + size)``, one starting every ``slide`` (aligned to the
    Unix epoch, UTC), ``size`` a whole multiple of ``slide``. Stored as panes of ``slide`` (an event in one
    pane, once); a window is answered by combining its ``size / slide`` panes."""

    size: timedelta
    slide: timedelta
    time_column: str = "event_time"

    def __post_init__(self) -> None:
        size, slide = _whole_seconds("size", self.size), _whole_seconds("slide", self.slide)
        if size < slide:
            raise PipelineDefinitionError(
                f"SlidingWindow size {self.size} is shorter than its slide {self.slide}: windows would leave events "
                f"out; make the size a whole multiple of the slide ({timedelta(seconds=2 * slide)}, ...)")
        if size == slide:
            raise PipelineDefinitionError(
                f"SlidingWindow size {self.size} equals its slide: windows that do not overlap are tumbling; "
                f"write TumblingWindow(timedelta(seconds={size}))")
        if size % slide:
            near = [str(timedelta(seconds=k * slide)) for k in (size // slide, size // slide + 1) if k > 1]
            raise PipelineDefinitionError(
                f"SlidingWindow size {self.size} is not a whole multiple of its slide {self.slide} (a window is "
                f"stored as panes of the slide): make the size {' or '.join(near)}, or pick a slide that divides it")
        if size // slide > MAX_PANES_PER_WINDOW:
            raise PipelineDefinitionError(
                f"SlidingWindow of {self.size} every {self.slide} covers {size // slide} panes, more than the "
                f"{MAX_PANES_PER_WINDOW} one window may combine; make the slide at least "
                f"{timedelta(seconds=-(-size // MAX_PANES_PER_WINDOW))}")

    @property
    def seconds(self) -> int:
        """The window's size in seconds."""
        return int(self.size.total_seconds())

    @property
    def pane_seconds(self) -> int:
        """The stored pane: the slide."""
        return int(self.slide.total_seconds())

    @property
    def panes(self) -> int:
        """Panes one window covers: ``size / slide``."""
        return self.seconds // self.pane_seconds

    def start_of(self, epoch_seconds: float) -> int:
        """The start (epoch seconds) of the pane holding ``epoch_seconds``."""
        return int(epoch_seconds // self.pane_seconds) * self.pane_seconds

    def column(self) -> Column:
        return _pane_column(self.time_column, self.pane_seconds)


#: A view's window: its rows are panes (see the module docstring).
Window = TumblingWindow | SlidingWindow


def _pane_column(time_column: str, seconds: int) -> Column:
    """The pane start of each row: Spark's tumbling window of ``seconds`` over ``time_column``."""
    return F.window(F.col(time_column), f"{seconds} seconds").start.alias(WINDOW_START)


@dataclass(frozen=True, init=False)
class View:
    """A named view: key columns, an optional window (tumbling or sliding), monoid measures, derived values.

    Guarantee: for any split of the input rows into parts, combining each part's ``aggregate``
    with the measures' monoids gives the ``aggregate`` of all rows. That is what makes the merged
    batch + realtime answer exact.

    A *session view* (``sessions=SessionWindow(gap)``; the constructor takes ``window=SessionWindow(gap)`` as the
    same) keeps each key's sessions instead (``shared_logic.sessions``): one row per key, its part encoded in
    ``SESSIONS_COLUMN``, merged with the one session merge instead of a monoid. Its ``window`` is None (it
    has no panes).
    """

    name: str
    keys: tuple[str, ...]
    measures: tuple[Measure, ...]
    #: Its pane window; None: all time, or a session view (no panes).
    window: Window | None
    derived: tuple[Derived, ...]
    description: str
    #: A session view's SessionWindow; None for every other view.
    sessions: SessionWindow | None
    _by_name: dict[str, Measure] = field(init=False, repr=False, compare=False)

    def __init__(self, name: str, keys: Sequence[str], measures: Sequence[Measure],
                 window: Window | SessionWindow | None = None, derived: Sequence[Derived] = (),
                 description: str = "", sessions: SessionWindow | None = None) -> None:
        """Build a view and check it (PipelineDefinitionError naming the fix). ``window=SessionWindow(...)`` declares
        a session view as ``sessions=`` does: each field is set once, here, to what the built view holds."""
        if isinstance(window, SessionWindow):
            if sessions is not None:
                raise PipelineDefinitionError(f"view {name!r}: give its SessionWindow once (sessions=...)")
            window, sessions = None, window
        measures = tuple(measures)
        built = {"name": name, "keys": tuple(keys), "measures": measures, "window": window,
                 "derived": tuple(derived), "description": description, "sessions": sessions,
                 "_by_name": {m.name: m for m in measures}}
        for attribute, value in built.items():  # frozen: set as a dataclass's own __init__ sets them
            object.__setattr__(self, attribute, value)
        self._check()

    def _check(self) -> None:
        if not _NAME.match(self.name):
            raise PipelineDefinitionError(
                f"view name {self.name!r} must be lower-case letters, digits and '_', starting with a letter"
            )
        if not self.keys:
            raise PipelineDefinitionError(f"view {self.name!r} needs at least one key column")
        if not self.measures:
            raise PipelineDefinitionError(f"view {self.name!r} needs at least one measure")
        names = [m.name for m in self.measures]
        if len(set(names)) != len(names):
            raise PipelineDefinitionError(f"view {self.name!r} declares a measure twice: {names}")
        clash = set(names) & (set(self.keys) | {WINDOW_START})
        if clash:
            raise PipelineDefinitionError(f"view {self.name!r}: measure names {sorted(clash)} clash with key columns")
        for d in self.derived:
            missing = [r for r in d.requires() if r not in names]
            if missing:
                raise PipelineDefinitionError(
                    f"view {self.name!r}: derived value {d.name!r} needs measures {missing}; add them to the view"
                )
        _check_sessions(self)

    @property
    def group_columns(self) -> tuple[str, ...]:
        """Columns identifying one row of the view: the keys, then the window start if windowed."""
        return self.keys + ((WINDOW_START,) if self.window else ())

    @property
    def distinct_measures(self) -> tuple[Measure, ...]:
        return tuple(m for m in self.measures if isinstance(m, Distinct))

    @property
    def scalar_measures(self) -> tuple[Measure, ...]:
        """Measures whose part is one number (everything but HyperLogLog distinct)."""
        return tuple(m for m in self.measures if not isinstance(m, Distinct))

    def measure(self, name: str) -> Measure:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownNameError("measure", name, list(self._by_name), owner=f"view {self.name!r}") from None

    def aggregate(self, rows: DataFrame) -> DataFrame:
        """One row per key (and window) with every measure's part. Rows with a null key are dropped."""
        timed = self.window or self.sessions
        missing = [c for c in self.keys + ((timed.time_column,) if timed else ()) if c not in rows.columns]
        if missing:
            raise PipelineDefinitionError(
                f"view {self.name!r} needs columns {missing} that the pipeline's transform does not produce "
                f"(it produces {rows.columns})"
            )
        groups: list[Column] = [F.col(k) for k in self.keys]
        if self.window:
            rows = rows.where(F.col(self.window.time_column).isNotNull())
            groups.append(self.window.column())
        for k in self.keys:
            rows = rows.where(F.col(k).isNotNull())
        if self.sessions is not None:
            return _session_parts(self, self.sessions, rows)
        return rows.groupBy(*groups).agg(*(m.aggregate() for m in self.measures))


def _session_parts(view: View, window: SessionWindow, rows: DataFrame) -> DataFrame:
    """One row per key: its keys and its part (``shared_logic.session_parts.part_of_events``, JSON), computed by a
    grouped Arrow function so both layers run the one ``sessions_of``. Times go over as integer microseconds
    (``F.unix_micros``: every timestamp from year 1 to 9999, no session time zone) and values as Arrow gives
    them (an integer stays an int, a null None): no pandas conversion in between."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    time, measures, keys = window.time_column, view.measures, view.keys
    types = {f.name: f.dataType.simpleString() for f in rows.schema.fields}
    check_session_inputs(view.name, window, measures, types)
    inputs = sorted({m.column for m in measures if m.column})
    if _SESSION_TIME in (*keys, *inputs):
        raise PipelineDefinitionError(f"view {view.name!r}: a session view names its event times {_SESSION_TIME!r}; "
                                      "rename that column in the pipeline's transform")
    rows = rows.where(F.col(time).isNotNull()).select(
        *keys, F.unix_micros(F.col(time)).alias(_SESSION_TIME), *(c for c in inputs if c not in keys))
    key_fields = [f for f in rows.schema.fields if f.name in keys]
    arrow_keys = {f.name: to_arrow_type(f.dataType, timezone="UTC") for f in key_fields}

    def parts(table: pa.Table) -> pa.Table:
        columns = {c: table.column(c).to_pylist() for c in inputs}
        events = ((t, {c: columns[c][i] for c in inputs}) for i, t in enumerate(table.column(_SESSION_TIME).to_pylist()))
        text = encode_part(measures, part_of_events(window, measures, events))
        return pa.table({**{k: table.column(k).slice(0, 1).cast(arrow_keys[k]) for k in keys},
                         SESSIONS_COLUMN: pa.array([text], pa.string())})

    schema = ", ".join([f"{f.name} {f.dataType.simpleString()}" for f in key_fields] + [f"{SESSIONS_COLUMN} string"])
    return rows.groupBy(*keys).applyInArrow(parts, schema)


def _check_sessions(view: View) -> None:
    """A session view: no panes beside its sessions, its names and measures checked."""
    if view.sessions is None:
        return
    if view.window is not None:
        raise PipelineDefinitionError(f"view {view.name!r}: a session view has no panes; drop window= or sessions=")
    clash = ({m.name for m in view.measures} | set(view.keys)) & {*SESSION_FIELDS, SESSIONS_COLUMN}
    if clash:
        raise PipelineDefinitionError(f"view {view.name!r}: {sorted(clash)} name what a session view answers per "
                                      f"session ({', '.join(SESSION_FIELDS)}); rename the key column or measure")
    check_session_measures(view.name, view.measures)
