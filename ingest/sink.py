"""The Structured Streaming sink: Kafka micro-batches into a Hudi table, exactly once.

Usage::

    sink = HudiStreamingSink(SinkConfig("/data/trips",
                                        decoder=JsonDecoder("id STRING, ts BIGINT, ..."),
                                        record_key="id", precombine="ts", partition_by=["city"],
                                        error_table_path="/data/trips_errors"))
    query = start_ingest(spark, read_kafka_stream(spark, kafka_options), sink,
                         checkpoint="/chk/trips", trigger={"processingTime": "30 seconds"})

or, with the bucket index, directly ``df.writeStream.foreachBatch(sink.process_batch)`` on the
Kafka rows. One micro-batch, end to end (docs/ingest.md, "What happens to each micro-batch"), read
from Kafka once:

1. *prepare* (executor tasks): decode, record keys, partition paths, ordering values, the
   operation (upsert, delete, error) and, with the BUCKET index, the key's bucket —
   :mod:`ingest.prepare`;
2. *tag*: the BUCKET index needs nothing more (the key's bucket in its partition is its file
   group); the GLOBAL_STATE index tags in the streaming plan, before the sink
   (:mod:`ingest.global_index`);
3. driver, in :meth:`HudiStreamingSink.process_batch`: skip the batch if the table already has
   it; start the instant;
4. executor tasks (one Spark job): repartition by file group, resolve each key's versions in
   the batch (:mod:`ingest.resolve`), run one write handle per file group, stage the error
   rows (:class:`ingest.error_table.ErrorStaging`) and return the write stats with the row
   counts and highest offset per Kafka partition (:mod:`ingest.spark_write`);
5. driver: write the staged error rows to the error table (:mod:`ingest.error_table`) and
   commit it, then complete the data instant with the stats, the batch id and the Kafka
   offsets in the commit metadata (:mod:`ingest.checkpoint`).

Bad batches: when more than ``max_error_fraction`` of a batch's records are bad (default
0.5; batches of fewer than :data:`ERROR_GUARD_MIN_RECORDS` records are not judged), the
batch fails with :class:`TooManyBadRecordsError` naming the most common reason, and nothing
is committed — neither the error table nor the data instant: a decoder whose schema does not
fit the data stops the job instead of filling the error table. A table the sink creates is
created with the first batch that has a valid record (just before its commit), never from a
batch of bad records only.

Exactly once: Spark replays a batch whose end it did not record; the sink recognizes a batch
the table already committed (same writer identifier and query, batch id not newer) and writes
nothing. A batch that failed before its commit left an inflight instant, which is rolled back
at once or, after a crash, by the first write after its heartbeat expired; a replay after
the error table's commit stages no error rows, and one before it upserts them under the same
keys with the same content.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.config import ROLLING_METADATA_KEYS
from engine.errors import (
    InvalidRecordError,
    LockTimeoutError,
    TerminalError,
    WriteConflictError,
)
from engine.schema import normalize_input_schema
from engine.storage import is_local
from engine.write.distributed import Timeline, WriteStat, bucket_count, clustered
from ingest.checkpoint import (
    CHECKPOINT_KEYS,
    batch_end_offsets,
    checkpoint_metadata,
    is_committed,
    last_committed_batch,
    last_offsets,
    merge_offsets,
    starting_offsets_from_table,
)
from ingest.ddl import spark_schema
from ingest.error_table import ERROR_SCHEMA, ErrorStaging, open_error_table, read_staged
from ingest.global_index import (
    GlobalIndexSpec,
    bootstrap_frame,
    check_dependencies,
    check_state_layout,
    ensure_state_store,
    live_bucket_groups,
)
from ingest.global_index_processor import tag_frame
from ingest.prepare import (
    PrepareSpec,
    output_schema,
    prepare_frame,
    prepared_schema,
)
from ingest.record_index import tag_batch
from ingest.rows import is_prepared
from ingest.services import StreamingServices
from ingest.sink_config import (
    BUCKET,
    DEFAULT_MAX_ERROR_FRACTION,
    ERROR_GUARD_MIN_RECORDS,
    GLOBAL_STATE,
    RECORD_INDEX,
    SinkConfig,
)
from ingest.sink_table import (
    check_reserved,
    check_table_schema,
    checked_data_schema,
    key_decoder,
    materialize,
    open_or_define,
)
from ingest.spark_write import (
    InstantPlan,
    TaskReport,
    WriteOutcome,
    WriteResult,
    check_spark_conf,
    start_instant,
    write_rows,
)
from ingest.state_index import FOLD_MIN_ROWS, MAX_DELTAS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "BUCKET",
    "DEFAULT_MAX_ERROR_FRACTION",
    "ERROR_GUARD_MIN_RECORDS",
    "GLOBAL_STATE",
    "RECORD_INDEX",
    "BatchResult",
    "HudiStreamingSink",
    "SinkConfig",
    "SinkTotals",
    "TooManyBadRecordsError",
    "start_ingest",
    "starting_offsets_from_table",
]

log = logging.getLogger(__name__)

_QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's StreamExecution.QUERY_ID_KEY


class TooManyBadRecordsError(TerminalError):
    """A micro-batch has more bad records than ``max_error_fraction`` allows; nothing of it
    was committed."""


@dataclass(frozen=True)
class BatchResult:
    """What :meth:`HudiStreamingSink.process_batch` did with one micro-batch."""

    batch_id: int
    skipped: bool
    """True if the table already had this batch (a replay): nothing was written."""
    instant_time: str | None = None
    error_instant_time: str | None = None
    records: int = 0
    """Kafka records in the batch."""
    errors: int = 0
    """Records routed to the error table."""
    writes: int = 0
    """Rows handed to write tasks (before in-batch resolution)."""
    stats: tuple[WriteStat, ...] = ()
    tasks: tuple[TaskReport, ...] = ()
    """Where each file group's write handle ran."""
    index_groups_read: tuple[str, ...] = ()
    """RECORD_INDEX: the record_index file groups the tagging tasks read (one entry per task
    and group)."""
    seconds: float = 0.0
    """The whole micro-batch in :meth:`HudiStreamingSink.process_batch`: its Spark jobs, the
    error table, the commit and its retries (not the table services' back-pressure wait after
    it, counted in ``ServicesState.wait_seconds``)."""
    write_seconds: float = 0.0
    """The data instant, from its start to its completion (the last try, when retried)."""
    commit_seconds: float = 0.0
    """Completing the data instant (metadata table, then the completed instant file)."""


