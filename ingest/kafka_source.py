"""Kafka as a Spark Structured Streaming source in Python: ``format("tidelake-kafka")``.

Built on Spark's Python Data Source API, so it needs no ``spark-sql-kafka`` jar; users who have
the jar can use Spark's own source through :func:`read_kafka_stream` (``use_builtin=True``).
Rows have Spark's Kafka schema (:data:`KAFKA_DDL`, headers always included).

Options (case-insensitive, as Spark's ``kafka`` source):

=============================  ==============================================================
``kafka.bootstrap.servers``    required; ``host:port[,host:port...]``
``subscribe``                  required; comma-separated topic names (must exist)
``startingOffsets``            ``latest`` (default), ``earliest``, or JSON
                               ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest;
                               partitions left out start at their earliest offset)
``maxOffsetsPerTrigger``       offsets per micro-batch over all partitions, split in proportion
                               to each partition's backlog (``availableNow`` honours it too)
``failOnDataLoss``             ``true`` (default): fail when wanted offsets are gone (retention,
                               topic recreated); ``false``: log a warning and skip them
``kafkaConsumer.pollTimeoutMs``  how long a task waits for records it knows exist (120000)
``kafka.*`` client settings    see :data:`CLIENT_OPTIONS`; any other ``kafka.*`` key is an error
=============================  ==============================================================

Offsets are ``{"topic": {"partition": next_offset}}`` (JSON keys are strings); Spark keeps them
in the query's checkpoint, so no consumer group is used and nothing is committed to Kafka.

Who runs what: ``initialOffset``, ``latestOffset``, ``prepareForTriggerAvailableNow``,
``partitions``, ``commit`` and ``stop`` run on the driver, in one long-lived Python process per
query that keeps one metadata consumer open. ``read`` runs in executor tasks, one task per
(topic, partition, offset range) of a micro-batch; it opens its own consumer with ``assign()`` +
``seek()``. The data source, the reader, its options and :class:`KafkaInputPartition` are
pickled to executors (the reader drops its driver consumer when pickled).

Restart and replay: a restarted query resumes from the checkpointed end offsets of its last
batch; a replayed batch re-reads exactly the same ``[start, end)`` ranges (planning depends on
nothing but the two offset dicts), so replays yield the same records unless retention deleted
them meanwhile, which ``failOnDataLoss`` governs.

Secrets: option values whose key contains ``password``, ``secret``, ``token`` or ``sasl.jaas``
never appear in logs, exception messages or ``repr``; :func:`register` extends Spark's
``spark.sql.redaction.options.regex`` so plan strings hide them too.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from engine.errors import InvalidOptionError, TerminalError, TransientError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "ARROW_SCHEMA",
    "BATCH_ROWS",
    "CLIENT_OPTIONS",
    "KAFKA_DDL",
    "SOURCE_NAME",
    "KafkaDataLossError",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaReadTimeoutError",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "KafkaTopicNotFoundError",
    "check_offset_range",
    "format_hudi_checkpoint",
    "is_secret_key",
    "kafka_spark_schema",
    "offsets_from_json_dict",
    "offsets_to_json_dict",
    "parse_hudi_checkpoint",
    "plan_end_offsets",
    "read_kafka_stream",
    "redact_options",
    "register",
    "split_limit",
    "starting_offsets_json",
]

log = logging.getLogger(__name__)

SOURCE_NAME = "tidelake-kafka"
KAFKA_DDL = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
"""Row schema: Spark's ``kafka`` source with ``includeHeaders=true``, less ``timestampType``."""

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("headers", pa.list_(pa.field("element", _HEADER))),
])
"""Arrow form of :data:`KAFKA_DDL`, exactly as Spark expects record batches from ``read``."""

BATCH_ROWS = 10_000
_SECRET_MARKERS = ("password", "secret", "token", "sasl.jaas")
_REDACTED = "*********(redacted)"
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

Offsets = dict[str, dict[int, int]]
"""Next offset to read per topic and partition."""
TopicPart = tuple[str, int]


class KafkaDataLossError(TerminalError):
    """Offsets the query needs are gone (retention, deleted or recreated topic)."""


class KafkaTopicNotFoundError(TerminalError):
    """A subscribed topic does not exist on the cluster."""


