"""Kafka as a Spark Structured Streaming source in Python: ``format("tidelake-kafka")``.

Built on Spark's Python Data Source API, so it needs no ``spark-sql-kafka`` jar; users who have
the jar can use Spark's own source through :func:`read_kafka_stream` (``use_builtin=True``).
Rows have Spark's Kafka schema (:func:`kafka_ddl`, headers always included).

Options (case-insensitive, as Spark's ``kafka`` source) are declared, each once with its parser,
default and doc, in :mod:`ingest.kafka_options`: the source's own (:data:`SOURCE_KEYS`:
``subscribe``, ``startingOffsets``, ``maxOffsetsPerTrigger``, ``failOnDataLoss``,
``kafkaConsumer.pollTimeoutMs``, ``fastDecode``, ``tidelake.prepare``) and the ``kafka.*``
client settings (:data:`CLIENT_KEYS`; any other ``kafka.*`` key is an error).
docs/configuration.md lists them all.

Prepared reads: with ``prepare=sink.spec`` each record crosses from Python into the JVM once,
already decoded, keyed and placed in its bucket — with the BUCKET index packed by file group
(:func:`ingest.prepare.pack_rows`), so the JVM handles a few large values per file group
rather than every record. Without it the sink prepares the Kafka rows in a ``mapInArrow``
step of its own: the same rows, at the cost of sending every raw record through the JVM into
a second Python worker.

Offsets are ``{"topic": {"partition": next_offset}}`` (JSON keys are strings); Spark keeps them
in the query's checkpoint, so no consumer group is used and nothing is committed to Kafka.

Who runs what: ``initialOffset``, ``latestOffset``, ``prepareForTriggerAvailableNow``,
``partitions``, ``commit`` and ``stop`` run on the driver, in one long-lived Python process per
query that keeps one metadata consumer open. ``read`` runs in executor tasks, one task per
(topic, partition, offset range) of a micro-batch (:mod:`ingest.kafka_read`); it takes a
consumer of its Python worker's pool and reads with ``assign()`` + ``seek()``. The data
source, the reader, its options and :class:`KafkaInputPartition` are pickled to executors
(the reader drops its driver consumer when pickled).

Restart and replay: a restarted query resumes from the checkpointed end offsets of its last
batch; a replayed batch re-reads exactly the same ``[start, end)`` ranges (planning depends on
nothing but the two offset dicts), so replays yield the same records unless retention deleted
them meanwhile, which ``failOnDataLoss`` governs.

Secrets: option values whose key looks secret (:func:`engine.redact.is_secret_key`: it
contains ``password``, ``secret``, ``token``, ``credential``, ``private``, ``jaas`` or ``key``)
never appear in logs, exception messages or ``repr``; :func:`register` extends Spark's
``spark.sql.redaction.options.regex`` with the same markers so plan strings hide them too.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    StructType,
)

from engine.errors import InvalidOptionError
from engine.redact import spark_redaction_regex

# Options and offset helpers live in their own modules; the names this module had before the
# split are re-exported so ``from ingest.kafka_source import ...`` keeps working.
from ingest.kafka_offsets import (
    KafkaDataLossError,
    MissingTopicsError,
    Offsets,
    TopicPart,
    check_offset_range,
    flatten_offsets,
    format_hudi_checkpoint,
    nest_offsets,
    offsets_from_json_dict,
    offsets_to_json_dict,
    parse_hudi_checkpoint,
    plan_end_offsets,
    report_data_loss,
    split_limit,
    starting_offsets_json,
)
from ingest.kafka_options import (
    CLIENT_KEYS,
    CLIENT_OPTIONS,
    SOURCE_KEYS,
    SOURCE_NAME,
    KafkaSourceOptions,
    is_secret_key,
    redact_options,
)
from ingest.kafka_partition import KafkaInputPartition
from ingest.kafka_probe import PartitionEnd, probe_ends

# The read path (ingest.kafka_read: pyarrow, numpy, the record decoder; ingest.prepare: the
# decoders and the engine's key and placement code) is imported where a read task runs. Spark
# starts several Python processes per query that unpickle this module's classes — planning
# (create_data_source, plan_data_source_read) and the stream reader's driver side — which
# hold what they imported until Spark reaps them: ~30 MiB each with the read path, none of
# which they use (:func:`read_kafka_stream` hands Spark the schema, so they never compute
# it). The read path's names are no longer re-exported here: import them from kafka_read.
if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from ingest.prepare import PrepareSpec


__all__ = [
    "CLIENT_KEYS",
    "CLIENT_OPTIONS",
    "SOURCE_KEYS",
    "SOURCE_NAME",
    "KafkaDataLossError",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "MissingTopicsError",
    "check_offset_range",
    "format_hudi_checkpoint",
    "is_secret_key",
    "kafka_ddl",
    "kafka_spark_schema",
    "offsets_from_json_dict",
    "offsets_to_json_dict",
    "parse_hudi_checkpoint",
    "plan_end_offsets",
    "read_kafka_stream",
    "redact_options",
    "register",
    "source_schema",
    "split_limit",
    "starting_offsets_json",
]

log = logging.getLogger(__name__)

@functools.cache
def kafka_ddl() -> str:
    """Row schema: Spark's ``kafka`` source with ``includeHeaders=true``, less
    ``timestampType``, as DDL (written once, as Arrow: :data:`ingest.kafka_schema.ARROW_SCHEMA`;
    ``KAFKA_DDL`` before it was computed only where asked for)."""
    return ", ".join(f"{field.name} {field.dataType.simpleString()}"
                     for field in kafka_spark_schema().fields)


# --- the driver's view of the cluster ----------------------------------------------------------


class _Cluster:
    """Driver-side metadata and offset look-ups through one group-less ``KafkaConsumer``."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        from kafka import KafkaConsumer

        config = options.consumer_config()
        self._options = options
        self._read_committed = config["isolation_level"] == "read_committed"
        self._consumer = KafkaConsumer(**config)  # never polls: it lists, and sends the probe

    def partitions(self, topics: tuple[str, ...]) -> dict[TopicPart, Any]:
        """Every current partition of ``topics`` (fresh metadata); raises if a topic is missing."""
        from kafka import TopicPartition

        self._consumer.topics()  # always refreshes the metadata cache, so new partitions show
        found = {t: self._consumer.partitions_for_topic(t) or set() for t in topics}
        missing = sorted(t for t, parts in found.items() if not parts)
        if missing:
            raise MissingTopicsError(
                f"subscribed topic(s) {missing} do not exist on the cluster; create them first",
                missing)
        return {(t, p): TopicPartition(t, p) for t in topics for p in sorted(found[t])}

    def topic_ids(self, topics: tuple[str, ...]) -> dict[str, str]:
        """Topic ids from the metadata :meth:`partitions` fetched (brokers that have them)."""
        cluster = self._consumer._client.cluster
        ids = {t: cluster.topic_id(t) for t in topics} if hasattr(cluster, "topic_id") else {}
        return {t: str(i) for t, i in ids.items() if i is not None and int(i) != 0}

    def earliest(self, tps: dict[TopicPart, Any]) -> dict[TopicPart, int]:
        """Log start offset of each partition."""
        found = self._consumer.beginning_offsets(list(tps.values()))
        return {key: int(found[tp]) for key, tp in tps.items()}

    def ends(self, tps: dict[TopicPart, Any],
             floor: Mapping[TopicPart, int] | None = None) -> dict[TopicPart, PartitionEnd]:
        """Where each partition's readable log ends (:func:`ingest.kafka_probe.probe_ends`:
        one ListOffsets and one Fetch per leader, whatever the production rate); ``floor``:
        offsets known to exist (already read), where the probe fetches when ListOffsets
        answers less."""
        return probe_ends(self._consumer, tps, floor or {}, self._read_committed)

    def close(self) -> None:
        self._consumer.close()


