"""Table services inside the streaming job: scheduled after micro-batches, executed beside them.

After each committed micro-batch the sink calls :meth:`StreamingServices.after_commit`
(driver, streaming thread): it schedules what is due — a compaction after
``hoodie.compact.inline.max.delta.commits`` deltacommits (MERGE_ON_READ, with
``hoodie.datasource.compaction.async.enable``), a clustering when
``hoodie.clustering.async.enabled`` — under the table lock, and wakes the service thread.

The service thread (one per sink, a daemon) executes the pending plans, then cleans
(``hoodie.clean.automatic``) and archives (``hoodie.archive.automatic``). A compaction's or
clustering's work runs as one Spark job of executor tasks — one task per file group or
clustering group — submitted from this thread in its own FAIR scheduler pool
(:data:`POOL`), with at most ``tidelake.services.parallelism`` tasks at a time (default:
half the job's cores), so micro-batches keep committing meanwhile and never wait for an
executor slot held by a service (apache/hudi#8217).

Back-pressure: when ``tidelake.services.max.pending.compactions`` compactions are pending,
:meth:`after_commit` waits until the thread has finished one, so plans never pile up
(apache/hudi#5565). If the services keep failing it stops waiting, and says so loudly:
ingestion never stops because of a service.

Failures: a failed service run is logged, and retried at the next trigger (the plan stays
on the timeline; an interrupted compaction or clustering is reverted and executed again from
the same plan). After :data:`LOUD_AFTER` failures in a row every failure is logged as an
error and shown in the progress line.

The query's life: :func:`~ingest.sink.start_ingest` ties the services to its query
(:meth:`StreamingServices.follow_query`): a ``StreamingQueryListener`` stops the service
thread after the step in progress once the query terminates — stopped, failed or done — as
Hudi's streaming sink shuts its async compaction and clustering services down
(``HoodieStreamingSink.reset``; Hudi on a failed batch and the JVM's end, here on the query's
end too). A step cut short because the Spark session stopped meanwhile is logged in one
line, not as a failure; its plan stays pending. The next start wakes the thread at once when
plans are pending, without waiting for a micro-batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.services.table_services import (
    ARCHIVE,
    CLEAN,
    CLUSTERING,
    COMPACTION,
    execute_pending,
    pending_plans,
    schedule_due,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from engine.table import Table

log = logging.getLogger(__name__)

POOL = "tidelake-services"
"""The FAIR scheduler pool of service jobs (``spark.scheduler.mode=FAIR``, set by the job)."""

LOUD_AFTER = 3
"""Consecutive failures of one service after which it is reported as an error."""

BACKPRESSURE_POLL_S = 0.5

IDLE_EXIT_S = 30.0
"""The service thread ends after this long without a micro-batch."""


@dataclass
class ServiceStatus:
    """What one service did in this job (read by progress lines)."""

    scheduled: int = 0
    done: int = 0
    failures: int = 0
    failures_in_a_row: int = 0
    running_since: float | None = None
    last_seconds: float | None = None
    last_error: str | None = None


@dataclass
class ServicesState:
    """Every service's status, plus the back-pressure waits."""

    services: dict[str, ServiceStatus] = field(default_factory=lambda: {
        s: ServiceStatus() for s in (COMPACTION, CLUSTERING, CLEAN, ARCHIVE)})
    waits: int = 0
    wait_seconds: float = 0.0

    def describe(self) -> str:
        """``compaction 2 done, 1 running 12 s; clean 5 done; ...`` (services that did
        something only)."""
        parts = []
        now = time.monotonic()
        for name, st in self.services.items():
            bits = []
            if st.done:
                last = f" (last {st.last_seconds:.1f} s)" if st.last_seconds is not None else ""
                bits.append(f"{st.done} done{last}")
            if st.running_since is not None:
                bits.append(f"running {now - st.running_since:.0f} s")
            if st.failures:
                bits.append(f"{st.failures} FAILED" if st.failures_in_a_row >= LOUD_AFTER
                            else f"{st.failures} failed")
            if bits:
                parts.append(f"{name} {', '.join(bits)}")
        if self.waits:
            parts.append(f"{self.waits} back-pressure waits ({self.wait_seconds:.0f} s)")
        return "; ".join(parts)


def _spark_stopped(spark: SparkSession | None) -> bool:
    """Whether ``spark``'s context has stopped (the job's session ended under a service)."""
    if spark is None:
        return False
    context = spark.sparkContext
    try:
        # pyspark clears _jsc on stop(); the JVM's context may have stopped on its own
        return context._jsc is None or bool(context._jsc.sc().isStopped())
    except Exception:  # the JVM is gone: stopped too
        return True