class KafkaReadTimeoutError(TransientError):
    """A task saw no progress within ``kafkaConsumer.pollTimeoutMs`` on offsets that exist."""


# --- options ----------------------------------------------------------------------------------


def is_secret_key(key: str) -> bool:
    """True for option keys whose values must never be shown."""
    lowered = key.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``options`` with secret values replaced, for printing."""
    return {k: (_REDACTED if is_secret_key(k) else v) for k, v in options.items()}


def _text(key: str, value: str) -> str:
    if not value.strip():
        raise InvalidOptionError(key, "must not be empty")
    return value.strip()


def _boolean(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        shown = _REDACTED if is_secret_key(key) else repr(value)
        raise InvalidOptionError(key, f"expected true or false, got {shown}")
    return lowered == "true"


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise InvalidOptionError(key, f"expected a positive integer, got {value!r}")
    return number


def _upper(key: str, value: str) -> str:
    return _text(key, value).upper()


def _servers(key: str, value: str) -> list[str]:
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise InvalidOptionError(key, "expected host:port[,host:port...]")
    return servers


def _hostname_check(key: str, value: str) -> bool:
    # Java's ssl.endpoint.identification.algorithm: "https" checks the host name, "" does not.
    return value.strip().lower() == "https"


CLIENT_OPTIONS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "kafka.bootstrap.servers": ("bootstrap_servers", _servers),
    "kafka.security.protocol": ("security_protocol", _upper),
    "kafka.sasl.mechanism": ("sasl_mechanism", _upper),
    "kafka.sasl.plain.username": ("sasl_plain_username", _text),
    "kafka.sasl.plain.password": ("sasl_plain_password", _text),
    "kafka.ssl.cafile": ("ssl_cafile", _text),
    "kafka.ssl.certfile": ("ssl_certfile", _text),
    "kafka.ssl.keyfile": ("ssl_keyfile", _text),
    "kafka.ssl.password": ("ssl_password", _text),
    "kafka.ssl.key.password": ("ssl_password", _text),
    "kafka.ssl.crlfile": ("ssl_crlfile", _text),
    "kafka.ssl.ciphers": ("ssl_ciphers", _text),
    "kafka.ssl.check.hostname": ("ssl_check_hostname", _boolean),
    "kafka.ssl.endpoint.identification.algorithm": ("ssl_check_hostname", _hostname_check),
    "kafka.client.id": ("client_id", _text),
    "kafka.request.timeout.ms": ("request_timeout_ms", _positive_int),
}
"""``kafka.*`` option -> (kafka-python ``KafkaConsumer`` argument, parser). SSL takes PEM files."""

_SOURCE_OPTIONS = {
    "subscribe": "subscribe",
    "startingoffsets": "startingOffsets",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss",
    "kafkaconsumer.polltimeoutms": "kafkaConsumer.pollTimeoutMs",
}


@dataclass(frozen=True, repr=False)
class KafkaSourceOptions:
    """The source's options, parsed and checked once; picklable; ``repr`` hides secrets."""

    topics: tuple[str, ...]
    starting_offsets: str | Offsets
    """``"earliest"``, ``"latest"``, or per-partition offsets (-2 earliest, -1 latest)."""
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    client_config: dict[str, Any]
    """kafka-python ``KafkaConsumer`` arguments from the ``kafka.*`` options."""

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        """Parse Spark-style string options; unknown or malformed keys raise, naming the key."""
        lowered: dict[str, str] = {}
        for key, value in options.items():
            if key.lower() in lowered:
                raise InvalidOptionError(key, "given twice (option keys are case-insensitive)")
            lowered[key.lower()] = str(value)
        client: dict[str, Any] = {}
        source: dict[str, str] = {}
        for key, value in lowered.items():
            if key in CLIENT_OPTIONS:
                arg, parse = CLIENT_OPTIONS[key]
                client[arg] = parse(key, value)
            elif key.startswith("kafka."):
                hint = " (kafka-python takes PEM files: kafka.ssl.cafile, certfile, keyfile)"
                raise InvalidOptionError(
                    key, "unknown Kafka client option" + (hint if ".ssl." in key else "")
                    + f"; supported: {', '.join(sorted(CLIENT_OPTIONS))}")
            elif key in _SOURCE_OPTIONS:
                source[_SOURCE_OPTIONS[key]] = value
            else:
                raise InvalidOptionError(
                    key, f"unknown option of the {SOURCE_NAME} source; supported: "
                    f"{', '.join(sorted(_SOURCE_OPTIONS.values()))} and kafka.* client options")
        if "bootstrap_servers" not in client:
            raise InvalidOptionError("kafka.bootstrap.servers", "is required")
        if "subscribe" not in source:
            raise InvalidOptionError("subscribe", "is required (comma-separated topic names)")
        topics = tuple(dict.fromkeys(t.strip() for t in source["subscribe"].split(",")))
        bad = [t for t in topics if not _TOPIC_RE.match(t)]
        if bad:
            raise InvalidOptionError("subscribe", f"invalid topic name(s) {bad}")
        limit = source.get("maxOffsetsPerTrigger")
        return cls(
            topics=topics,
            starting_offsets=_parse_starting_offsets(source.get("startingOffsets", "latest"),
                                                     topics),
            max_offsets_per_trigger=None if limit is None else _positive_int(
                "maxOffsetsPerTrigger", limit),
            fail_on_data_loss=_boolean("failOnDataLoss", source.get("failOnDataLoss", "true")),
            poll_timeout_ms=_positive_int(
                "kafkaConsumer.pollTimeoutMs", source.get("kafkaConsumer.pollTimeoutMs", "120000")),
            client_config=client,
        )

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """Arguments for a group-less ``KafkaConsumer`` that never commits or creates topics."""
        return {
            "group_id": None,
            "enable_auto_commit": False,
            "allow_auto_create_topics": False,
            "isolation_level": "read_uncommitted",  # Spark's default too; see _Cluster.latest
            **self.client_config,
            **overrides,
        }

    def __repr__(self) -> str:
        client = redact_options(self.client_config)
        return (f"KafkaSourceOptions(topics={self.topics!r}, "
                f"starting_offsets={self.starting_offsets!r}, "
                f"max_offsets_per_trigger={self.max_offsets_per_trigger!r}, "
                f"fail_on_data_loss={self.fail_on_data_loss!r}, client_config={client!r})")


