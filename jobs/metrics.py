"""The ingest job's metrics on a Prometheus endpoint (``hoodie.metrics.*``, off by default).

:class:`JobMetrics` serves ``http://HOST:PORT/metrics`` from a thread of the job's driver
process (``prometheus_client``'s HTTP server; its own registry, nothing else on it). The job's
watch loop (:func:`jobs.ingest_job.watch`) calls :meth:`JobMetrics.publish` whenever its
:class:`~jobs.progress.Progress` changes, *before* it prints a progress line, so a scrape
shows the numbers of the line printed last (or of the one about to be printed). A publish
copies everything into an immutable :class:`Snapshot`; a scrape only reads the snapshot
published last, so it never sees half an update and never touches Spark or the table.

Every number comes from the driver: records and errors from the sink's totals (counted by the
write tasks and collected with their write stats), the Kafka lag from the streaming query's
progress (the source's latest offsets, read on the driver), the write stats of the last commit,
and the table services' status (a thread of the driver). Nothing runs in executors for it.

Metrics under Hudi's names (``HoodieMetrics``, ``HoodieStreamerMetrics``: a gauge
``<prefix>.<action>.<metric>`` of the last commit, exported the way Hudi's Prometheus reporter
exports it, dots as ``_``) sit beside tidelake's own ``tidelake_*`` metrics (labels ``table``,
and ``topic``/``partition`` or ``service``: never an option value, so no secret can reach the
endpoint). docs/ingest.md, "Metrics", lists both.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidOptionError

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from engine.config import WriteConfig
    from ingest.sink import HudiStreamingSink
    from jobs.progress import Progress

log = logging.getLogger(__name__)

PORT_SETTING = "metrics.port"
"""The job setting of the port (it stands for ``hoodie.metrics.prometheus.port``)."""

PENDING_ACTIONS = ("compaction", "clustering", "clean", "rollback")
"""Timeline actions whose pending instants are counted (Hudi's ``pending*InstantCount``)."""

HUDI_COMMIT_METRICS = (
    ("totalPartitionsWritten", "partitions_written"),
    ("totalFilesInsert", "files_insert"),
    ("totalFilesUpdate", "files_update"),
    ("totalRecordsWritten", "records_written"),
    ("totalUpdateRecordsWritten", "update_records_written"),
    ("totalInsertRecordsWritten", "insert_records_written"),
    ("totalRecordsDeleted", "records_deleted"),
    ("totalBytesWritten", "bytes_written"),
)
"""Hudi's per-commit gauges (``HoodieMetrics.updateCommitMetrics``) and the
:class:`~engine.timeline.commit_metadata.WriteTotals` field each shows."""


def hudi_name(prefix: str, action: str, metric: str) -> str:
    """Hudi's metric name ``<prefix>.<action>.<metric>`` (no prefix: ``<action>.<metric>``) as
    Hudi's Prometheus reporter exports it: every character outside ``[a-zA-Z0-9_:]`` becomes
    ``_``, and a leading digit gets a ``_`` before it (Prometheus' ``DropwizardExports``)."""
    dotted = f"{prefix}.{action}.{metric}" if prefix else f"{action}.{metric}"
    name = re.sub(r"[^a-zA-Z0-9_:]", "_", dotted)
    return f"_{name}" if name[0].isdigit() else name


@dataclass(frozen=True)
class MetricsSettings:
    """The job's metrics options, from the table options (``hoodie.metrics.*``)."""

    enabled: bool = False
    port: int = 9090
    prefix: str = ""
    """Prefix of Hudi's names; empty: the table name (Hudi infers it so)."""

    @classmethod
    def from_write_config(cls, config: WriteConfig) -> MetricsSettings:
        """The settings a parsed :class:`~engine.config.WriteConfig` holds."""
        # hoodie.metrics.reporter.type is PROMETHEUS: its parser refuses every other reporter
        assert config.metrics_reporter_type == "PROMETHEUS"
        return cls(enabled=config.metrics_on, port=config.metrics_prometheus_port,
                   prefix=config.metrics_name_prefix.replace(".", "_"))


@dataclass(frozen=True)
class ServiceSnapshot:
    """One table service's status at a publish (``ingest.services.ServiceStatus``)."""

    scheduled: int = 0
    done: int = 0
    failures: int = 0
    failures_in_a_row: int = 0
    running_seconds: float | None = None
    last_seconds: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """What a scrape shows: the job's numbers at the last :meth:`JobMetrics.publish`."""

    table: str
    prefix: str
    action: str
    """The data table's commit action: ``deltacommit`` (MERGE_ON_READ) or ``commit``."""
    batches: int = 0
    skipped: int = 0
    records: int = 0
    errors: int = 0
    retries: int = 0
    commits: int = 0
    seconds: float = 0.0
    commit_seconds: float = 0.0
    file_groups: int = 0
    lag: int | None = None
    partition_lag: Mapping[tuple[str, str], int] = field(default_factory=dict)
    last_records: int | None = None
    last_errors: int | None = None
    last_seconds: float | None = None
    last_write_seconds: float | None = None
    last_commit_seconds: float | None = None
    last_batch_at: float | None = None
    """Unix time when the last micro-batch ended."""
    last_instant: str | None = None
    commit_totals: Mapping[str, int] = field(default_factory=dict)
    """:class:`~engine.timeline.commit_metadata.WriteTotals` of the last data commit."""
    services: Mapping[str, ServiceSnapshot] = field(default_factory=dict)
    waits: int = 0
    wait_seconds: float = 0.0
    pending: Mapping[str, int] = field(default_factory=dict)
    """Pending (requested or inflight) instants per action in :data:`PENDING_ACTIONS`."""


class JobMetrics:
    """The Prometheus endpoint of one ingest job (see the module doc).

    :meth:`serve` binds the port (before Spark starts, so a port in use fails the job at
    once), :meth:`attach` names the table once the sink exists, :meth:`publish` is called by
    the watch loop, :meth:`stop` closes the endpoint. Driver only.
    """

    def __init__(self, settings: MetricsSettings) -> None:
        from prometheus_client import CollectorRegistry

        self.settings = settings
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._snapshot: Snapshot | None = None
        self._sink: HudiStreamingSink | None = None
        self._server: Any = None
        self._pending: dict[str, int] = {}
        self._pending_key: Any = None
        self._last_result: Any = None
        self._last_batch_at: float | None = None

    @property
    def port(self) -> int:
        """The port the endpoint listens on (the configured one)."""
        return self.settings.port

    def serve(self) -> None:
        """Listen on ``0.0.0.0:port`` (all interfaces, as Hudi's reporter); a port that cannot
        be bound is an :class:`InvalidOptionError` naming the setting."""
        from prometheus_client import start_http_server

        try:
            self._server, _ = start_http_server(self.settings.port, registry=self.registry)
        except OSError as exc:
            raise InvalidOptionError(
                PORT_SETTING, f"cannot serve metrics on port {self.settings.port} "
                f"(hoodie.metrics.prometheus.port): {exc.strerror or exc}") from None

    def stop(self) -> None:
        """Close the endpoint."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def attach(self, sink: HudiStreamingSink) -> None:
        """The sink whose table, results and services the metrics show."""
        self._sink = sink

    # -- driver: the watch loop ------------------------------------------------------------

    def publish(self, progress: Progress) -> None:
        """Copy the job's numbers into a new :class:`Snapshot` (watch loop thread)."""
        from engine.timeline.commit_metadata import WriteTotals

        sink = self._sink
        if sink is None:
            return
        config = sink.table.config
        result = progress.last
        if result is not None and result is not self._last_result:
            self._last_result = result
            self._last_batch_at = time.time()
        state = sink.services.state
        now = time.monotonic()
        services = {name: ServiceSnapshot(
            scheduled=st.scheduled, done=st.done, failures=st.failures,
            failures_in_a_row=st.failures_in_a_row,
            running_seconds=None if st.running_since is None else now - st.running_since,
            last_seconds=st.last_seconds) for name, st in state.services.items()}
        totals = {}
        if result is not None and result.stats:
            written = WriteTotals.of(result.stats)
            totals = {f: getattr(written, f) for f in written.__dataclass_fields__}
        self._snapshot = Snapshot(
            table=config.name, prefix=self.settings.prefix or config.name.replace(".", "_"),
            action="deltacommit" if config.is_mor else "commit",
            batches=progress.batches, skipped=progress.skipped, records=progress.records,
            errors=progress.errors, retries=progress.retries, commits=progress.commits,
            seconds=progress.seconds,
            commit_seconds=progress.commit_seconds, file_groups=progress.file_groups,
            lag=progress.lag, partition_lag=dict(progress.partition_lag),
            last_records=None if result is None else result.records,
            last_errors=None if result is None else result.errors,
            last_seconds=None if result is None else result.seconds,
            last_write_seconds=None if result is None or result.instant_time is None
            else result.write_seconds,
            last_commit_seconds=None if result is None or result.instant_time is None
            else result.commit_seconds,
            last_batch_at=self._last_batch_at,
            last_instant=None if result is None else result.instant_time,
            commit_totals=totals, services=services, waits=state.waits,
            wait_seconds=state.wait_seconds,
            pending=self._pending_counts(sink, progress.batches,
                                         tuple(s.done for s in services.values())))

    def _pending_counts(self, sink: HudiStreamingSink, *key: Any) -> dict[str, int]:
        """Pending instants per action, read from the timeline again only after a batch or a
        service run (the watch loop publishes twice a second)."""
        if key == self._pending_key or not sink.table.exists:
            return self._pending
        from engine.timeline.active import Timeline
        from engine.timeline.instant import Action

        try:
            timeline = Timeline.load(sink.table.storage, sink.table.config)
        except Exception:  # a metric is not worth failing the job for; try again next time
            log.debug("could not read the timeline for the pending counts", exc_info=True)
            return self._pending
        self._pending = {a: len(timeline.pending([Action(a)])) for a in PENDING_ACTIONS}
        self._pending_key = key
        return self._pending

    # -- the HTTP server's thread ----------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The metric families of the last snapshot (prometheus_client's collector API)."""
        snap = self._snapshot
        if snap is None:
            return
        yield from _ours(snap)
        yield from _hudis(snap)


def _family(kind: str, name: str, doc: str, labels: tuple[str, ...],
            samples: Sequence[tuple[tuple[str, ...], float]]) -> Metric:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    family = cls(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def _summary(name: str, doc: str, table: str, count: int, total: float) -> Metric:
    from prometheus_client.core import SummaryMetricFamily

    family = SummaryMetricFamily(name, doc, labels=["table"])
    family.add_metric([table], count_value=count, sum_value=total)
    return family


def _ours(s: Snapshot) -> Iterator[Metric]:
    t = (s.table,)
    one = ("table",)
    yield _family("counter", "tidelake_batches", "Micro-batches the job handled (the "
                  "progress line's 'batch N').", one, [(t, s.batches)])
    yield _family("counter", "tidelake_batches_skipped", "Replayed micro-batches the table "
                  "already had (nothing written).", one, [(t, s.skipped)])
    yield _family("counter", "tidelake_records", "Kafka records read (the progress line's "
                  "'records').", one, [(t, s.records)])
    yield _family("counter", "tidelake_errors", "Records sent to the error table (the "
                  "progress line's 'errors').", one, [(t, s.errors)])
    yield _family("counter", "tidelake_commit_retries", "Micro-batches or commits tried "
                  "again after a conflict or a lock timeout (the progress line's 'commit "
                  "retries').", one, [(t, s.retries)])
    yield _summary("tidelake_batch_duration_seconds", "Micro-batches in the sink, from Spark's "
                   "call to the commit (retries included).", s.table, s.batches, s.seconds)
    yield _summary("tidelake_commit_duration_seconds", "Completing the data instants (metadata "
                   "table, then the completed instant).", s.table, s.commits,
                   s.commit_seconds)
    last = [("tidelake_last_batch_records", "Kafka records of the last micro-batch.",
             s.last_records),
            ("tidelake_last_batch_errors", "Error-table records of the last micro-batch.",
             s.last_errors),
            ("tidelake_last_batch_duration_seconds", "The last micro-batch in the sink.",
             s.last_seconds),
            ("tidelake_last_commit_duration_seconds", "Completing the last data instant.",
             s.last_commit_seconds),
            ("tidelake_last_batch_timestamp_seconds", "Unix time the last micro-batch ended "
             "(alert on time() minus it).", s.last_batch_at),
            ("tidelake_last_batch_file_groups", "File groups the last micro-batch wrote (the "
             "progress line's 'file groups written').", s.file_groups if s.batches else None),
            ("tidelake_last_batch_max_slice_log_files", "The most log files in one file slice "
             "the last commit wrote to (MERGE_ON_READ; grows while compaction lags).",
             s.commit_totals.get("max_slice_log_files"))]
    for name, doc, value in last:
        if value is not None:
            yield _family("gauge", name, doc, one, [(t, value)])
    if s.partition_lag:
        yield _family("gauge", "tidelake_kafka_lag_records", "Records in a Kafka partition "
                      "beyond the last micro-batch's end offset (they sum to the progress "
                      "line's 'lag').", ("table", "topic", "partition"),
                      [((s.table, topic, part), lag)
                       for (topic, part), lag in sorted(s.partition_lag.items())])
    services = sorted(s.services.items())
    labels = ("table", "service")
    for name, kind, doc, pick in (
            ("tidelake_service_scheduled", "counter", "Plans the job scheduled.",
             lambda st: st.scheduled),
            ("tidelake_service_runs", "counter", "Service runs that completed (the progress "
             "line's 'N done').", lambda st: st.done),
            ("tidelake_service_failures", "counter", "Service runs that failed.",
             lambda st: st.failures),
            ("tidelake_service_failures_in_a_row", "gauge", "Failures since the last success "
             "(3 or more: the progress line says FAILED).", lambda st: st.failures_in_a_row),
            ("tidelake_service_running", "gauge", "1 while the service runs.",
             lambda st: int(st.running_seconds is not None)),
            ("tidelake_service_running_seconds", "gauge", "How long the running service has "
             "run (0 when idle).", lambda st: st.running_seconds or 0.0)):
        yield _family(kind, name, doc, labels,
                      [((s.table, svc), pick(st)) for svc, st in services])
    done = [((s.table, svc), st.last_seconds) for svc, st in services
            if st.last_seconds is not None]
    if done:
        yield _family("gauge", "tidelake_service_last_duration_seconds", "The last completed "
                      "run of the service.", labels, done)
    if s.pending:
        yield _family("gauge", "tidelake_pending_instants", "Requested or inflight instants on "
                      "the table's timeline, by action.", ("table", "action"),
                      [((s.table, action), n) for action, n in sorted(s.pending.items())])
    yield _family("counter", "tidelake_backpressure_waits", "Micro-batches that waited for "
                  "pending compactions (tidelake.services.max.pending.compactions).", one,
                  [(t, s.waits)])
    yield _family("counter", "tidelake_backpressure_wait_seconds", "Time micro-batches waited "
                  "for pending compactions.", one, [(t, s.wait_seconds)])


def _hudis(s: Snapshot) -> Iterator[Metric]:
    from engine.timeline.instant import parse_instant_time

    def gauge(action: str, metric: str, value: float) -> Metric:
        dotted = f"{s.prefix}.{action}.{metric}" if s.prefix else f"{action}.{metric}"
        return _family("gauge", hudi_name(s.prefix, action, metric),
                       f"Hudi's {dotted}", (), [((), value)])

    if s.last_instant is not None and s.commit_totals:
        for metric, name in HUDI_COMMIT_METRICS:
            yield gauge(s.action, metric, s.commit_totals[name])
        if s.last_write_seconds is not None:
            yield gauge(s.action, "duration", round(s.last_write_seconds * 1000))
        started = parse_instant_time(s.last_instant).timestamp()
        yield gauge(s.action, "commitTime", round(started * 1000))
    if s.lag is not None:
        yield gauge("deltastreamer", "kafkaDelayCount", s.lag)
    if s.last_seconds is not None:
        yield gauge("deltastreamer", "duration", round(s.last_seconds * 1000))
    for action in PENDING_ACTIONS:
        if action in s.pending:
            yield gauge(action, f"pending{action.capitalize()}InstantCount", s.pending[action])
    for svc, st in sorted(s.services.items()):
        if st.last_seconds is not None:
            yield gauge(svc, "duration", round(st.last_seconds * 1000))
