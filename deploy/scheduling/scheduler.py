"""The batch scheduler: recomputes on a schedule and on demand, one run at a time.

``run_scheduler`` is the loop of the process that owns a SparkSession for batch runs. Every
``poll_seconds`` (0.5 s) it looks at the Redis queue of runs asked for over HTTP
(``POST /v1/batch/runs``; the API process never runs Spark) and at its schedule
(``LAMBDA_BATCH_SCHEDULE``: an interval such as ``300s``/``15m``/``1h``/``1d`` or a cron
expression, evaluated in UTC). A queued run goes first, and also serves a tick that is due.

A run is single-flight (``serving.store.runs``): it holds the data dir's file lock and a Redis
lease renewed by a heartbeat thread. It is *skipped* (and recorded as skipped) when the master
dataset holds no events yet (nothing is published until it does), and when it has not changed
since the served generation: no commit after the served generation's barrier changes data (a
compaction or a vacuum does not, ``MasterDataset.data_changed``). ``force`` (HTTP ``{"force": true}``) recomputes a changed or
unchanged master anyway, e.g. after a change of the pipeline's logic. While nothing is served (a
fresh platform, or Redis lost its data) and the master dataset holds data, a run starts at once,
without waiting for the schedule; a failed one is tried again after ``UNSERVED_RETRY_SECONDS``.

Between runs the scheduler compacts the master dataset's small files (``deploy.scheduling.compactor``).

Interval schedules tick at start and then every interval on a fixed grid; cron schedules tick at
their next time. A scheduler started again (killed, its code changed, `up` restarted) goes on with
the grid of the last run that finished within an interval, instead of ticking at once: a recompute
then would race the restart of the other parts (a speed layer's JVM and first micro-batch) for the
CPU, after a run of a moment ago. Ticks missed while a run overran, or due while another process's
run was in progress, are dropped, not queued up: the next tick (or that run) covers them.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import redis

from batch_layer.errors import EmptyMasterError, RunInProgressError, SchemaChangeError
from batch_layer.master.dataset import MasterDataset
from batch_layer.recompute.lock import RunLock
from batch_layer.recompute.stages import StageRecord
from deploy.scheduling.compactor import MasterCompactor
from deploy.scheduling.schedule import Schedule, check_schedule, parse_schedule
from serving.store.errors import StoreUnavailableError
from serving.store.keys import Keys
from serving.store.runs import BatchRun, RunField, RunRegistry, RunStatus, RunTrigger, owner_id
from serving.store.session import PipelineStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deploy.scheduling.config import SchedulerConfig
    from shared_logic.pipeline import Pipeline

__all__ = ["BatchScheduler", "Schedule", "check_schedule", "parse_schedule", "run_now", "run_scheduler"]

log = logging.getLogger(__name__)

#: How long a run's lease lasts without a heartbeat; a killed scheduler's run reads as
#: 'interrupted' at most this long after it died.
LEASE_SECONDS = 15.0
POLL_SECONDS = 0.5
#: While nothing is served: how often to look whether the master dataset holds data, and how long
#: to wait after a run that did not publish before starting another one.
UNSERVED_CHECK_SECONDS = 2.0
UNSERVED_RETRY_SECONDS = 30.0
class BatchScheduler:
    """Claims runs (queued or scheduled) under the single-flight locks and executes them."""

    def __init__(self, spark: SparkSession, settings: SchedulerConfig, pipeline: Pipeline, *, redis_url: str,
                 lease_seconds: float = LEASE_SECONDS) -> None:
        self.spark, self.settings, self.pipeline, self.redis_url = spark, settings, pipeline, redis_url
        self.lease_seconds = lease_seconds
        self.owner = owner_id()
        self.master = MasterDataset.open(settings, pipeline)
        # An event model the master dataset cannot follow is refused at start (SchemaChangeError), not
        # by the first run's barrier; an added field's column is added by that barrier's ensure.
        try:
            self.master.check_schema()
        except SchemaChangeError:
            raise
        except Exception as e:  # an unreadable master is a run's failure, recorded by the run that meets it
            log.warning("cannot read the master dataset's schema at start (%s); runs will report it", e)
        self.registry = RunRegistry.from_url(redis_url, pipeline.name)
        self.lock = RunLock.for_pipeline(settings.data_dir, settings.pipeline_slug)
        self.store = PipelineStore(self.registry.client, Keys(pipeline.name))
        every = check_schedule(settings.master_compact_every)
        self.compactor = MasterCompactor(self.master, every_seconds=every.interval if every else None,
                                         every_commits=settings.master_compact_commits,
                                         needed=self.oldest_needed_version, keep_versions=settings.master_log_keep_versions,
                                         vacuum_hours=settings.master_vacuum_retention_hours)
        self.started_at = time.time()
        #: When to look next whether nothing is served while the master dataset holds data.
        self.unserved_check_at = 0.0
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
            status, outcome = self._recompute(run)
        except Exception as e:
            log.exception("batch run %s failed", run.id)
            status, outcome = "failed", {"error": f"{type(e).__name__}: {e}"}
        finally:
            done.set()
            beat.join(5)
        final = self.registry.finish(run.id, status, **outcome)
        if final is None:  # the record was dropped meanwhile (retention); report what happened anyway
            final = BatchRun(id=run.id, status=status, trigger=run.trigger, requested_at=run.requested_at)
        return final

    def _recompute(self, run: BatchRun) -> tuple[RunStatus, dict[str, RunField]]:
        """The run's outcome: its status and the fields to record with it."""
        from batch_layer.recompute.job import run_batch

        try:
            latest = self.master.latest_version()
            if not self.master.holds_data():
                raise EmptyMasterError(f"the master dataset at {self.master.path} holds no events yet: ingest "
                                       "some (POST /v1/events or `lambda-platform ingest FILE`); nothing is "
                                       "published until then")
        except EmptyMasterError as e:
            log.info("batch run %s skipped: %s", run.id, e)
            return "skipped", {"skip_reason": str(e)}
        served = self.store.served_generation()
        self.registry.update(run.id, master_version=latest, served_before=served)
        if served is not None and self.logic_pending(served):
            log.info("batch run %s: generation %s holds logic %s, or the speed layer waits for a generation of this "
                     "code's logic %s: recomputing", run.id, served,
                     self.store.generation_logic(served) or "unrecorded", self.pipeline.logic)
        elif served is not None and not run.force and not self.master.data_changed(served, latest):
            after = ("its latest version is that generation's barrier" if latest == served
                     else f"only commits that change no data (compaction, vacuum) came after that generation's "
                          f"barrier, through version {latest}")
            reason = f"the master dataset has not changed since generation {served} ({after})"
            log.info("batch run %s skipped: %s", run.id, reason)
            return "skipped", {"skip_reason": reason, "generation": served}
        log.info("batch run %s (%s%s): master at version %d, serving %s; recomputing", run.id, run.trigger,
                 ", forced" if run.force else "", latest, "nothing" if served is None else f"generation {served}")
        result = run_batch(self.spark, self.settings, self.pipeline, redis_url=self.redis_url, run_id=run.id,
                           on_stage=functools.partial(self._record_stages, run.id))
        log.info("batch run %s succeeded: generation %d (%s), %d events, rows %s, %.1fs", run.id, result.generation,
                 "served" if result.flipped else "not served: a newer one is", result.events, result.view_rows,
                 result.seconds)
        return "succeeded", {
            "generation": result.generation, "flipped": result.flipped,
            "events": result.events, "rows": dict(result.view_rows), "recompute_id": result.run_id,
        }

    def oldest_needed_version(self) -> int | None:
        """The oldest master version a reader still needs: the served generation (its barrier) or the speed
        layer's last processed version, whichever is lower; None when nothing is served or Redis cannot tell."""
        try:
            served = self.store.served_generation()
            processed = self.store.speed_heartbeat().processed
        except redis.RedisError as e:
            log.debug("oldest needed master version unknown: %s", e)
            return None
        if served is None:
            return None
        return served if processed is None else min(served, processed)

    def logic_pending(self, served: int) -> bool:
        """Generation ``served`` is of other logic than this code's, or the speed layer (running this code's logic)
        cannot write its segment and waits for a generation of it: either way a recompute is due now."""
        if self.store.generation_logic(served) != self.pipeline.logic:
            return True
        return self.store.waiting_for() == self.pipeline.logic

    def _record_stages(self, run_id: str, stages: Sequence[StageRecord]) -> None:
        """Put the run's stages so far in its record (GET /v1/batch/runs/{id}); Redis being away only delays it."""
        try:
            self.registry.update(run_id, stages=[stage.as_dict() for stage in stages])
        except redis.RedisError as e:
            log.warning("batch run %s: cannot record its stages: %s", run_id, e)

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
                               started_at=self.started_at, next_run_at=self.next_due, upkeep=self.compactor.summary(),
                               ttl_seconds=max(10.0, self.lease_seconds), ui_url=self.spark.sparkContext.uiWebUrl)