def _parse_starting_offsets(value: str, topics: tuple[str, ...]) -> str | Offsets:
    key = "startingOffsets"
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
        offsets = offsets_from_json_dict(parsed)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidOptionError(
            key, f"expected earliest, latest or JSON like {{\"topic\": {{\"0\": 23}}}}: {exc}"
        ) from None
    for topic, parts in offsets.items():
        if topic not in topics:
            raise InvalidOptionError(key, f"topic '{topic}' is not in subscribe")
        for partition, offset in parts.items():
            if partition < 0 or offset < -2:
                raise InvalidOptionError(key, f"bad offset {offset} for {topic}-{partition}")
    return offsets


# --- offsets: JSON, Hudi checkpoints, planning --------------------------------------------------


def offsets_to_json_dict(offsets: Offsets) -> dict[str, dict[str, int]]:
    """The checkpoint form: string partition keys, topics and partitions in sorted order.

    Spark compares offsets by their JSON text, so the order must not depend on history.
    """
    return {t: {str(p): int(offsets[t][p]) for p in sorted(offsets[t])} for t in sorted(offsets)}


def offsets_from_json_dict(data: Any) -> Offsets:
    """Inverse of :func:`offsets_to_json_dict`; raises ValueError/TypeError on other shapes."""
    if not isinstance(data, dict):
        raise ValueError("offsets must be a JSON object of topics")
    out: Offsets = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise ValueError(f"offsets of topic '{topic}' must be an object of partitions")
        out[str(topic)] = {int(p): int(o) for p, o in parts.items()}
    return out


def starting_offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """``startingOffsets`` JSON resuming at ``offsets`` (next offset per topic and partition)."""
    return json.dumps(offsets_to_json_dict({t: dict(p) for t, p in offsets.items()}))


