"""Run the ingest job: Kafka → decode → Hudi table, as a Spark Structured Streaming query.

:func:`run` builds everything from a :class:`~jobs.job_config.JobConfig` (the Spark session,
the Kafka source, the decoder, the sink), starts the query and reports progress until the
query ends, ``duration`` passes, or the user presses Ctrl-C (the query is then stopped
cleanly: a batch in flight either commits or is rolled back by the next run).

Where the job starts reading: the Spark checkpoint's offsets when it has any; otherwise the
offsets recorded in the table's last commit (the checkpoint was lost but the table exists);
otherwise ``source.starting_offsets``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidOptionError, TerminalError
from jobs.job_config import SERVICE_OPTIONS, SINK_FIELDS, JobConfig, source_options
from jobs.progress import (
    IDLE_AFTER_S,
    Progress,
    format_idle,
    format_progress,
    format_summary,
    kafka_lag_by_partition,
)
from jobs.spark_jvm import with_archive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from ingest.decode import Decoder
    from ingest.sink import HudiStreamingSink
    from ingest.sink_config import SinkConfig
    from jobs.metrics import JobMetrics, MetricsSettings

log = logging.getLogger(__name__)


def build_spark(config: JobConfig, *, spark_log: str | None = None) -> SparkSession:
    """The Spark session of the job (``spark.master``, ``spark.conf``).

    When this process starts Spark itself (not under ``spark-submit``), the JVM runs in a
    session of its own, so Ctrl-C in the terminal reaches only this process (never the JVM
    or its Python workers, which would fail the batch in flight with screens of traces), and
    with ``spark_log`` the JVM's output (Spark's log, Python worker output) goes to that file
    instead of the terminal. SparkContext's own SIGINT handler, which cancels all running
    Spark jobs, is replaced by a plain ``KeyboardInterrupt`` so :func:`watch` decides.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if str(config["spark.master"]).startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no hostname lookups
    # pyspark 4.3 warns that pandas 3 is not fully supported; the paths we use work.
    warnings.filterwarnings("ignore", message=".*does not yet fully support pandas",
                            category=FutureWarning)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from engine.redact import spark_redaction_regex

    defaults = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false", "spark.log.level": "ERROR",
                "spark.sql.execution.arrow.pyspark.enabled": "true",
                # table services run their Spark jobs in a pool of their own (ingest/services)
                "spark.scheduler.mode": "FAIR",
                # Spark's UI, event log and conf dumps hide what our printouts hide.
                "spark.redaction.regex": spark_redaction_regex()}
    options = {**defaults, **config.spark_conf}
    _launch_jvm({"spark.app.name": config["spark.app_name"],
                 "spark.master": config["spark.master"], **options}, spark_log)
    builder = SparkSession.builder.appName(config["spark.app_name"])
    if not SparkConf().contains("spark.master"):
        # Under spark-submit the master comes from its --master flag; otherwise from here.
        builder = builder.master(config["spark.master"])
    for key, value in options.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(config.spark_conf.get("spark.log.level", "ERROR"))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return spark


