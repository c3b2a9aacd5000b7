"""Batch schedules: an interval (``300s``, ``15m``, ``1h30m``, ``1d``) or a cron expression, in UTC.

Used for ``LAMBDA_BATCH_SCHEDULE`` (when the scheduler recomputes) and for the interval settings
(``LAMBDA_MASTER_COMPACT_EVERY``). Interval schedules tick at start and then every interval on a
fixed grid; cron schedules tick at their next time. Missed ticks are dropped, not queued up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from deploy.errors import ConfigError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_INTERVAL = re.compile(r"(?:\d+\s*[smhd]\s*)+", re.IGNORECASE)
_INTERVAL_PART = re.compile(r"(\d+)\s*([smhd])", re.IGNORECASE)
_SETTING = "LAMBDA_BATCH_SCHEDULE"


@dataclass(frozen=True)
class Schedule:
    """When scheduled runs are due: every ``interval`` seconds, or at the times of a cron expression (UTC)."""

    text: str
    interval: float | None = None
    cron: str | None = None

    def first_due(self, now: float) -> float:
        """An interval schedule ticks at once (then every interval); a cron one at its next time."""
        return now if self.interval is not None else self._cron_after(now)

    def next_due(self, previous: float, now: float) -> float:
        """The first tick after ``now`` following the tick ``previous`` (missed ticks are dropped)."""
        if self.interval is not None:
            missed = max(0, int((now - previous) // self.interval))
            return previous + (missed + 1) * self.interval
        return self._cron_after(max(previous, now))

    def _cron_after(self, moment: float) -> float:
        from croniter import croniter

        start = datetime.fromtimestamp(moment, tz=timezone.utc)
        return float(croniter(self.cron, start).get_next(float))

    def describe(self) -> str:
        return f"every {self.text}" if self.interval is not None else f"cron '{self.cron}' (UTC)"


def parse_schedule(text: str | None) -> Schedule | None:
    """``LAMBDA_BATCH_SCHEDULE`` as a Schedule (None: only on-demand runs), or ConfigError saying why not."""
    try:
        return check_schedule(text)
    except ValueError as e:
        raise ConfigError(f"invalid settings: {_SETTING}: {e}") from None


def check_schedule(text: str | None) -> Schedule | None:
    """The schedule ``text`` means, or ValueError saying what is wrong (usable in a settings validator).

    Intervals: whole numbers with a unit, s m h d, combinable ('90s', '15m', '1h30m', '1d'),
    at least 1 s. Cron: five fields (minute hour day-of-month month day-of-week), a sixth for
    seconds, or a macro such as '@hourly'; evaluated in UTC. None or blank: no schedule.
    """
    if text is None or not text.strip():
        return None
    text = text.strip()
    if _INTERVAL.fullmatch(text):
        seconds = sum(int(n) * _UNITS[u.lower()] for n, u in _INTERVAL_PART.findall(text))
        if seconds < 1:
            raise ValueError(f"interval {text!r} is zero; the shortest is '1s'")
        return Schedule(text=text, interval=float(seconds))
    if re.fullmatch(r"\d+(\.\d+)?", text) or re.fullmatch(r"\d+(\.\d+)?\s*[a-z]+", text, re.IGNORECASE):
        raise ValueError(
            f"{text!r} is not an interval: write a whole number and a unit, s, m, h or d "
            "('300s', '15m', '1h', '1h30m')"
        )
    return Schedule(text=text, cron=_check_cron(text))


def _check_cron(text: str) -> str:
    from croniter import CroniterBadDateError, CroniterError, croniter

    fields = text.split()
    if not text.startswith("@") and len(fields) not in (5, 6):
        raise ValueError(
            f"{text!r} is neither an interval ('300s', '15m', '1h') nor a cron expression: a cron expression "
            f"has 5 fields (minute hour day-of-month month day-of-week, e.g. '*/15 * * * *'), or 6 with "
            f"seconds last; this one has {len(fields)}"
        )
    try:
        croniter(text, datetime.now(timezone.utc)).get_next(float)
    except CroniterBadDateError:
        raise ValueError(f"cron expression {text!r} never fires (no such date)") from None
    except (CroniterError, ValueError, KeyError) as e:
        raise ValueError(f"bad cron expression {text!r}: {e}") from None
    return text