def run_scheduler(
    spark: SparkSession, settings: SchedulerConfig, pipeline: Pipeline, *, redis_url: str, stop: threading.Event,
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
    scheduler.next_due = _first_due(scheduler, schedule, time.time())
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


def _first_due(scheduler: BatchScheduler, schedule: Schedule | None, now: float) -> float | None:
    """The first tick of a scheduler just started: an interval after the newest run of its pipeline that finished
    (succeeded or skipped) within the last interval, else ``schedule.first_due`` (an interval schedule: now; a cron
    one: its next time). A run that failed or was interrupted does not count: the first tick retries it at once."""
    if schedule is None or schedule.interval is None:
        return schedule.first_due(now) if schedule else None
    try:
        _, recent = scheduler.registry.recent(limit=20)
    except StoreUnavailableError as e:  # Redis away at start: tick now, as without a record
        log.debug("batch scheduler: no record of past runs (%s); the schedule starts now", e)
        return schedule.first_due(now)
    finished = [r.started_at for r in recent if r.started_at is not None and r.status in ("succeeded", "skipped")]
    if not finished or now - max(finished) >= schedule.interval:
        return schedule.first_due(now)
    log.info("batch scheduler: the last run of %s started %.0fs ago; the schedule goes on from it (next run in %.0fs)",
             scheduler.pipeline.name, now - max(finished), max(finished) + schedule.interval - now)
    return max(finished) + schedule.interval


def _unserved_with_data(scheduler: BatchScheduler) -> bool:
    """The master dataset holds data, and nothing is served or what is was computed under other logic than
    this scheduler's pipeline code (looked at every UNSERVED_CHECK_SECONDS)."""
    if time.time() < scheduler.unserved_check_at:
        return False
    scheduler.unserved_check_at = time.time() + UNSERVED_CHECK_SECONDS
    served = scheduler.store.served_generation()
    if served is not None and not scheduler.logic_pending(served):
        return False
    return scheduler.master.holds_data()


def _step(scheduler: BatchScheduler, schedule: Schedule | None) -> bool:
    """One look at the queue, the schedule and the served generation; True when a tick was used up
    (the next one is set). Compacts the master dataset when that is due and nothing else ran."""
    due = scheduler.next_due is not None and time.time() >= scheduler.next_due
    if not due and not scheduler.registry.queued() and _unserved_with_data(scheduler):
        outcome = scheduler.attempt(queued=False, trigger="schedule")
        if not (isinstance(outcome, BatchRun) and outcome.status == "succeeded"):
            scheduler.unserved_check_at = time.time() + UNSERVED_RETRY_SECONDS
        return isinstance(outcome, BatchRun)
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
        scheduler.compactor.maybe_compact()
        return False
    assert schedule is not None and scheduler.next_due is not None
    scheduler.next_due = schedule.next_due(scheduler.next_due, time.time())
    recomputed = isinstance(outcome, BatchRun) and outcome.status != "skipped"
    log.log(logging.INFO if recomputed else logging.DEBUG, "next scheduled batch run at %s",
            datetime.fromtimestamp(scheduler.next_due, tz=timezone.utc).isoformat(timespec="seconds"))
    return True


def run_now(spark: SparkSession, settings: SchedulerConfig, pipeline: Pipeline, *, redis_url: str, force: bool = True,
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