def _launch_jvm(options: dict[str, str], spark_log: str | None) -> None:
    """Start Spark's JVM in its own session (see :func:`build_spark`), unless one runs."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return  # a JVM is up already, or spark-submit started this process
    conf = SparkConf(loadDefaults=False)
    # the install's class-data archive (jobs.spark_jvm), where setup wrote one
    conf.setAll(list(with_archive(options).items()))
    popen: dict[str, Any] = {"start_new_session": True}
    if spark_log is not None:
        # The JVM keeps the file open; this process needs no handle of its own.
        with open(spark_log, "ab") as out:
            popen["stdout"] = popen["stderr"] = out
            gateway = launch_gateway(conf, popen_kwargs=popen)
    else:
        gateway = launch_gateway(conf, popen_kwargs=popen)
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def build_decoder(config: JobConfig) -> Decoder:
    """The value decoder from ``[decode]``."""
    from engine.errors import SchemaEvolutionError
    from engine.schema import check_avro_names
    from ingest.decode import AvroDecoder, JsonDecoder

    fmt = config["decode.format"]
    option = "decode.schema_file" if config["decode.schema_file"] else "decode.schema"
    schema = config[option]
    decoder: Decoder
    if fmt == "json":
        decoder = JsonDecoder(schema)
    elif not config["decode.schema_file"]:
        raise InvalidOptionError("decode.schema_file", f"format {fmt} needs an .avsc file")
    else:
        decoder = AvroDecoder(config["decode.schema_file"], confluent=fmt == "avro-confluent")
    try:  # the table could not hold such a column: refused at job start, not at a batch
        check_avro_names(decoder.schema)
    except SchemaEvolutionError as exc:
        raise InvalidOptionError(option, str(exc)) from None
    return decoder


def build_sink(config: JobConfig, decoder: Decoder) -> HudiStreamingSink:
    """The foreachBatch sink from ``[table]``, ``[index]`` and ``[errors]``."""
    from ingest.sink import HudiStreamingSink

    return HudiStreamingSink(sink_config(config, decoder))


def sink_config(config: JobConfig, decoder: Decoder) -> SinkConfig:
    """The sink's :class:`~ingest.sink_config.SinkConfig`: every setting that fills one of its
    fields (:data:`~jobs.job_config.SINK_FIELDS`), the service settings as table options, and
    the error table beside the table unless ``errors.table_path`` says where."""
    from ingest.sink_config import SinkConfig

    values = {field: config[name] for name, field in SINK_FIELDS.items()}
    values["error_table_path"] = (config["errors.table_path"]
                                  or f"{config['table.path'].rstrip('/')}_errors")
    return SinkConfig(decoder=decoder, options=service_options(config),
                      storage_options=dict(config.storage_options) or None, **values)


def service_options(config: JobConfig) -> dict[str, Any]:
    """``[table.options]`` plus the table-service settings of ``[services]`` as the Hudi
    options they stand for (:data:`~jobs.job_config.SERVICE_OPTIONS`); a setting given both
    ways with two values is an error naming both."""
    options: dict[str, Any] = dict(config.table_options)
    for name, key in SERVICE_OPTIONS.items():
        value = config[name]
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key in options and str(options[key]).strip().lower() != text.lower():
            raise InvalidOptionError(name, f"{text!r} contradicts [table.options] {key} = "
                                     f"{options[key]!r}; set one of them")
        options[key] = text
    return options


def metrics_settings(config: JobConfig) -> MetricsSettings:
    """The job's ``hoodie.metrics.*`` options (``[metrics]`` or ``[table.options]``), parsed
    as the table parses them (an unknown ``hoodie.metrics.*`` key or a bad value names it)."""
    from engine.config import WriteConfig
    from jobs.metrics import MetricsSettings

    options = {k: v for k, v in service_options(config).items()
               if k.startswith("hoodie.metrics.")}
    return MetricsSettings.from_write_config(WriteConfig.from_options(options))


def _checkpoint_has_offsets(location: str) -> bool:
    offsets = Path(location) / "offsets"
    return offsets.is_dir() and any(offsets.iterdir())


def kafka_options(config: JobConfig) -> dict[str, str]:
    """Options of the Kafka source, with the resume rule of this module's docstring."""
    from ingest.checkpoint import starting_offsets_from_table
    from ingest.kafka_source import starting_offsets_json

    starting = config["source.starting_offsets"]
    if not _checkpoint_has_offsets(config["checkpoint.location"]):
        recorded = starting_offsets_from_table(config["table.path"],
                                               config["checkpoint.identifier"],
                                               storage_options=config.storage_options)
        if recorded:
            log.info("no offsets in the checkpoint: resuming from the table's last commit")
            starting = starting_offsets_json(recorded)
    options = source_options(config, starting)
    return options