# --- the stream reader ---------------------------------------------------------------------------


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader over the subscribed topics; see the module docstring for who calls what.

    Construction does no I/O (Spark builds readers in planner and executor processes too); the
    driver consumer is opened on first use and closed by :meth:`stop`.

    Planning never goes backwards on an estimate: a partition's end is
    ``max(start, probed end)`` (:meth:`_Cluster.ends`), and offsets count as lost only on
    evidence: the log start past ``start`` (the read task reports it), the broker answering
    that ``start`` lies past its log end, or a new topic id (the topic was recreated).
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._cluster: _Cluster | None = None
        self._target: Offsets | None = None  # availableNow: never plan beyond these offsets
        self._last_latest: Offsets | None = None
        self._topic_ids: dict[str, str] = {}  # as first seen by this reader

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cluster": None}

    def __repr__(self) -> str:
        return f"KafkaStreamReader({self.options!r})"

    def _client(self) -> _Cluster:
        if self._cluster is None:
            self._cluster = _Cluster(self.options)
        return self._cluster

    def _partitions(self) -> dict[TopicPart, Any]:
        """Current partitions (fresh metadata); remembers each topic's id when first seen."""
        cluster = self._client()
        tps = cluster.partitions(self.options.topics)
        for topic, topic_id in cluster.topic_ids(self.options.topics).items():
            self._topic_ids.setdefault(topic, topic_id)
        return tps

    def _recreated(self) -> dict[str, tuple[str, str]]:
        """Topics whose id changed since first seen (call after :meth:`_partitions`)."""
        now = self._client().topic_ids(self.options.topics)
        return {t: (self._topic_ids[t], i) for t, i in now.items()
                if t in self._topic_ids and self._topic_ids[t] != i}

    def _ends(self, floor: Mapping[TopicPart, int] | None = None
              ) -> tuple[dict[TopicPart, Any], dict[TopicPart, PartitionEnd]]:
        tps = self._partitions()
        ends = self._client().ends(tps, floor)
        self._last_latest = nest_offsets({tp: e.offset for tp, e in ends.items()})
        return tps, ends

    def initialOffset(self) -> dict[str, Any]:
        """Driver: resolve ``startingOffsets`` to concrete offsets (new queries only), against
        the same confirmed ends as ``availableNow``'s target."""
        spec = self.options.starting_offsets
        if spec == "latest":
            if self._target is not None:
                return offsets_to_json_dict(self._target)
            return offsets_to_json_dict(nest_offsets(
                {tp: e.offset for tp, e in self._ends()[1].items()}))
        tps = self._partitions()
        earliest = self._client().earliest(tps)
        if spec == "earliest":
            return offsets_to_json_dict(nest_offsets(earliest))
        assert isinstance(spec, dict)
        wanted = flatten_offsets(spec)
        unknown = sorted(wanted.keys() - tps.keys())
        if unknown:
            raise InvalidOptionError("startingOffsets", f"no such partition(s): {unknown}")
        floor = {tp: offset for tp, offset in wanted.items() if offset >= 0}
        ends = self._client().ends(tps, floor)
        chosen: dict[TopicPart, int] = {}
        for tp in tps:
            offset = wanted.get(tp, -2)
            if offset == -2:
                offset = earliest[tp]
            elif offset == -1 or ends[tp].beyond:
                if offset != -1:
                    report_data_loss(
                        f"startingOffsets {offset} for topic '{tp[0]}' partition {tp[1]}"
                        f" is past its end {ends[tp].offset}", self.options.fail_on_data_loss)
                offset = ends[tp].offset
            else:
                offset = check_offset_range(tp[0], tp[1], offset, ends[tp].offset, earliest[tp],
                                            self.options.fail_on_data_loss)
            chosen[tp] = offset
        return offsets_to_json_dict(nest_offsets(chosen))

    def getDefaultReadLimit(self) -> ReadLimit:
        """Driver: ``maxOffsetsPerTrigger`` as a row limit, else everything available."""
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Driver: fix the target offsets of an ``availableNow`` run at the confirmed ends."""
        self._target = nest_offsets({tp: e.offset for tp, e in self._ends()[1].items()})

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Driver: end offsets of the next batch (``start`` itself when nothing is new)."""
        begin = flatten_offsets(offsets_from_json_dict(start))
        if self._target is None:
            tps, ends = self._ends(floor=begin)
        else:
            tps = self._partitions()
            target = flatten_offsets(self._target)
            behind = {tp: begin[tp] for tp in tps if tp in begin and target.get(tp, 0) < begin[tp]}
            ends = {tp: PartitionEnd(target.get(tp, 0), confirmed=True) for tp in tps}
            if behind:  # the target is below where we are: ask whether the log went back
                ends.update(self._client().ends({tp: tps[tp] for tp in behind}, behind))
        latest, resumed = self._accept(begin, tps, ends)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        rest = {tp: o for tp, o in begin.items() if tp not in resumed}
        end = flatten_offsets(plan_end_offsets(nest_offsets(rest), nest_offsets(latest),
                                               max_rows, self.options.fail_on_data_loss))
        return offsets_to_json_dict(nest_offsets({**end, **resumed}))

    def _accept(self, begin: Mapping[TopicPart, int], tps: Mapping[TopicPart, Any],
                ends: Mapping[TopicPart, PartitionEnd]
                ) -> tuple[dict[TopicPart, int], dict[TopicPart, int]]:
        """Latest offsets to plan against (never below ``begin``), and the partitions whose
        loss is proven, with the offset each resumes at (``failOnDataLoss=false``; with it
        true, the first loss raises). Each loss is reported once, naming the partition."""
        fail = self.options.fail_on_data_loss
        recreated = self._recreated()
        latest: dict[TopicPart, int] = {}
        resumed: dict[TopicPart, int] = {}
        for tp, end in sorted(ends.items()):
            first = begin.get(tp, 0)
            if tp[0] in recreated and tp in begin:
                old, new = recreated[tp[0]]
                report_data_loss(f"topic '{tp[0]}' partition {tp[1]}: the topic was recreated "
                                 f"(topic id {old} -> {new}); offsets from {first} on are of "
                                 "the old topic", fail)
                resumed[tp] = self._client().earliest({tp: tps[tp]})[tp]
            elif end.beyond and end.offset < first:
                report_data_loss(f"topic '{tp[0]}' partition {tp[1]} offsets went back from "
                                 f"{first} to {end.offset} (the broker says {first} is past its"
                                 " log end: truncated or recreated)", fail)
                resumed[tp] = end.offset
            else:
                latest[tp] = max(first, end.offset)
        for topic in recreated:
            self._topic_ids[topic] = recreated[topic][1]
        return latest, resumed

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Driver: the latest offsets seen by the last look-up, for query progress."""
        return None if self._last_latest is None else offsets_to_json_dict(self._last_latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        """Driver: one input partition per topic partition with offsets in ``[start, end)``.

        Depends on nothing but its arguments, so a replayed batch reads the same ranges.
        """
        begin = flatten_offsets(offsets_from_json_dict(start))
        return [KafkaInputPartition(t, p, begin.get((t, p), 0), stop)
                for (t, p), stop in sorted(flatten_offsets(offsets_from_json_dict(end)).items())
                if stop > begin.get((t, p), 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: the records of ``partition``'s range as Arrow batches of <= 10k rows."""
        from ingest.kafka_read import read_range

        assert isinstance(partition, KafkaInputPartition)
        batches = read_range(self.options, partition)
        spec = prepare_spec(self.options)
        if spec is not None:
            from ingest.prepare import prepare_stream

            batches = prepare_stream(batches, spec)
        return _released(batches)

    def commit(self, end: dict[str, Any]) -> None:
        """Driver: nothing to do; offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        """Driver: close the metadata consumer."""
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


# --- the data source and helpers ----------------------------------------------------------------


def _released(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches``, then the memory their task freed back to the system (the worker idles,
    reused, until its next task: :func:`ingest.rows.release_task_memory`)."""
    from ingest.rows import release_task_memory

    yield from batches
    release_task_memory()


