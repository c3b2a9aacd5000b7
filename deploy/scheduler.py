"""The batch scheduler: recomputes on a schedule and on demand, one run at a time.

``run_scheduler`` is the loop of the process that owns a SparkSession for batch runs. Every
``poll_seconds`` (0.5 s) it looks at the Redis queue of runs asked for over HTTP
(``POST /v1/batch/runs``; the API process never runs Spark) and at its schedule
(``LAMBDA_BATCH_SCHEDULE``: an interval such as ``300s``/``15m``/``1h``/``1d`` or a cron
expression, evaluated in UTC). A queued run goes first, and also serves a tick that is due.

A run is single-flight (``batch_layer.runs``): it holds the data dir's file lock and a Redis
lease renewed by a heartbeat thread. It is *skipped* (and recorded as skipped) when the master
dataset has not changed since the served generation: its latest version is the served
generation's barrier. ``force`` (HTTP ``{"force": true}``) recomputes anyway, e.g. after a change
of the pipeline's logic. When Redis lost its data nothing is served, so the next run republishes.

Interval schedules tick at start and then every interval on a fixed grid; cron schedules tick at
their next time. Ticks missed while a run overran, or due while another process's run was in
progress, are dropped, not queued up: the next tick (or that run) covers them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import redis

from batch_layer import publish
from batch_layer.errors import EmptyMasterError
from batch_layer.master import MasterDataset
from batch_layer.runs import BatchRun, RunInProgressError, RunLock, RunRegistry, RunTrigger, owner_id
from batch_layer.storage import get_engine
from deploy.errors import ConfigError
from serving.keys import Keys

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deploy.settings import Settings
    from shared_logic.pipeline import Pipeline

log = logging.getLogger(__name__)

#: How long a run's lease lasts without a heartbeat; a killed scheduler's run reads as
#: 'interrupted' at most this long after it died.
LEASE_SECONDS = 15.0
POLL_SECONDS = 0.5
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


class BatchScheduler:
    """Claims runs (queued or scheduled) under the single-flight locks and executes them."""

    def __init__(self, spark: SparkSession, settings: Settings, pipeline: Pipeline, *, redis_url: str,
                 lease_seconds: float = LEASE_SECONDS) -> None:
        self.spark, self.settings, self.pipeline, self.redis_url = spark, settings, pipeline, redis_url
        self.lease_seconds = lease_seconds
        self.owner = owner_id()
        self.registry = RunRegistry.from_url(redis_url, pipeline.name)
        self.lock = RunLock.for_pipeline(settings.data_dir, settings.pipeline_slug)
        self.master = MasterDataset(settings.master_path, pipeline, get_engine(settings.storage_engine))
        self.keys = Keys(pipeline.name)
        self.started_at = time.time()
        #: What ``announce`` tells about this scheduler (kept current by the loop).
        self.schedule: Schedule | None = None
        self.next_due: float | None = None

    def close(self) -> None:
        self.registry.close()

    def attempt(self, *, queued: bool, trigger: RunTrigger = "schedule", force: bool = False) -> BatchRun | str | None:
        """Claim and execute one run. Returns its final record; or why none ran: the id of the run
        in the way ('busy'), 'locked' (another process holds the file lock), or None (queue empty)."""
        if not self.lock.acquire(self.owner):
            return "locked"
        try:
            run, in_the_way = self.registry.claim(
                self.owner, lease_seconds=self.lease_seconds, queued=queued, trigger=trigger, force=force
            )
            if run is None:
                return in_the_way
            return self.execute(run)
        finally:
            self.lock.release()

    def execute(self, run: BatchRun) -> BatchRun:
        """Run a claimed run to its outcome, renewing its lease meanwhile; never raises for a failed run."""
        done = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(run.id, done), name=f"batch-lease-{run.id}", daemon=True)
        beat.start()
        log.debug("batch run %s (%s%s) claimed by %s", run.id, run.trigger, ", forced" if run.force else "", self.owner)
        try:
            outcome = self._recompute(run)
        except Exception as e:  # noqa: BLE001 - every failure is recorded on the run
            log.exception("batch run %s failed", run.id)
            outcome = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        finally:
            done.set()
            beat.join(5)
        status = outcome.pop("status")
        final = self.registry.finish(run.id, status, **outcome)
        if final is None:  # the record was dropped meanwhile (retention); report what happened anyway
            final = BatchRun(id=run.id, status=status, trigger=run.trigger, requested_at=run.requested_at)
        return final

    def _recompute(self, run: BatchRun) -> dict[str, object]:
        from batch_layer.recompute import run_batch

        try:
            latest = self.master.latest_version()
        except EmptyMasterError as e:
            log.info("batch run %s skipped: %s", run.id, e)
            return {"status": "skipped", "skip_reason": str(e)}
        served = publish.served_generation(self.registry.client, self.keys)
        self.registry.update(run.id, master_version=latest, served_before=served)
        if served is not None and latest == served and not run.force:
            reason = (f"the master dataset has not changed since generation {served} "
                      f"(its latest version is that generation's barrier)")
            log.info("batch run %s skipped: %s", run.id, reason)
            return {"status": "skipped", "skip_reason": reason, "generation": served}
        log.info("batch run %s (%s%s): master at version %d, serving %s; recomputing", run.id, run.trigger,
                 ", forced" if run.force else "", latest, "nothing" if served is None else f"generation {served}")
        result = run_batch(self.spark, self.settings, self.pipeline, redis_url=self.redis_url)
        log.info("batch run %s succeeded: generation %d (%s), %d events, rows %s, %.1fs", run.id, result.generation,
                 "served" if result.flipped else "not served: a newer one is", result.events, result.view_rows,
                 result.seconds)
        return {
            "status": "succeeded", "generation": result.generation, "flipped": result.flipped,
            "events": result.events, "rows": dict(result.view_rows), "recompute_id": result.run_id,
        }

    def _heartbeat(self, run_id: str, done: threading.Event) -> None:
        period = max(0.2, self.lease_seconds / 3)
        while not done.wait(period):
            try:
                if not self.registry.renew(run_id, lease_seconds=self.lease_seconds):
                    log.warning("batch run %s lost its lease (Redis unreachable for over %.0fs, or its data lost): it "
                                "reads as interrupted meanwhile; the run goes on and records its outcome",
                                run_id, self.lease_seconds)
                self.announce()  # still alive while the loop is busy with this run
            except redis.RedisError as e:
                log.warning("batch run %s: cannot renew its lease: %s", run_id, e)

    def announce(self) -> None:
        """Tell the registry this scheduler is alive, with its schedule, next tick and Spark UI address."""
        self.registry.announce(self.owner, schedule=self.schedule.text if self.schedule else None,
                               started_at=self.started_at, next_run_at=self.next_due,
                               ttl_seconds=max(10.0, self.lease_seconds), ui_url=self.spark.sparkContext.uiWebUrl)


def run_scheduler(
    spark: SparkSession, settings: Settings, pipeline: Pipeline, *, redis_url: str, stop: threading.Event,
    poll_seconds: float = POLL_SECONDS, lease_seconds: float = LEASE_SECONDS,
) -> None:
    """Run scheduled and on-demand batch recomputes until ``stop`` is set.

    A run in progress when ``stop`` is set finishes first (its outcome is recorded). Redis
    outages are logged and waited out. Signal handling is the caller's: set ``stop``.
    Raises ConfigError at once for an invalid ``settings.batch_schedule``.
    """
    schedule = parse_schedule(settings.batch_schedule)
    scheduler = BatchScheduler(spark, settings, pipeline, redis_url=redis_url, lease_seconds=lease_seconds)
    scheduler.schedule = schedule
    scheduler.next_due = schedule.first_due(time.time()) if schedule else None
    log.info("batch scheduler %s for pipeline %s: %s; runs asked for over HTTP are picked up every %.1fs",
             scheduler.owner, pipeline.name, schedule.describe() if schedule else "no schedule (on-demand runs only)",
             poll_seconds)
    announced = 0.0
    try:
        while not stop.is_set():
            try:
                if time.time() - announced >= 2.0:
                    scheduler.announce()
                    announced = time.time()
                if _step(scheduler, schedule):
                    scheduler.announce()
                    announced = time.time()
            except redis.RedisError as e:
                log.warning("batch scheduler: Redis is unreachable (%s); retrying", e)
                stop.wait(2.0)
            stop.wait(poll_seconds)
    finally:
        try:
            scheduler.registry.retire(scheduler.owner)
        except redis.RedisError:
            pass
        scheduler.close()
        log.info("batch scheduler %s stopped", scheduler.owner)


def _step(scheduler: BatchScheduler, schedule: Schedule | None) -> bool:
    """One look at the queue and the schedule; True when a tick was used up (the next one is set)."""
    due = scheduler.next_due is not None and time.time() >= scheduler.next_due
    if scheduler.registry.queued():
        outcome = scheduler.attempt(queued=True)
        if outcome == "locked":
            log.debug("a run is queued; another process holds the batch lock (%s)", scheduler.lock.holder())
        if not (isinstance(outcome, BatchRun) and due):
            return False
        # The queued run served the due tick as well.
    elif due:
        outcome = scheduler.attempt(queued=False, trigger="schedule")
        if not isinstance(outcome, BatchRun):  # routine with several schedulers: debug only
            log.debug("scheduled tick dropped: %s", "another process is recomputing" if outcome == "locked"
                      else f"batch run {outcome} is in progress")
    else:
        return False
    assert schedule is not None and scheduler.next_due is not None
    scheduler.next_due = schedule.next_due(scheduler.next_due, time.time())
    recomputed = isinstance(outcome, BatchRun) and outcome.status != "skipped"
    log.log(logging.INFO if recomputed else logging.DEBUG, "next scheduled batch run at %s",
            datetime.fromtimestamp(scheduler.next_due, tz=timezone.utc).isoformat(timespec="seconds"))
    return True


def run_now(spark: SparkSession, settings: Settings, pipeline: Pipeline, *, redis_url: str, force: bool = True,
            trigger: RunTrigger = "cli") -> BatchRun:
    """Recompute now in this process, recorded in the registry and single-flight with the schedulers
    (for ``lambda-platform batch run``). RunInProgressError when another run is queued or running."""
    scheduler = BatchScheduler(spark, settings, pipeline, redis_url=redis_url)
    try:
        outcome = scheduler.attempt(queued=False, trigger=trigger, force=force)
    finally:
        scheduler.close()
    if isinstance(outcome, BatchRun):
        return outcome
    if outcome == "locked":
        raise RunInProgressError(f"another process is recomputing {settings.data_dir.resolve()} "
                                 f"(lock {scheduler.lock.path} held by {scheduler.lock.holder()}); try again when it is done")
    raise RunInProgressError(f"batch run {outcome} is queued or running; one run at a time: try again when it is done")