class JobFailedError(TerminalError):
    """The streaming query stopped with an error; the message is one line, ``detail`` all."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


_ROOT_CAUSE = re.compile(
    r"^\s*(?:[\w.]+\.)?((?:[A-Z]\w*)(?:Error|Exception)): (.+?)\s*$", re.M)


def query_failure(exc: BaseException) -> JobFailedError:
    """A one-line :class:`JobFailedError` from a failed query's exception: the last error that
    tidelake raised on purpose (its message names the setting), else the first error line."""
    text = str(exc)
    found = _ROOT_CAUSE.findall(text)
    ours = [(name, msg) for name, msg in found
            if name in _OUR_ERRORS and "Traceback" not in msg]
    name, msg = (ours[-1] if ours else found[0] if found
                 else (type(exc).__name__, (text.strip().splitlines() or ["?"])[0]))
    return JobFailedError(f"the streaming query failed: {name}: {msg[:500]}", text)


def _our_error_names() -> frozenset[str]:
    import engine.errors as errors

    names = {n for n, v in vars(errors).items()
             if isinstance(v, type) and issubclass(v, Exception)}
    return frozenset(names | {"KafkaReadTimeoutError", "KafkaDataLossError",
                              "KafkaUnreachableError", "MissingTopicsError"})


_OUR_ERRORS = _our_error_names()


def check_source(config: JobConfig, timeout_s: float = 10.0) -> None:
    """Raise unless the job's brokers answer within ``timeout_s`` and its topics exist.

    Skipped with ``source.use_builtin_kafka`` (Spark's source takes Java client options, which
    kafka-python cannot use to connect)."""
    if config["source.use_builtin_kafka"]:
        return
    from ingest.kafka_check import check_source as check
    from ingest.kafka_options import KafkaSourceOptions

    check(KafkaSourceOptions.from_options(source_options(config)), timeout_s)


def start(config: JobConfig, spark: SparkSession | None = None, *, spark_log: str | None = None,
          check: bool = True) -> tuple[SparkSession, HudiStreamingSink, StreamingQuery]:
    """Build everything and start the query (returns at once).

    The Kafka source is checked first (:func:`check_source`; ``check=False`` when the caller
    just did): an unreachable broker or a missing topic fails here, before a Spark session or
    any table exists.
    """
    from ingest.kafka_source import read_kafka_stream
    from ingest.sink import start_ingest

    if check:
        check_source(config)
    decoder = build_decoder(config)
    spark = spark or build_spark(config, spark_log=spark_log)
    sink = build_sink(config, decoder)
    builtin = config["source.use_builtin_kafka"]
    # Our source runs the sink's prepare step in its read tasks: one pass over each record.
    source = read_kafka_stream(spark, kafka_options(config), use_builtin=builtin,
                               prepare=None if builtin else sink.spec)
    trigger: dict[str, Any] = ({"availableNow": True} if config["trigger.available_now"]
                               else {"processingTime": config["trigger.processing_time"]})
    query = start_ingest(spark, source, sink, checkpoint=config["checkpoint.location"],
                         trigger=trigger, query_name=None)
    return spark, sink, query


def watch(query: StreamingQuery, sink: HudiStreamingSink, *,
          duration: float | None = None, report: Callable[[Progress], None] | None = None,
          until: Callable[[Progress], bool] | None = None,
          idle: Callable[[Progress, float, bool], None] | None = None,
          publish: Callable[[Progress], None] | None = None) -> Progress:
    """Follow the query until it ends, ``duration`` passes, ``until`` says so, or Ctrl-C.

    ``report`` is called after each batch, ``idle`` when no batch completed for
    :data:`IDLE_AFTER_S` seconds (and every ten times that while it lasts), with whether a
    batch is running; ``publish`` (the metrics endpoint, :mod:`jobs.metrics`) at every look,
    before ``report``, so what it shows is never behind the last line printed. Ctrl-C lets the
    batch in flight finish (a second Ctrl-C stops at once; that batch is then rolled back by
    the next run) and returns with ``interrupted`` set. A failed query raises
    :class:`JobFailedError` with a one-line message.
    """
    progress = Progress(started=time.monotonic())
    progress.last_batch_at = progress.started
    first = sink.totals
    next_idle = [IDLE_AFTER_S]

    seen_batch: list[Any] = [None]  # batchId of the query progress last read

    def read_lag(wait: float) -> None:
        # Spark records a batch's progress just after the sink returns: wait a moment for
        # it, so a batch's line shows the lag after that batch.
        deadline = time.monotonic() + wait
        while True:
            last = query.lastProgress
            data = (json.loads(last.json) if hasattr(last, "json") else last) if last else None
            batch_id = data.get("batchId") if data else None
            if batch_id != seen_batch[0] or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if data is not None:
            seen_batch[0] = batch_id
            by_partition = kafka_lag_by_partition(data)
            progress.partition_lag = by_partition or {}
            progress.lag = None if by_partition is None else sum(by_partition.values())

    def update() -> None:
        totals = sink.totals
        result = totals.last
        read_lag(2.0 if totals.batches - first.batches != progress.batches else 0.0)
        if totals.batches - first.batches == progress.batches:
            if publish is not None:
                publish(progress)
            quiet = time.monotonic() - progress.last_batch_at
            if idle is not None and quiet >= next_idle[0]:
                idle(progress, quiet, bool(query.status.get("isTriggerActive")))
                next_idle[0] = quiet + IDLE_AFTER_S * 10
            return
        progress.batches = totals.batches - first.batches
        progress.records = totals.records - first.records
        progress.errors = totals.errors - first.errors
        progress.skipped = totals.skipped - first.skipped
        progress.retries = totals.retries - first.retries
        progress.commits = totals.commits - first.commits
        progress.seconds = totals.seconds - first.seconds
        progress.commit_seconds = totals.commit_seconds - first.commit_seconds
        progress.services = sink.services.state.describe()
        progress.last = result
        if result is not None:
            progress.file_groups = len({(s.partition_path, s.file_id)
                                        for s in result.stats}) or progress.file_groups
        progress.record_batch()
        next_idle[0] = IDLE_AFTER_S
        if publish is not None:
            publish(progress)
        if report:
            report(progress)

    try:
        while query.isActive:
            update()
            if duration is not None and time.monotonic() - progress.started > duration:
                progress.stopped_by = "--duration reached"
                break
            if until is not None and until(progress):
                progress.stopped_by = "done"
                break
            time.sleep(0.5)
    except KeyboardInterrupt as interrupt:
        progress.interrupted = True
        progress.stopped_by = "SIGTERM" if str(interrupt) == "SIGTERM" else "Ctrl-C"
        _stop_after_batch_in_flight(query, progress.stopped_by)
    finally:
        if query.isActive:
            query.stop()
        update()  # batches that completed after the last look
    exc = query.exception()
    if exc is not None and not progress.interrupted:
        raise query_failure(exc)
    return progress


def _stop_after_batch_in_flight(query: StreamingQuery, why: str = "Ctrl-C") -> None:
    """First Ctrl-C: wait until no trigger is active, then stop; a second one stops now."""
    print(f"\nstopping ({why}): waiting for the batch in flight to commit "
          "(Ctrl-C again to stop now; that batch is then rolled back by the next run)",
          flush=True)
    try:
        while query.isActive and query.status.get("isTriggerActive"):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    query.stop()


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def describe_job(config: JobConfig) -> str:
    """The job's first line: from where, to where, how."""
    topics = ", ".join(config["source.topics"])
    return (f"tidelake ingest: {topics} on {config['source.bootstrap_servers']} -> "
            f"{config['table.type']} table {config['table.path']} ({config['index.type']} "
            f"index), checkpoint {config['checkpoint.location']}")