def kafka_spark_schema() -> StructType:
    """:func:`kafka_ddl` as a ``StructType``, built without a SparkSession (for executors)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from ingest.kafka_schema import ARROW_SCHEMA

    return from_arrow_schema(ARROW_SCHEMA)


def source_schema(spec: PrepareSpec | None) -> StructType:
    """The rows' schema: prepared rows with ``spec``, else Kafka's (:func:`kafka_ddl`)."""
    if spec is None:
        return kafka_spark_schema()
    from ingest.ddl import spark_schema
    from ingest.prepare import output_schema

    return spark_schema(output_schema(spec))


class KafkaDataSource(DataSource):
    """``spark.readStream.format("tidelake-kafka")``: streaming reads only; options checked early.

    Spark pickles this object (with its options) to the driver's source process and to
    executors; ``repr`` hides secret option values.
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        options = KafkaSourceOptions.from_options(self.options)  # fail at load(), naming the key
        return source_schema(prepare_spec(options))

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(KafkaSourceOptions.from_options(self.options))

    def __repr__(self) -> str:
        return f"KafkaDataSource({redact_options(dict(self.options))!r})"


_REDACTION_CONF = "spark.sql.redaction.options.regex"
_REDACTION_PATTERN = spark_redaction_regex(extra=("tidelake.prepare",)).removeprefix("(?i)")