def parse_hudi_checkpoint(checkpoint: str) -> Offsets:
    """Parse Hudi's streamer checkpoint (``streamer.checkpoint.key``) into offsets.

    Hudi writes ``topic,partition:offset,partition:offset`` with the next offset to read per
    partition, one topic per string. Several topics are written as such strings joined by
    ``;`` (our extension: Kafka topic names cannot contain ``,``, ``:`` or ``;``).
    """
    out: Offsets = {}
    for part in checkpoint.strip().split(";"):
        topic, *pairs = [piece.strip() for piece in part.split(",")]
        if not _TOPIC_RE.match(topic) or not pairs or topic in out:
            raise ValueError(f"not a Hudi Kafka checkpoint: {checkpoint!r}")
        try:
            out[topic] = {int(p): int(o) for p, o in (pair.split(":") for pair in pairs)}
        except ValueError:
            raise ValueError(f"not a Hudi Kafka checkpoint: {checkpoint!r}") from None
    return out


def format_hudi_checkpoint(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """Inverse of :func:`parse_hudi_checkpoint` (partitions ascending, topics sorted)."""
    if not offsets or not all(offsets.values()):
        raise ValueError("a Hudi checkpoint needs at least one partition per topic")
    return ";".join(
        topic + "," + ",".join(f"{p}:{offsets[topic][p]}" for p in sorted(offsets[topic]))
        for topic in sorted(offsets)
    )


def _flatten(offsets: Offsets) -> dict[TopicPart, int]:
    return {(t, p): o for t, parts in offsets.items() for p, o in parts.items()}


def _nest(flat: Mapping[TopicPart, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        out.setdefault(topic, {})[partition] = offset
    return out


def split_limit(backlog: Mapping[TopicPart, int], limit: int) -> dict[TopicPart, int]:
    """How many offsets each partition may advance, ``limit`` in total, in proportion to backlog.

    Largest-remainder rounding, so the total is exactly ``min(limit, sum(backlog))``; ties go
    to the larger backlog, so small limits still rotate over all partitions across batches.
    """
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    share = {tp: lag * limit // total for tp, lag in backlog.items()}
    left = limit - sum(share.values())
    ranked = sorted(backlog, key=lambda tp: (-(backlog[tp] * limit % total), -backlog[tp], tp))
    for tp in ranked[:left]:
        share[tp] += 1
    return share


def _data_loss(message: str, fail: bool) -> None:
    if fail:
        raise KafkaDataLossError(message + ". Set failOnDataLoss=false to skip the lost records.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


def plan_end_offsets(
    start: Offsets, latest: Offsets, max_offsets: int | None, fail_on_data_loss: bool
) -> Offsets:
    """The end offsets of the next micro-batch from its start and the partitions' latest offsets.

    New partitions (in ``latest`` only) start at 0 - a task reports data loss if retention
    already removed their head. Gone partitions and offsets that moved backwards are data loss;
    without ``failOnDataLoss`` a gone partition is dropped and a partition whose offsets moved
    back resumes from its new latest offset. ``max_offsets`` is split by :func:`split_limit`.
    """
    begin, end_all = _flatten(start), _flatten(latest)
    for tp in sorted(begin.keys() - end_all.keys()):
        _data_loss(f"topic '{tp[0]}' partition {tp[1]} no longer exists", fail_on_data_loss)
    planned: dict[TopicPart, int] = {}
    backlog: dict[TopicPart, int] = {}
    for tp, latest_offset in end_all.items():
        first = begin.get(tp, 0)
        if latest_offset < first:
            _data_loss(f"topic '{tp[0]}' partition {tp[1]} offsets went back from {first} to "
                       f"{latest_offset} (topic recreated?)", fail_on_data_loss)
            planned[tp] = latest_offset
        else:
            backlog[tp] = latest_offset - first
    if max_offsets is not None:
        backlog = split_limit(backlog, max_offsets)
    for tp, advance in backlog.items():
        planned[tp] = begin.get(tp, 0) + advance
    return _nest(planned)


def check_offset_range(
    topic: str, partition: int, start: int, end: int, earliest: int, fail_on_data_loss: bool
) -> int:
    """The offset to start reading ``[start, end)`` at, given the partition's earliest offset.

    ``start < earliest`` is data loss: raises :class:`KafkaDataLossError` naming the topic,
    partition and offsets, or (``fail_on_data_loss=False``) logs a warning and skips ahead.
    """
    if start >= earliest:
        return start
    _data_loss(f"offsets {start} to {min(earliest, end) - 1} of topic '{topic}' partition "
               f"{partition} are no longer available (earliest offset is {earliest}; deleted "
               "by retention or the topic was recreated)", fail_on_data_loss)
    return min(earliest, end)


# --- the driver's view of the cluster ----------------------------------------------------------


class _Cluster:
    """Driver-side metadata and offset look-ups through one group-less ``KafkaConsumer``."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        from kafka import KafkaConsumer

        # Short fetch waits and small fetches: this consumer only probes high watermarks.
        self._consumer = KafkaConsumer(**options.consumer_config(
            fetch_max_wait_ms=20, max_partition_fetch_bytes=64 * 1024))

    def partitions(self, topics: tuple[str, ...]) -> dict[TopicPart, Any]:
        """Every current partition of ``topics`` (fresh metadata); raises if a topic is missing."""
        from kafka import TopicPartition

        self._consumer.topics()  # always refreshes the metadata cache, so new partitions show
        found = {t: self._consumer.partitions_for_topic(t) or set() for t in topics}
        missing = sorted(t for t, parts in found.items() if not parts)
        if missing:
            raise KafkaTopicNotFoundError(
                f"subscribed topic(s) {missing} do not exist on the cluster; create them first")
        return {(t, p): TopicPartition(t, p) for t in topics for p in sorted(found[t])}

    def earliest(self, tps: dict[TopicPart, Any]) -> dict[TopicPart, int]:
        """Log start offset of each partition."""
        found = self._consumer.beginning_offsets(list(tps.values()))
        return {key: int(found[tp]) for key, tp in tps.items()}

    def latest(self, tps: dict[TopicPart, Any]) -> dict[TopicPart, int]:
        """End offset (high watermark) of each partition.

        ListOffsets(latest) alone is not enough: the Tansu test broker answers the last batch's
        *base* offset + 1 when the last produce request carried several records, which would
        strand the rest of that batch. So we also fetch at the listed end and take the high
        watermark that the fetch response carries, and keep the larger of the two. On Kafka both
        are the high watermark for ``read_uncommitted`` (our isolation level), so the max
        changes nothing there; on Tansu it is the true end.
        """
        listed = self._consumer.end_offsets(list(tps.values()))
        consumer = self._consumer
        consumer.unsubscribe()  # fresh partition states: no high watermark left from last time
        consumer.assign(list(tps.values()))
        for tp in tps.values():
            consumer.seek(tp, listed[tp])
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(
                consumer.highwater(tp) is None for tp in tps.values()):
            consumer.poll(timeout_ms=50, max_records=1, update_offsets=False)
        return {key: max(int(listed[tp]), int(consumer.highwater(tp) or 0))
                for key, tp in tps.items()}

    def close(self) -> None:
        self._consumer.close()


# --- the stream reader ---------------------------------------------------------------------------


class KafkaInputPartition(InputPartition):
    """One task's work: offsets ``[start, end)`` of one topic partition. Picklable."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader over the subscribed topics; see the module docstring for who calls what.

    Construction does no I/O (Spark builds readers in planner and executor processes too); the
    driver consumer is opened on first use and closed by :meth:`stop`.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._cluster: _Cluster | None = None
        self._target: Offsets | None = None  # availableNow: never plan beyond these offsets
        self._last_latest: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cluster": None}

    def __repr__(self) -> str:
        return f"KafkaStreamReader({self.options!r})"

    def _client(self) -> _Cluster:
        if self._cluster is None:
            self._cluster = _Cluster(self.options)
        return self._cluster

    def _latest(self) -> Offsets:
        cluster = self._client()
        latest = _nest(cluster.latest(cluster.partitions(self.options.topics)))
        self._last_latest = latest
        return latest

    def initialOffset(self) -> dict[str, Any]:
        """Driver: resolve ``startingOffsets`` to concrete offsets (new queries only)."""
        cluster = self._client()
        tps = cluster.partitions(self.options.topics)
        earliest = cluster.earliest(tps)
        spec = self.options.starting_offsets
        if spec == "latest":
            return offsets_to_json_dict(_nest(cluster.latest(tps)))
        if spec == "earliest":
            return offsets_to_json_dict(_nest(earliest))
        assert isinstance(spec, dict)
        wanted = _flatten(spec)
        unknown = sorted(wanted.keys() - tps.keys())
        if unknown:
            raise InvalidOptionError("startingOffsets", f"no such partition(s): {unknown}")
        latest = cluster.latest(tps)
        chosen: dict[TopicPart, int] = {}
        for tp in tps:
            offset = wanted.get(tp, -2)
            if offset == -2:
                offset = earliest[tp]
            elif offset == -1 or offset > latest[tp]:
                if offset != -1:
                    _data_loss(f"startingOffsets {offset} for topic '{tp[0]}' partition {tp[1]}"
                               f" is past its end {latest[tp]}", self.options.fail_on_data_loss)
                offset = latest[tp]
            else:
                offset = check_offset_range(tp[0], tp[1], offset, latest[tp], earliest[tp],
                                            self.options.fail_on_data_loss)
            chosen[tp] = offset
        return offsets_to_json_dict(_nest(chosen))

    def getDefaultReadLimit(self) -> ReadLimit:
        """Driver: ``maxOffsetsPerTrigger`` as a row limit, else everything available."""
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Driver: fix the target offsets of an ``availableNow`` run at the current latest."""
        self._target = self._latest()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Driver: end offsets of the next batch (``start`` itself when nothing is new)."""
        latest = self._target if self._target is not None else self._latest()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = plan_end_offsets(offsets_from_json_dict(start), latest, max_rows,
                               self.options.fail_on_data_loss)
        return offsets_to_json_dict(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Driver: the latest offsets seen by the last look-up, for query progress."""
        return None if self._last_latest is None else offsets_to_json_dict(self._last_latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        """Driver: one input partition per topic partition with offsets in ``[start, end)``.

        Depends on nothing but its arguments, so a replayed batch reads the same ranges.
        """
        begin = _flatten(offsets_from_json_dict(start))
        return [KafkaInputPartition(t, p, begin.get((t, p), 0), stop)
                for (t, p), stop in sorted(_flatten(offsets_from_json_dict(end)).items())
                if stop > begin.get((t, p), 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: the records of ``partition``'s range as Arrow batches of <= 10k rows."""
        assert isinstance(partition, KafkaInputPartition)
        return _read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Driver: nothing to do; offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        """Driver: close the metadata consumer."""
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


def _read_range(options: KafkaSourceOptions, part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Read exactly the records with offsets in ``[part.start, part.end)`` (executor side).

    Offsets may be missing inside the range (compaction, transaction markers): the loop follows
    the consumer's position, which moves past them, and stops at ``end``, never waiting for
    offsets that cannot come.
    """
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    _warn_if_crc_in_python()
    tp = TopicPartition(part.topic, part.partition)
    fail = options.fail_on_data_loss
    consumer = KafkaConsumer(**options.consumer_config(
        auto_offset_reset="none", max_partition_fetch_bytes=8 << 20, fetch_max_wait_ms=100))
    try:
        consumer.assign([tp])
        position = check_offset_range(part.topic, part.partition, part.start, part.end,
                                      int(consumer.beginning_offsets([tp])[tp]), fail)
        if position >= part.end:
            return
        consumer.seek(tp, position)
        pending: list[Any] = []
        idle_since = time.monotonic()
        while position < part.end:
            try:
                fetched = consumer.poll(timeout_ms=500, max_records=BATCH_ROWS).get(tp, [])
            except OffsetOutOfRangeError:  # retention overtook us while reading
                earliest = int(consumer.beginning_offsets([tp])[tp])
                position = check_offset_range(part.topic, part.partition, position, part.end,
                                              earliest, fail)
                consumer.seek(tp, position)
                continue
            for record in fetched:
                if record.offset >= part.end:
                    break
                pending.append(record)
            while len(pending) >= BATCH_ROWS:
                yield _to_batch(part.topic, part.partition, pending[:BATCH_ROWS])
                del pending[:BATCH_ROWS]
            new_position = max(int(consumer.position(tp)), position)
            if fetched and fetched[-1].offset >= part.end:
                new_position = part.end
            if new_position > position:
                position, idle_since = new_position, time.monotonic()
                continue
            highwater = consumer.highwater(tp)
            if highwater is not None and highwater <= position:
                _data_loss(f"topic '{part.topic}' partition {part.partition} ends at {highwater}"
                           f" but offsets up to {part.end} were planned", fail)
                break
            if (time.monotonic() - idle_since) * 1000 > options.poll_timeout_ms:
                raise KafkaReadTimeoutError(
                    f"no records from topic '{part.topic}' partition {part.partition} between "
                    f"offsets {position} and {part.end} within {options.poll_timeout_ms} ms")
        if pending:
            yield _to_batch(part.topic, part.partition, pending)
    finally:
        consumer.close()


@functools.cache
def _warn_if_crc_in_python() -> None:
    from kafka.record import util

    if getattr(util, "crc32c_c", True) is None:
        log.warning("kafka-python checks record CRCs in pure Python, which cuts read throughput "
                    "about 4x: install the 'crc32c' package (kafka-python[crc32c])")


def _to_batch(topic: str, partition: int, records: list[Any]) -> pa.RecordBatch:
    """Kafka-python ``ConsumerRecord`` tuples to one batch of :data:`ARROW_SCHEMA`."""
    n = len(records)
    _, _, _, offsets, stamps, _, keys, values, headers, *_ = zip(*records, strict=True)
    millis = np.fromiter(stamps, dtype=np.int64, count=n)
    header_type = ARROW_SCHEMA.field("headers").type
    if any(headers):
        header_array = pa.array([h or None for h in headers], type=header_type)
    else:
        header_array = pa.nulls(n, header_type)
    return pa.RecordBatch.from_arrays([
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(np.fromiter(offsets, dtype=np.int64, count=n)),
        pa.array(millis * 1000, pa.timestamp("us", tz="UTC")),
        header_array,
    ], schema=ARROW_SCHEMA)


# --- the data source and helpers ----------------------------------------------------------------


def kafka_spark_schema() -> StructType:
    """:data:`KAFKA_DDL` as a ``StructType``, built without a SparkSession (for executors)."""
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("headers", ArrayType(header)),
    ])


class KafkaDataSource(DataSource):
    """``spark.readStream.format("tidelake-kafka")``: streaming reads only; options checked early.

    Spark pickles this object (with its options) to the driver's source process and to
    executors; ``repr`` hides secret option values.
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        KafkaSourceOptions.from_options(self.options)  # fail at load(), naming the bad key
        return kafka_spark_schema()

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(KafkaSourceOptions.from_options(self.options))

    def __repr__(self) -> str:
        return f"KafkaDataSource({redact_options(dict(self.options))!r})"


_REDACTION_CONF = "spark.sql.redaction.options.regex"
_REDACTION_PATTERN = "password|secret|token|sasl\\.jaas"


def register(spark: SparkSession) -> None:
    """Register :class:`KafkaDataSource` as ``tidelake-kafka`` and hide secrets in plans.

    Spark's default redaction hides keys matching ``secret|password|token``; this appends our
    markers (``sasl.jaas`` too) to ``spark.sql.redaction.options.regex`` of this session.
    """
    spark.dataSource.register(KafkaDataSource)
    _extend_redaction(spark)


def _extend_redaction(spark: SparkSession) -> None:
    current = spark.conf.get(_REDACTION_CONF) or "(?i)url"
    if _REDACTION_PATTERN not in current:
        prefix = "" if current.startswith("(?i)") else "(?i)"
        spark.conf.set(_REDACTION_CONF, f"{prefix}{current}|{_REDACTION_PATTERN}")


def read_kafka_stream(
    spark: SparkSession, options: Mapping[str, str], use_builtin: bool = False
) -> DataFrame:
    """A streaming DataFrame of :data:`KAFKA_DDL` rows from Kafka.

    ``use_builtin=False`` uses this module's source (options checked here, raising
    :class:`InvalidOptionError` before anything starts). ``use_builtin=True`` uses Spark's own
    ``kafka`` format, which needs the ``spark-sql-kafka-0-10`` jar on the classpath and takes
    Java client options (``kafka.sasl.jaas.config``, truststores, ...) unchecked.
    """
    if use_builtin:
        _extend_redaction(spark)
        frame = (spark.readStream.format("kafka").options(**options)
                 .option("includeHeaders", "true").load())
        return frame.select("key", "value", "topic", "partition", "offset", "timestamp", "headers")
    KafkaSourceOptions.from_options(options)
    register(spark)
    return spark.readStream.format(SOURCE_NAME).options(**options).load()