def run(config: JobConfig, *, duration: float | None = None, verbose: bool = False) -> int:
    """``tidelake ingest``: start the job and print progress until it ends; 130 after Ctrl-C,
    143 after SIGTERM (both stop after the batch in flight).

    Without ``verbose`` Spark's own output goes to a log file whose path is printed (a
    failure still prints one line saying what failed); with it, to the terminal, after the
    job's full settings (secrets redacted).
    """
    print(describe_job(config), flush=True)
    if verbose:
        print("settings:", {k: v for k, v in config.redacted().items() if v is not None})
    check_source(config)  # before anything is created, and before naming a Spark log
    metrics = serve_metrics(config)  # a port in use fails here, before Spark starts
    try:
        return _run(config, duration=duration, verbose=verbose, metrics=metrics)
    finally:
        if metrics is not None:
            metrics.stop()


def serve_metrics(config: JobConfig) -> JobMetrics | None:
    """The job's metrics endpoint, listening, when ``hoodie.metrics.on`` (None when off)."""
    settings = metrics_settings(config)
    if not settings.enabled:
        return None
    from jobs.metrics import JobMetrics

    metrics = JobMetrics(settings)
    metrics.serve()
    return metrics


def _run(config: JobConfig, *, duration: float | None, verbose: bool,
         metrics: JobMetrics | None) -> int:
    spark_log = None
    if not verbose:
        spark_log = os.path.join(tempfile.gettempdir(), f"tidelake-spark-{os.getpid()}.log")
        print(f"Spark's log: {spark_log}", flush=True)
    started = time.monotonic()
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (kill, docker stop; as PID 1 in a container Python would ignore it) stops
        # the job as Ctrl-C does, and exits 143
        signal.signal(signal.SIGTERM, _sigterm)
    try:
        spark, sink, query = start(config, spark_log=spark_log, check=False)
    except KeyboardInterrupt:
        print("\nstopped (Ctrl-C) while starting; nothing was read", flush=True)
        return 130
    print(f"started in {time.monotonic() - started:.0f} s; reading "
          f"(Ctrl-C stops after the batch in flight)", flush=True)
    if metrics is not None:
        metrics.attach(sink)
        print(f"metrics: http://localhost:{metrics.port}/metrics", flush=True)

    def report(p: Progress) -> None:
        print(format_progress(p), flush=True)

    def idle(p: Progress, quiet: float, busy: bool) -> None:
        print(format_idle(p, quiet, busy=busy), flush=True)

    try:
        progress = watch(query, sink, duration=duration, report=report, idle=idle,
                         publish=None if metrics is None else metrics.publish)
    finally:
        sink.services.stop()
        spark.stop()
    reason = progress.stopped_by
    if reason == "the query ended" and config["trigger.available_now"]:
        reason = "all available records read"
    print(format_summary(progress, reason), flush=True)
    if spark_log is not None:
        with contextlib.suppress(OSError):
            os.remove(spark_log)  # kept only when the job failed
    return (143 if progress.stopped_by == "SIGTERM" else 130) if progress.interrupted else 0