def register(spark: SparkSession) -> None:
    """Register :class:`KafkaDataSource` as ``tidelake-kafka`` and hide secrets in plans.

    Spark's default redaction hides keys matching ``secret|password|token``; this appends the
    markers of :mod:`engine.redact` (and ``tidelake.prepare``, a long value that says nothing
    to a reader of plans) to ``spark.sql.redaction.options.regex`` of this session.
    """
    spark.dataSource.register(KafkaDataSource)
    _extend_redaction(spark)


def _extend_redaction(spark: SparkSession) -> None:
    current = spark.conf.get(_REDACTION_CONF) or "(?i)url"
    if _REDACTION_PATTERN not in current:
        prefix = "" if current.startswith("(?i)") else "(?i)"
        spark.conf.set(_REDACTION_CONF, f"{prefix}{current}|{_REDACTION_PATTERN}")


def prepare_option(spec: PrepareSpec) -> str:
    """The ``tidelake.prepare`` option value for ``spec``: plain data (JSON, see
    :func:`ingest.prepare.spec_to_json`), never a pickle — option values travel through
    plans, logs and checkpoints, and are parsed again in every read task."""
    from ingest.prepare import spec_to_json

    return spec_to_json(spec)


def prepare_spec(options: KafkaSourceOptions) -> PrepareSpec | None:
    """The prepare step the read tasks run, or None for plain Kafka rows."""
    if options.prepare is None:
        return None
    return _decode_spec(options.prepare)


