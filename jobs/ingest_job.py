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

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.job_config import JobConfig, source_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from ingest.decode import Decoder
    from ingest.sink import HudiStreamingSink

log = logging.getLogger(__name__)


def build_spark(config: JobConfig) -> SparkSession:
    """The Spark session of the job (``spark.master``, ``spark.conf``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if str(config["spark.master"]).startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no hostname lookups
    # pyspark 4.3 warns that pandas 3 is not fully supported; the paths we use work.
    warnings.filterwarnings("ignore", message=".*does not yet fully support pandas",
                            category=FutureWarning)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(config["spark.app_name"])
    if not SparkConf().contains("spark.master"):
        # Under spark-submit the master comes from its --master flag; otherwise from here.
        builder = builder.master(config["spark.master"])
    defaults = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false", "spark.log.level": "ERROR",
                "spark.sql.execution.arrow.pyspark.enabled": "true"}
    for key, value in {**defaults, **config.spark_conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(config.spark_conf.get("spark.log.level", "ERROR"))
    return spark


def build_decoder(config: JobConfig) -> Decoder:
    """The value decoder from ``[decode]``."""
    from ingest.decode import AvroDecoder, JsonDecoder

    fmt = config["decode.format"]
    schema = config["decode.schema_file"] or config["decode.schema"]
    if fmt == "json":
        return JsonDecoder(schema)
    if not config["decode.schema_file"]:
        from engine.errors import InvalidOptionError

        raise InvalidOptionError("decode.schema_file", f"format {fmt} needs an .avsc file")
    return AvroDecoder(config["decode.schema_file"], confluent=fmt == "avro-confluent")


def build_sink(config: JobConfig, decoder: Decoder) -> HudiStreamingSink:
    """The foreachBatch sink from ``[table]``, ``[index]`` and ``[errors]``."""
    from ingest.sink import HudiStreamingSink

    errors = config["errors.table_path"] or f"{config['table.path'].rstrip('/')}_errors"
    return HudiStreamingSink(
        config["table.path"], decoder=decoder, record_key=config["table.record_key"],
        precombine=config["table.precombine"], partition_by=config["table.partition_by"],
        table_name=config["table.name"], table_type=config["table.type"],
        index=config["index.type"], num_buckets=config["index.num_buckets"],
        options=dict(config.table_options), error_table_path=errors,
        delete_column=config["table.delete_field"],
        update_partition_path=config["index.update_partition_path"],
        state_api=config["index.state_api"])


def _checkpoint_has_offsets(location: str) -> bool:
    offsets = Path(location) / "offsets"
    return offsets.is_dir() and any(offsets.iterdir())


def kafka_options(config: JobConfig) -> dict[str, str]:
    """Options of the Kafka source, with the resume rule of this module's docstring."""
    from ingest.checkpoint import starting_offsets_from_table
    from ingest.kafka_source import starting_offsets_json

    starting = config["source.starting_offsets"]
    if not _checkpoint_has_offsets(config["checkpoint.location"]):
        recorded = starting_offsets_from_table(config["table.path"])
        if recorded:
            log.info("no offsets in the checkpoint: resuming from the table's last commit")
            starting = starting_offsets_json(recorded)
    options = source_options(config, starting)
    return options


@dataclass
class Progress:
    """Totals of a running job, updated after every micro-batch."""

    batches: int = 0
    records: int = 0
    errors: int = 0
    skipped: int = 0
    file_groups: int = 0
    started: float = 0.0

    def rate(self) -> float:
        """Records per second since the start."""
        return self.records / max(time.monotonic() - self.started, 1e-9)


def start(config: JobConfig, spark: SparkSession | None = None
          ) -> tuple[SparkSession, HudiStreamingSink, StreamingQuery]:
    """Build everything and start the query (returns at once)."""
    from ingest.kafka_source import read_kafka_stream
    from ingest.sink import start_ingest

    spark = spark or build_spark(config)
    decoder = build_decoder(config)
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
          until: Callable[[Progress], bool] | None = None) -> Progress:
    """Follow the query until it ends, ``duration`` passes, or ``until`` says so."""
    progress = Progress(started=time.monotonic())
    first = sink.totals

    def update() -> None:
        totals, result = sink.totals, sink.last_result
        if totals.batches - first.batches == progress.batches:
            return
        progress.batches = totals.batches - first.batches
        progress.records = totals.records - first.records
        progress.errors = totals.errors - first.errors
        progress.skipped = totals.skipped - first.skipped
        if result is not None:
            progress.file_groups = len({(s.partition_path, s.file_id)
                                        for s in result.stats}) or progress.file_groups
        if report:
            report(progress)

    try:
        while query.isActive:
            update()
            if duration is not None and time.monotonic() - progress.started > duration:
                break
            if until is not None and until(progress):
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping (Ctrl-C): the batch in flight finishes or rolls back next run")
    finally:
        if query.isActive:
            query.stop()
        update()  # batches that completed after the last look
    exc = query.exception()
    if exc is not None:
        raise RuntimeError(f"the streaming query failed: {exc}")
    return progress


def run(config: JobConfig, *, duration: float | None = None) -> int:
    """``tidelake ingest``: start the job and print progress until it ends."""
    print("tidelake ingest:", {k: v for k, v in config.redacted().items() if v is not None})
    spark, sink, query = start(config)

    def report(p: Progress) -> None:
        print(f"batch {p.batches}: {p.records:,} records ({p.rate():,.0f}/s), "
              f"{p.errors} errors, {p.skipped} replayed batches skipped, "
              f"{p.file_groups} file groups written last batch", flush=True)

    try:
        watch(query, sink, duration=duration, report=report)
    finally:
        spark.stop()
    return 0