@dataclass(frozen=True)
class SinkTotals:
    """Running totals of a sink's micro-batches (Kafka records as the sink counted them:
    Spark's ``numInputRows`` counts packed rows instead)."""

    batches: int = 0
    skipped: int = 0
    records: int = 0
    errors: int = 0
    retries: int = 0
    """Retries of a batch or of its commit: a concurrent writer's commit conflicted with it,
    or the table lock stayed busy past ``hoodie.write.lock.wait_time_ms``."""
    commits: int = 0
    """Batches that completed a data instant."""
    seconds: float = 0.0
    """Sum of the batches' :attr:`BatchResult.seconds`."""
    commit_seconds: float = 0.0
    """Sum of the batches' :attr:`BatchResult.commit_seconds`."""
    last: BatchResult | None = None
    """The last batch's result (read with the totals in one look, unlike ``last_result``)."""

    def add(self, result: BatchResult) -> SinkTotals:
        return replace(self, batches=self.batches + 1,
                       skipped=self.skipped + int(result.skipped),
                       records=self.records + result.records,
                       errors=self.errors + result.errors,
                       commits=self.commits + int(result.instant_time is not None),
                       seconds=self.seconds + result.seconds,
                       commit_seconds=self.commit_seconds + result.commit_seconds,
                       last=result)

    def retried(self) -> SinkTotals:
        return replace(self, retries=self.retries + 1)