@functools.lru_cache(maxsize=8)
def _decode_spec(text: str) -> PrepareSpec:
    from ingest.prepare import spec_from_json

    return spec_from_json(text, "tidelake.prepare")


def read_kafka_stream(
    spark: SparkSession, options: Mapping[str, str], use_builtin: bool = False,
    prepare: PrepareSpec | None = None,
) -> DataFrame:
    """A streaming DataFrame of :func:`kafka_ddl` rows from Kafka.

    ``use_builtin=False`` uses this module's source (options checked here, raising
    :class:`InvalidOptionError` before anything starts). ``use_builtin=True`` uses Spark's own
    ``kafka`` format, which needs the ``spark-sql-kafka-0-10`` jar on the classpath and takes
    Java client options (``kafka.sasl.jaas.config``, truststores, ...) unchecked.

    ``prepare`` (this module's source only; usually ``sink.spec`` of a
    :class:`~ingest.sink.HudiStreamingSink`): the read tasks run that prepare step and the
    rows are prepared rows, which the sink takes as they are.
    """
    if prepare is not None:
        if use_builtin:
            raise ValueError("prepare: only the tidelake-kafka source can prepare rows "
                             "(use_builtin=True reads with Spark's kafka format)")
        options = {**options, "tidelake.prepare": prepare_option(prepare)}
    if use_builtin:
        _extend_redaction(spark)
        frame = (spark.readStream.format("kafka").options(**options)
                 .option("includeHeaders", "true").load())
        return frame.select("key", "value", "topic", "partition", "offset", "timestamp", "headers")
    # The source's own schema (checking the options), given to Spark here so that its
    # planning process need not import the read path to compute it (see this module's imports).
    schema = KafkaDataSource(dict(options)).schema()
    register(spark)
    return spark.readStream.format(SOURCE_NAME).schema(schema).options(**options).load()