def _remove_listener(spark: SparkSession, listener: Any) -> None:
    """Remove a query's listener after it fired (quietly: the session may be stopping)."""
    try:
        spark.streams.removeListener(listener)
    except Exception:  # a stopped session has no listeners left to remove
        log.debug("could not remove the services' query listener", exc_info=True)


def spark_runner(spark: SparkSession, parallelism: int) -> Callable[[Callable[[Any], Any],
                                                                     Sequence[Any]], list[Any]]:
    """A :data:`~engine.services.base.TaskRunner` running the tasks as one Spark job in the
    services pool, at most ``parallelism`` at a time (each Spark task runs its share in
    turn)."""

    def run(fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        if not tasks:
            return []
        sc = spark.sparkContext
        sc.setLocalProperty("spark.scheduler.pool", POOL)
        sc.setJobDescription(f"tidelake table service: {len(tasks)} tasks")
        slices = max(1, min(len(tasks), parallelism))
        indexed = list(enumerate(tasks))
        results = sc.parallelize(indexed, slices).map(lambda it: (it[0], fn(it[1]))).collect()
        return [r for _, r in sorted(results, key=lambda item: item[0])]

    return run


class StreamingServices:
    """Table services of one streaming sink (see the module doc)."""

    def __init__(self, table: Table, *, enabled: bool = True) -> None:
        self.table = table
        wc = table.write_config
        self.enabled = enabled
        # (not beside ingestion where compactions hold the table lock: table version 6)
        self.compaction = (enabled and table.config.is_mor and wc.compaction_async
                           and not table.config.table_version.compaction_holds_lock)
        self.clustering = enabled and wc.clustering_async
        self.clean = enabled and wc.clean_automatic
        self.archive = enabled and table.archives_automatically
        self.max_pending = wc.max_pending_compactions
        self.state = ServicesState()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._spark: SparkSession | None = None
        self._lock = threading.Lock()
        self._running = threading.Event()  # set while run_once works
        self._query_id: str | None = None  # the query the services follow

    @property
    def active(self) -> bool:
        """True if any service runs in this job."""
        return self.compaction or self.clustering or self.clean or self.archive

    # -- streaming thread ----------------------------------------------------------------

    def after_commit(self, spark: SparkSession) -> None:
        """After a committed micro-batch: schedule what is due, wake the service thread,
        and wait while too many compactions are pending."""
        if not self.active:
            return
        self._spark = spark
        if self.compaction or self.clustering:
            try:
                scheduled = schedule_due(self.table.write_client(), compaction=self.compaction,
                                         clustering=self.clustering)
            except Exception as exc:
                self._failed(COMPACTION if self.compaction else CLUSTERING, exc, "scheduling")
                scheduled = []
            for kind, instant in scheduled:
                self.state.services[kind].scheduled += 1
                log.info("%s %s scheduled", kind, instant)
        self._wake.set()  # before the thread check: a thread about to idle out sees it
        self._ensure_thread()
        if self.compaction:
            self._backpressure()

    def _backpressure(self) -> None:
        started = time.monotonic()
        waited = False
        while True:
            pending = pending_plans(self.table.storage, self.table.config, [COMPACTION])
            if pending < self.max_pending:
                break
            status = self.state.services[COMPACTION]
            if status.failures_in_a_row >= LOUD_AFTER:
                log.error("%d compactions are pending and compaction keeps failing (%s); not "
                          "waiting for it: ingestion goes on", pending, status.last_error)
                break
            if not waited:
                log.info("%d compactions pending (tidelake.services.max.pending.compactions="
                         "%d): waiting for the service thread", pending, self.max_pending)
                waited = True
            self._wake.set()
            time.sleep(BACKPRESSURE_POLL_S)
        if waited:
            self.state.waits += 1
            self.state.wait_seconds += time.monotonic() - started

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="tidelake-services",
                                                daemon=True)
                self._thread.start()

    def drain(self, timeout: float = 300.0) -> bool:
        """Run every due service now and wait until no compaction or clustering is pending
        and the thread is idle (tests, and a job that wants a compacted table before it
        stops); False if that did not happen within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._wake.set()
            self._ensure_thread()
            time.sleep(BACKPRESSURE_POLL_S)
            busy = self._running.is_set()
            pending = pending_plans(self.table.storage, self.table.config,
                                    [s for s, on in ((COMPACTION, self.compaction),
                                                     (CLUSTERING, self.clustering)) if on])
            if not busy and not self._wake.is_set() and not pending:
                return True
        return False

    def follow_query(self, spark: SparkSession, query: StreamingQuery) -> None:
        """Tie the service thread to ``query`` (driver, right after it started): when the
        query terminates, the thread stops after the step in progress (a listener on the
        session's streams, removed then). Pending compaction and clustering plans — left by
        an earlier run — are executed now, without waiting for a micro-batch."""
        if not self.active:
            return
        from pyspark.sql.streaming import StreamingQueryListener

        query_id = str(query.id)
        self._query_id = query_id
        services = self

        class StopWithQuery(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                return None

            def onQueryProgress(self, event: Any) -> None:
                return None

            def onQueryIdle(self, event: Any) -> None:
                return None

            def onQueryTerminated(self, event: Any) -> None:
                if str(event.id) != query_id:
                    return
                services._query_ended(query_id)
                # not from the listener bus's own callback: remove it from another thread
                threading.Thread(target=_remove_listener, args=(spark, self),
                                 name="tidelake-listener-removal", daemon=True).start()

        spark.streams.addListener(StopWithQuery())
        if not query.isActive:  # ended before the listener was there
            self._query_ended(query_id)
            return
        self._spark = spark
        if (self.compaction or self.clustering) and pending_plans(
                self.table.storage, self.table.config,
                [s for s, on in ((COMPACTION, self.compaction),
                                 (CLUSTERING, self.clustering)) if on]):
            self._wake.set()
            self._ensure_thread()

    def _query_ended(self, query_id: str) -> None:
        """The followed query terminated: stop after the step in progress (no wait here:
        the listener bus must not wait for a compaction)."""
        if query_id != self._query_id:
            return  # an earlier query of this sink; a later one is followed now
        self._stop.set()
        self._wake.set()
        log.info("query %s ended: table services stop after the step in progress (pending "
                 "plans are executed by the next run)", query_id)

    @property
    def stopped(self) -> bool:
        """True once the service thread has ended (or never started)."""
        thread = self._thread
        return thread is None or not thread.is_alive()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the service thread after the service it is running (an interrupted one is
        executed again by the next run, from its plan)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("table services still running after %.0f s; leaving them (the next "
                            "run finishes what they started)", timeout)

    # -- service thread ------------------------------------------------------------------

    def _loop(self) -> None:
        """Run the services whenever woken; end after :data:`IDLE_EXIT_S` without a wake
        (the next micro-batch starts a new thread), so an idle or finished sink holds no
        thread."""
        while not self._stop.is_set():
            if not self._wake.wait(timeout=IDLE_EXIT_S):
                with self._lock:
                    if not self._wake.is_set():
                        self._thread = None
                        return
            self._running.set()
            self._wake.clear()
            try:
                if self._stop.is_set():
                    break
                self.run_once()
            finally:
                self._running.clear()

    def run_once(self) -> None:
        """Execute pending compactions and clusterings, then clean and archive (each
        failure is recorded; the others still run)."""
        spark = self._spark
        wanted = [(COMPACTION, self.compaction), (CLUSTERING, self.clustering),
                  (CLEAN, self.clean), (ARCHIVE, self.archive)]
        for service, on in wanted:
            if not on or self._stop.is_set():
                continue
            if service in (COMPACTION, CLUSTERING) and not self._has_pending(service):
                continue
            status = self.state.services[service]
            status.running_since = time.monotonic()
            try:
                run = (execute_pending(self.table.write_client(), service,
                                       runner=spark_runner(spark, self._parallelism(spark)))
                       if spark else execute_pending(self.table.write_client(), service))
            except Exception as exc:
                if self._stop.is_set() or _spark_stopped(spark):
                    # the query ended and its session stopped under the step: not a failure
                    self._stop.set()
                    log.info("%s stopped with the query (%s); its plan stays pending for the "
                             "next run", service, str(exc).split("\n", 1)[0][:200])
                    break
                self._failed(service, exc, "running")
                continue
            finally:
                started = status.running_since
                status.running_since = None
            status.failures_in_a_row = 0
            if run.completed:
                status.done += len(run.completed)
                status.last_seconds = time.monotonic() - started
                log.info("%s %s done in %.1f s %s", service, ",".join(run.completed),
                         status.last_seconds, dict(run.details))

    def _has_pending(self, service: str) -> bool:
        return bool(pending_plans(self.table.storage, self.table.config, [service]))

    def _parallelism(self, spark: SparkSession) -> int:
        configured = self.table.write_config.services_parallelism
        if configured:
            return configured
        return max(1, int(spark.sparkContext.defaultParallelism) // 2)

    def _failed(self, service: str, exc: BaseException, doing: str) -> None:
        status = self.state.services[service]
        status.failures += 1
        status.failures_in_a_row += 1
        status.last_error = f"{type(exc).__name__}: {exc}"
        if status.failures_in_a_row >= LOUD_AFTER:
            log.error("%s failed %d times in a row (%s): %s; ingestion goes on, the next "
                      "trigger tries again", service, status.failures_in_a_row, doing,
                      status.last_error, exc_info=exc)
        else:
            log.warning("%s failed (%s): %s; the next trigger tries again", service, doing,
                        status.last_error, exc_info=exc)