class HudiStreamingSink:
    """A ``foreachBatch`` sink writing Kafka micro-batches into one Hudi table.

    Built on the driver from a :class:`~ingest.sink_config.SinkConfig` (every argument, its
    default and doc): opens the table at ``table_path``, or creates it from the decoder's
    schema (``record_key`` required then). Bad records go to the error table at
    ``error_table_path``; without one, a batch with a bad record fails naming it.

    A missing table is defined here but created on storage only by the first batch with a
    valid record, just before its commit (:attr:`table_created`).

    Only the driver uses this object; what tasks need is copied into picklable specs.
    """

    def __init__(self, config: SinkConfig) -> None:
        if not isinstance(config, SinkConfig):
            raise TypeError(f"HudiStreamingSink takes a SinkConfig (ingest.sink_config), got "
                            f"{type(config).__name__}: HudiStreamingSink(SinkConfig(table_path, "
                            "decoder=..., ...))")
        self.config = config
        """What the sink was built from."""
        self.index = config.index
        self.state_shards = config.state_shards
        # When a shard's state deltas fold into a new base (ingest.state_index); tests lower them.
        self.state_fold = (FOLD_MIN_ROWS, MAX_DELTAS)
        self.conflict_retries = config.conflict_retries
        self.max_error_fraction = config.max_error_fraction
        self.identifier = config.checkpoint_identifier
        self.write_parallelism = config.write_parallelism
        self.update_partition_path = bool(config.update_partition_path)  # resolved: a bool
        table_path, decoder = config.table_path, config.decoder
        decoded = normalize_input_schema(decoder.schema)
        check_reserved(decoded)
        # The engine stores no _hoodie_* data column (it drops them from its input).
        stored = pa.schema([f for f in decoded if not f.name.startswith("_hoodie_")])
        self.storage_options = dict(config.storage_options or {})
        self._folder_existed = not is_local(table_path) or os.path.exists(table_path)
        # Service commits carry the checkpoint forward (a job without its Spark checkpoint
        # resumes from the table's offsets after any number of compactions and archivals).
        options = {ROLLING_METADATA_KEYS: ",".join(CHECKPOINT_KEYS), **(config.options or {})}
        self.table = open_or_define(config, options, stored)
        self.data_schema = checked_data_schema(self.table, stored, decoded)
        delete_column = config.delete_column
        key_format, key_schema = config.key_format, config.key_schema
        error_table_path = config.error_table_path
        error_table_partitioned = config.error_table_partitioned
        services = config.services
        table_config = self.table.config
        if delete_column is not None and delete_column in decoded.names:
            if not pa.types.is_boolean(decoded.field(delete_column).type):
                raise ValueError(f"delete_column: {delete_column!r} must be a boolean column")
        else:
            delete_column = None
        rings = table_config.consistent_hashing
        if not table_config.partition_fields:
            tombstones = "none"
        elif self.index in (GLOBAL_STATE, RECORD_INDEX):
            tombstones = "state"  # the index finds the partition
        else:  # a ring per partition: a tombstone must name its partition
            tombstones = "unknown" if rings else "bucket"
        self.spec = PrepareSpec(decoder=decoder, config=table_config,
                                data_schema=self.data_schema,
                                delete_column=delete_column, tombstone_partition=tombstones,
                                key_decoder=key_decoder(key_format, key_schema, table_config,
                                                        self.data_schema),
                                num_buckets=bucket_count(table_config,
                                                         self.table.write_config)
                                if self.index == BUCKET else None,
                                pack=self.index != RECORD_INDEX,
                                state_shards=self.state_shards
                                if self.index == GLOBAL_STATE else None,
                                ring_table=self.table.storage if rings else None)
        self.error_table = (open_error_table(error_table_path, f"{table_config.name}_errors",
                                             partitioned=error_table_partitioned,
                                             options=options,
                                             storage_options=self.storage_options)
                            if error_table_path else None)
        self.last_result: BatchResult | None = None
        self.totals = SinkTotals()
        """Everything this sink did since it was built (read by progress displays)."""
        self._retries_left = 0
        self._unaborted: list[InstantPlan] = []
        """Instants of failed batches whose rollback could not take the table lock."""
        self._tagged = False
        self._recovered = False
        self._checked_context: Any = None  # the SparkContext whose conf was checked
        self.services = StreamingServices(self.table, enabled=services)
        """Compaction, clustering, cleaning and archival beside ingestion
        (:mod:`ingest.services`)."""

    @property
    def table_created(self) -> bool:
        """True once the table exists on storage (opened, or created by a batch)."""
        return self.table.exists

    def _check_table_schema(self, timeline: Timeline) -> None:
        """Before a batch starts its instant: :func:`ingest.sink_table.check_table_schema`."""
        check_table_schema(self.table, timeline, self.data_schema)

    # -- the streaming plan (driver) -------------------------------------------------------

    def streaming_frame(self, source: DataFrame) -> DataFrame:
        """The rows :meth:`process_batch` expects, from a streaming DataFrame of Kafka rows.

        BUCKET: the prepared rows. GLOBAL_STATE: prepared rows tagged by the state
        operator, its state seeded from the table's keys (first batch of a new query).
        ``source`` may already be prepared rows (``read_kafka_stream(..., prepare=sink.spec)``,
        which prepares in the read tasks); they must come from this sink's ``spec``.
        """
        self._check_session(source.sparkSession)
        if is_prepared(source.columns):
            if source.schema != spark_schema(output_schema(self.spec)):
                raise ValueError("source: its rows were prepared for another sink (read them "
                                 "with read_kafka_stream(..., prepare=sink.spec) of this sink)")
            prepared = source
        else:
            prepared = prepare_frame(source, self.spec)
        if self.index != GLOBAL_STATE:
            return prepared
        check_dependencies()
        spark = source.sparkSession
        ensure_state_store(spark)
        config = self.table.config
        moves = clustered(self.table.write_config)
        spec = GlobalIndexSpec(
            table_name=config.name,
            num_buckets=bucket_count(config, self.table.write_config),
            bucket_groups=live_bucket_groups(self.table),
            event_time=config.orders_by_event_time, ordering_type=self.spec.ordering_type,
            update_partition_path=self.update_partition_path,
            shards=self.state_shards,
            fold_min_rows=self.state_fold[0], max_deltas=self.state_fold[1],
            index_id=f"{self.table.path}#{self.identifier}",
            # a table a clustering may rewrite: tasks follow the keys it moved
            table_storage=self.table.storage if moves else None,
            table_config=config if moves else None)
        self._tagged = True
        return tag_frame(prepared, spec, bootstrap_frame(spark, self.table, spec))

    # -- one micro-batch (driver) ----------------------------------------------------------

    def process_batch(self, df: DataFrame, batch_id: int) -> None:
        """Write one micro-batch; Spark calls it on the driver (``foreachBatch``).

        Idempotent per (writer identifier, query, batch id): a batch the table already has is
        skipped — with the GLOBAL_STATE index its plan still runs (a ``noop`` write) so that
        the state operator commits the batch's state, as Spark requires. Raises if the batch
        cannot be committed; Spark then stops the query and replays the batch on restart.
        """
        started = time.monotonic()
        spark = df.sparkSession
        self._check_session(spark)
        if not self._recovered:
            self._recover()
        query_id = spark.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
        timeline = Timeline.load(self.table.storage, self.table.config)
        if is_committed(last_committed_batch(timeline, self.identifier, query_id), batch_id,
                        query_id):
            log.info("batch %d is already in %s: skipped", batch_id, self.table.path)
            if self._tagged:
                df.write.format("noop").mode("overwrite").save()
            self._done(BatchResult(batch_id, skipped=True,
                                   seconds=time.monotonic() - started))
            return
        self._check_table_schema(timeline)
        result = self._write_with_retries(self._prepared(df), batch_id, query_id, timeline)
        self._done(replace(result, seconds=time.monotonic() - started))
        if result.instant_time is not None:
            self.services.after_commit(spark)

    def _recover(self) -> None:
        """Once, before the first batch: roll back what a killed predecessor left pending in
        the table and the error table (instants whose writer provably ended, or whose
        heartbeat expired), so neither waits for a later write."""
        for table in (self.table, self.error_table):
            if table is not None and table.exists:
                rolled = table.rollback_failed_writes()
                if rolled:
                    log.info("rolled back %d instant(s) a stopped writer left pending in %s: "
                             "%s", len(rolled), table.path, ", ".join(rolled))
        self._recovered = True

    def _check_session(self, spark: SparkSession) -> None:
        """Refuse unsafe Spark settings (:func:`~ingest.spark_write.check_spark_conf`), once
        per SparkContext (``spark.speculation`` is fixed when the context starts)."""
        if spark.sparkContext is not self._checked_context:
            check_spark_conf(spark)
            self._checked_context = spark.sparkContext

    def _done(self, result: BatchResult) -> None:
        self.totals = self.totals.add(result)
        self.last_result = result

    def _prepared(self, df: DataFrame) -> DataFrame:
        if is_prepared(df.columns):
            return df
        if self.index == GLOBAL_STATE:
            raise ValueError("index GLOBAL_STATE: process_batch needs the rows of "
                             "sink.streaming_frame(source) (use start_ingest), not Kafka rows")
        return prepare_frame(df, self.spec)

    def _parallelism(self, spark: SparkSession) -> int:
        if self.write_parallelism:
            return self.write_parallelism
        return max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 1))

    def _write_with_retries(self, rows: DataFrame, batch_id: int, query_id: str | None,
                            timeline: Timeline) -> BatchResult:
        """:meth:`_write_batch`, retried when a concurrent writer's commit conflicts with it
        (the refused instant was already rolled back: the batch is replanned and written
        again) or when starting its instant waited for the table lock longer than
        ``hoodie.write.lock.wait_time_ms`` (nothing was started: it starts again; a commit
        that waited is retried alone, :meth:`_commit`). At most ``conflict_retries`` retries
        in all, then the error is raised."""
        self._roll_back_unaborted()
        self._retries_left = self.conflict_retries
        while True:
            try:
                return self._write_batch(rows, batch_id, query_id, timeline)
            except (WriteConflictError, LockTimeoutError) as exc:
                if self._retries_left < 0:
                    raise  # _spend_retry gave up inside the batch
                self._spend_retry(batch_id, exc, "replanning and writing it again"
                                  if isinstance(exc, WriteConflictError)
                                  else "starting it again")

    def _spend_retry(self, batch_id: int, exc: WriteConflictError | LockTimeoutError,
                     action: str) -> None:
        """Count one retry of the batch (logged), or raise once ``conflict_retries`` are
        spent."""
        used = self.conflict_retries - self._retries_left
        if self._retries_left <= 0:
            self._retries_left = -1
            what = ("conflicting" if isinstance(exc, WriteConflictError)
                    else "waiting for the table lock")
            raise type(exc)(f"batch {batch_id}: still {what} after {used} retries "
                            f"(conflict_retries): {exc}") from exc
        self._retries_left -= 1
        self.totals = self.totals.retried()
        log.warning("batch %d: %s; %s (retry %d of %d)", batch_id, exc, action, used + 1,
                    self.conflict_retries)

    def _commit(self, plan: InstantPlan, stats: Sequence[WriteStat],
                tasks: Sequence[TaskReport], extra: Mapping[str, str],
                batch_id: int) -> WriteOutcome:
        """Complete the batch's instant, trying the commit again while the table lock stays
        busy past ``hoodie.write.lock.wait_time_ms``: a commit that timed out on the lock did
        nothing under it, so the instant is still inflight, its files written and its
        heartbeat beating, and the same commit can simply be tried again (the conflict
        checks then run against the timeline as it is by then)."""
        while True:
            try:
                return plan.finish(stats, tasks, extra)
            except LockTimeoutError as exc:
                self._spend_retry(batch_id, exc, f"committing instant "
                                  f"{plan.instant_time} of {plan.table.path} again "
                                  "(still inflight, its files kept)")

    def _abort(self, plan: InstantPlan) -> None:
        """Roll a failed batch's instant back now; if the table lock stays busy, the sink
        rolls it back before its next batch (a job that ends first leaves it to the next
        writer, once its heartbeat expired)."""
        if not _abort_quietly(plan):
            self._unaborted.append(plan)

    def _roll_back_unaborted(self) -> None:
        """Roll back the instants of failed batches that could not be rolled back then."""
        self._unaborted = [plan for plan in self._unaborted if not _abort_quietly(plan)]

    def _write_batch(self, rows: DataFrame, batch_id: int, query_id: str | None,
                     timeline: Timeline) -> BatchResult:
        """One Spark job reads the batch once and writes the data table's file groups, staging
        the error rows; the driver checks the share of bad records, writes the error rows to
        the error table and commits it, and commits the data instant last (its commit
        records the batch as done). A table not created yet is created just before that
        commit, and only when the batch has a valid record."""
        uncreated = not self.table.exists
        started = time.monotonic()
        plan = start_instant(self.table, self.data_schema)
        try:
            staging = self._staging(plan, batch_id, query_id)
            parallelism = self._parallelism(rows.sparkSession)
            tagged = None
            if self.index == RECORD_INDEX:
                tagged = tag_batch(rows, plan, prepared_schema(self.spec),
                                   parallelism=parallelism)
                rows = tagged.rows
            try:
                written = write_rows(rows, plan, event_time=self.spec.event_time,
                                     parallelism=parallelism,
                                     by_bucket=self.spec.tombstone_partition == "bucket",
                                     errors=staging,
                                     decided=tagged is not None or self.index == GLOBAL_STATE)
            finally:
                if tagged is not None:
                    tagged.release()
            groups_read = tagged.groups_read if tagged is not None else ()
            if written.stale_rings:
                raise WriteConflictError(
                    f"batch {batch_id}: the bucket ring of partition "
                    f"{written.stale_rings[0]!r} changed while the batch was prepared (a "
                    "resize committed); nothing was committed")
            if not written.records:
                plan.abort()
                if uncreated:
                    self._discard_uncreated()
                return BatchResult(batch_id, skipped=False)
            self._check_error_fraction(written, batch_id)
            error_instant = None
            if written.errors:
                error_instant = self._write_errors(written, batch_id, query_id,
                                                   rows.sparkSession)
            if uncreated and not written.writes:
                # Only bad records: nothing says the decoder's schema fits the data, so no
                # table is created from this batch (its errors are committed above).
                plan.abort()
                self._discard_uncreated()
                log.info("batch %d: %d records, all bad; %s not created yet", batch_id,
                         written.records, self.table.path)
                return BatchResult(batch_id, skipped=False, error_instant_time=error_instant,
                                   records=written.records, errors=written.errors)
            offsets = merge_offsets(last_offsets(timeline, self.identifier),
                                    written.max_offsets,
                                    batch_end_offsets(rows.sparkSession, batch_id))
            extra = checkpoint_metadata(self.identifier, batch_id, query_id, offsets or None)
            if uncreated:
                materialize(self.table, self.storage_options)
            committing = time.monotonic()
            outcome = self._commit(plan, written.stats, written.tasks, extra, batch_id)
            done = time.monotonic()
        except BaseException:
            self._abort(plan)
            if uncreated:
                self._discard_uncreated(quietly=True)
            raise
        log.info("batch %d: %d records, %d errors, %d file groups written in instant %s",
                 batch_id, written.records, written.errors, len(outcome.stats),
                 outcome.instant_time)
        return BatchResult(batch_id, skipped=False, instant_time=outcome.instant_time,
                           error_instant_time=error_instant, records=written.records,
                           errors=written.errors, writes=written.writes,
                           stats=outcome.stats, tasks=outcome.tasks,
                           index_groups_read=groups_read, write_seconds=done - started,
                           commit_seconds=done - committing)

    def _check_error_fraction(self, written: WriteResult, batch_id: int) -> None:
        """Raise :class:`TooManyBadRecordsError` when the batch has too many bad records."""
        records, errors = written.records, written.errors
        if records < ERROR_GUARD_MIN_RECORDS or errors <= self.max_error_fraction * records:
            return
        common = written.most_common_reason
        why = f"; most common reason ({common[1]} records): {common[0]}" if common else ""
        first = written.first_error
        example = (f"; first: record {first.topic}-{first.partition} offset {first.offset}: "
                   f"{first.reason}" if first else "")
        raise TooManyBadRecordsError(
            f"batch {batch_id}: {errors} of {records} records are bad ({errors / records:.0%},"
            f" more than max_error_fraction {self.max_error_fraction:g}){why}{example}. "
            f"Nothing was committed to {self.table.path} or its error table. Check that the "
            "decoder's schema fits the data; to route such batches to the error table "
            "anyway, raise max_error_fraction (errors.max_fraction; 1 turns the check off)")

    def _discard_uncreated(self, *, quietly: bool = False) -> None:
        """Remove what a batch left in the folder of a table that does not exist yet (no
        ``hoodie.properties``): the timeline and scratch files, partition folders that hold
        nothing but their metadata file, and the table folder if this sink made it and it is
        empty. Nothing is removed once the table exists."""
        try:
            self.table.discard_uncreated(remove_folder=not self._folder_existed)
        except Exception:
            if not quietly:
                raise
            log.warning("could not clean up %s (no table was created there)", self.table.path,
                        exc_info=True)

    def _staging(self, plan: InstantPlan, batch_id: int,
                 query_id: str | None) -> ErrorStaging | None:
        """Where the write tasks stage error rows; None when the error table is missing or
        already has this batch (a replay after its commit)."""
        table = self.error_table
        if table is None:
            return None
        timeline = Timeline.load(table.storage, table.config)
        if is_committed(last_committed_batch(timeline, self.identifier, query_id), batch_id,
                        query_id):
            return None
        return ErrorStaging(storage=self.table.storage,
                            folder=plan.write.scratch_path("errors"),
                            batch_id=batch_id, target_table=self.table.config.name,
                            config=table.config)

    def _write_errors(self, written: WriteResult, batch_id: int, query_id: str | None,
                      spark: SparkSession) -> str | None:
        """Write the staged error rows into the error table and commit it (driver side)."""
        if self.error_table is None:
            first = written.first_error
            where = (f"record {first.topic}-{first.partition} offset {first.offset}: "
                     f"{first.reason}" if first else "a record")
            raise InvalidRecordError(
                f"batch {batch_id}: {where} ({written.errors} bad record(s); set "
                "error_table_path to route them to an error table)")
        if not written.staged:  # the error table already has this batch
            return None
        plan = start_instant(self.error_table, ERROR_SCHEMA)
        try:
            staged = read_staged(spark, self.table.storage, written.staged)
            result = write_rows(staged, plan, event_time=False,
                                parallelism=self._parallelism(spark))
            outcome = self._commit(plan, result.stats, result.tasks,
                                   checkpoint_metadata(self.identifier, batch_id, query_id,
                                                       None), batch_id)
        except BaseException:
            self._abort(plan)
            raise
        return outcome.instant_time


def _abort_quietly(plan: InstantPlan) -> bool:
    """Roll back a failed batch's instant now; False (logged) if that fails too."""
    try:
        plan.abort()
    except Exception:  # the original error matters more
        log.warning("could not roll back instant %s of %s now; trying again before the next "
                    "batch (or a later writer will, once its heartbeat expired)",
                    plan.instant_time, plan.table.path, exc_info=True)
        return False
    return True


def start_ingest(spark: SparkSession, source_df: DataFrame, sink: HudiStreamingSink,
                 checkpoint: str, trigger: Mapping[str, Any] | str | None = None,
                 query_name: str | None = None) -> StreamingQuery:
    """Start the streaming query: ``sink.streaming_frame(source) → foreachBatch(sink)``.

    ``trigger`` is passed to ``DataStreamWriter.trigger`` (``{"processingTime": "30
    seconds"}``, ``{"availableNow": True}``; a string means a processing-time interval).
    ``checkpoint`` is the query's checkpoint folder; when it is new but the table exists,
    start the source from :func:`starting_offsets_from_table`.
    """
    del spark  # the source's session runs the query; the argument mirrors Spark's API
    if sink.index == GLOBAL_STATE:
        check_state_layout(checkpoint)
    frame = sink.streaming_frame(source_df)
    writer = frame.writeStream.foreachBatch(sink.process_batch) \
        .option("checkpointLocation", checkpoint)
    if isinstance(trigger, str):
        writer = writer.trigger(processingTime=trigger)
    elif trigger:
        writer = writer.trigger(**dict(trigger))
    if query_name:
        writer = writer.queryName(query_name)
    query = writer.start()
    sink.services.follow_query(frame.sparkSession, query)  # services end with the query
    return query
