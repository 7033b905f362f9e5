"""Every ``hoodie.*`` / ``tidelake.*`` key the engine understands, declared once.

Two kinds of configuration exist:

* :class:`TableConfig` — what ``.hoodie/hoodie.properties`` persists for the table's whole
  life (type, keys, partitioning, merge mode). Parsed once from the properties file.
* :class:`WriteConfig` — per-writer options a user passes to ``Table.create(options=...)``
  or ``Table.open(options=...)`` (index type, block format, file sizing). Unknown keys are
  an :class:`~engine.errors.InvalidOptionError` naming the key.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any, Generic, TypeVar

from engine.errors import InvalidOptionError, UnsupportedTableError
from engine.timeline.version import WRITE_TABLE_VERSION, WRITE_VERSIONS, TableVersion, table_version

T = TypeVar("T")

TABLE_VERSION = 8
TIMELINE_LAYOUT_VERSION = 2

EVENT_TIME_STRATEGY_ID = "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5"
COMMIT_TIME_STRATEGY_ID = "ce9acb64-bde0-424c-9b91-f6ebba25356d"
DEFAULT_PAYLOAD = "org.apache.hudi.common.model.DefaultHoodieRecordPayload"
OVERWRITE_PAYLOAD = "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload"


class TableType(str, Enum):
    """Hudi table types."""

    COPY_ON_WRITE = "COPY_ON_WRITE"
    MERGE_ON_READ = "MERGE_ON_READ"


class MergeMode(str, Enum):
    """How two versions of the same record are resolved (``hoodie.record.merge.mode``)."""

    EVENT_TIME_ORDERING = "EVENT_TIME_ORDERING"
    COMMIT_TIME_ORDERING = "COMMIT_TIME_ORDERING"


def orders_by_event_time(mode: MergeMode, ordering_field: str | None) -> bool:
    """True when versions of a key are ordered by their ordering (precombine) field value:
    ``EVENT_TIME_ORDERING`` with an ordering field. Otherwise they are ordered by arrival
    (commit time, then position in the batch). The one rule every merger, writer and index
    asks (:attr:`TableConfig.orders_by_event_time` for a table)."""
    return mode is MergeMode.EVENT_TIME_ORDERING and bool(ordering_field)


class IndexType(str, Enum):
    """Write-side tagging index (``hoodie.index.type``)."""

    BUCKET = "BUCKET"
    SIMPLE = "SIMPLE"
    GLOBAL_SIMPLE = "GLOBAL_SIMPLE"
    BLOOM = "BLOOM"
    GLOBAL_BLOOM = "GLOBAL_BLOOM"
    RECORD_INDEX = "RECORD_INDEX"

    @property
    def is_global(self) -> bool:
        """Looks a key up in the whole table (a key lives once in it, and moves)."""
        return self in (IndexType.GLOBAL_SIMPLE, IndexType.GLOBAL_BLOOM, IndexType.RECORD_INDEX)

    @property
    def uses_bloom(self) -> bool:
        """Prunes the lookup by base-file footers (``engine/index/bloom.py``)."""
        return self in (IndexType.BLOOM, IndexType.GLOBAL_BLOOM)

    @property
    def placement(self) -> IndexType:
        """The index whose key placement this one shares: a BLOOM lookup finds exactly what a
        SIMPLE one finds (GLOBAL_BLOOM and GLOBAL_SIMPLE alike; RECORD_INDEX looks up where
        GLOBAL_SIMPLE finds a key), so either may write the other's tables."""
        return {IndexType.BLOOM: IndexType.SIMPLE,
                IndexType.GLOBAL_BLOOM: IndexType.GLOBAL_SIMPLE,
                IndexType.RECORD_INDEX: IndexType.GLOBAL_SIMPLE}.get(self, self)


class BucketEngine(str, Enum):
    """How the BUCKET index maps keys to file groups (``hoodie.index.bucket.engine``)."""

    SIMPLE = "SIMPLE"
    """A fixed number of buckets per partition (Java ``List.hashCode`` of the key)."""
    CONSISTENT_HASHING = "CONSISTENT_HASHING"
    """RFC-42: a hash ring per partition (``engine/index/consistent_hashing.py``)."""


class ConcurrencyMode(str, Enum):
    """How concurrent writers of one table are kept apart (``hoodie.write.concurrency.mode``)."""

    SINGLE_WRITER = "SINGLE_WRITER"
    OPTIMISTIC_CONCURRENCY_CONTROL = "OPTIMISTIC_CONCURRENCY_CONTROL"
    NON_BLOCKING_CONCURRENCY_CONTROL = "NON_BLOCKING_CONCURRENCY_CONTROL"


SINGLE_WRITER_KEY = "tidelake.storage.allow.unsafe.single.writer"
"""The opt-out that lets a table be written on an object store that ignores conditional
writes (:mod:`engine.storage.conditional`), as delta-rs's ``AWS_S3_ALLOW_UNSAFE_RENAME``."""

FS_LOCK_PROVIDER = "org.apache.hudi.client.transaction.lock.FileSystemBasedLockProvider"
IN_PROCESS_LOCK_PROVIDER = "org.apache.hudi.client.transaction.lock.InProcessLockProvider"
LOCK_PROVIDERS = (FS_LOCK_PROVIDER, IN_PROCESS_LOCK_PROVIDER)


class CompactionTrigger(str, Enum):
    """``hoodie.compact.inline.trigger.strategy``: when a compaction is due."""

    NUM_COMMITS = "NUM_COMMITS"
    NUM_COMMITS_AFTER_LAST_REQUEST = "NUM_COMMITS_AFTER_LAST_REQUEST"
    TIME_ELAPSED = "TIME_ELAPSED"
    NUM_AND_TIME = "NUM_AND_TIME"
    NUM_OR_TIME = "NUM_OR_TIME"


class CleanerPolicy(str, Enum):
    """``hoodie.cleaner.policy``: which file slices the cleaner keeps."""

    KEEP_LATEST_COMMITS = "KEEP_LATEST_COMMITS"
    KEEP_LATEST_FILE_VERSIONS = "KEEP_LATEST_FILE_VERSIONS"
    KEEP_LATEST_BY_HOURS = "KEEP_LATEST_BY_HOURS"


LAYOUT_STRATEGIES = ("linear", "z-order", "hilbert")
"""``hoodie.layout.optimize.strategy`` values (``zorder`` is accepted for ``z-order``)."""

COMPACTION_STRATEGIES = ("UnBoundedCompactionStrategy", "LogFileSizeBasedCompactionStrategy")
"""``hoodie.compaction.strategy`` values: every file slice with logs (tidelake's default), or
Hudi's default, the slices with the most log bytes up to ``hoodie.compaction.target.io``."""


class LogBlockFormat(str, Enum):
    """Data block format of MOR log files (``hoodie.logfile.data.block.format``)."""

    AVRO = "avro"
    PARQUET = "parquet"


class KeyGeneratorType(str, Enum):
    """Hudi 1.x key generator types (``hoodie.table.keygenerator.type``)."""

    SIMPLE = "SIMPLE"
    COMPLEX = "COMPLEX"
    NON_PARTITION = "NON_PARTITION"


HUDI_KEYGEN_TYPES = {
    "SIMPLE": "org.apache.hudi.keygen.SimpleKeyGenerator",
    "SIMPLE_AVRO": "org.apache.hudi.keygen.SimpleAvroKeyGenerator",
    "COMPLEX": "org.apache.hudi.keygen.ComplexKeyGenerator",
    "COMPLEX_AVRO": "org.apache.hudi.keygen.ComplexAvroKeyGenerator",
    "TIMESTAMP": "org.apache.hudi.keygen.TimestampBasedKeyGenerator",
    "TIMESTAMP_AVRO": "org.apache.hudi.keygen.TimestampBasedAvroKeyGenerator",
    "CUSTOM": "org.apache.hudi.keygen.CustomKeyGenerator",
    "CUSTOM_AVRO": "org.apache.hudi.keygen.CustomAvroKeyGenerator",
    "NON_PARTITION": "org.apache.hudi.keygen.NonpartitionedKeyGenerator",
    "NON_PARTITION_AVRO": "org.apache.hudi.keygen.NonpartitionedAvroKeyGenerator",
    "GLOBAL_DELETE": "org.apache.hudi.keygen.GlobalDeleteKeyGenerator",
    "GLOBAL_DELETE_AVRO": "org.apache.hudi.keygen.GlobalAvroDeleteKeyGenerator",
    "AUTO_RECORD": "org.apache.hudi.keygen.AutoRecordGenWrapperKeyGenerator",
    "AUTO_RECORD_AVRO": "org.apache.hudi.keygen.AutoRecordGenWrapperAvroKeyGenerator",
    "HOODIE_TABLE_METADATA": "org.apache.hudi.metadata.HoodieTableMetadataKeyGenerator",
    "SPARK_SQL": "org.apache.spark.sql.hudi.command.SqlKeyGenerator",
    "SPARK_SQL_UUID": "org.apache.spark.sql.hudi.command.UuidKeyGenerator",
    "SPARK_SQL_MERGE_INTO": "org.apache.spark.sql.hudi.command.MergeIntoKeyGenerator",
}
"""Hudi's own key generators, type to class (``KeyGeneratorType``); any other class is
``USER_PROVIDED`` (``KeyGeneratorType.fromClassName``)."""

KEYGEN_CLASSES = {kind: HUDI_KEYGEN_TYPES[kind.value] for kind in KeyGeneratorType}
"""The class tidelake records for each key generator type it writes."""
CUSTOM_KEYGEN_TYPES = ("CUSTOM", "CUSTOM_AVRO")
"""Hudi's custom key generators' types (Hudi 1.x records the type, not the class)."""
CUSTOM_KEYGEN_CLASSES = tuple(HUDI_KEYGEN_TYPES[kind] for kind in CUSTOM_KEYGEN_TYPES)
"""Their classes (``hoodie.table.keygenerator.class``, as older tables record them)."""


def parse_flag(key: str, raw: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``) of the option ``key``;
    :class:`~engine.errors.InvalidOptionError` naming it for anything else."""
    return _parse_bool(key, raw)


def _parse_bool(key: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidOptionError(key, f"expected true or false, got {raw!r}")


def _parse_bool_or_auto(key: str, raw: str) -> bool | None:
    if raw.strip().lower() in ("", "auto"):
        return None
    return _parse_bool(key, raw)


def _parse_positive_int(key: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(key, f"expected a whole number, got {raw!r}") from None
    if value <= 0:
        raise InvalidOptionError(key, f"must be positive, got {value}")
    return value


def _parse_positive_float(key: str, raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(key, f"expected a number, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise InvalidOptionError(key, f"must be a positive number, got {raw!r}")
    return value


def _parse_probability(key: str, raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(key, f"expected a number, got {raw!r}") from None
    if not 0.0 < value < 1.0:
        raise InvalidOptionError(key, f"must be between 0 and 1 (exclusive), got {raw!r}")
    return value


def _parse_minutes(key: str, raw: str) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(key, f"expected a number of minutes, got {raw!r}") from None
    if value < 0 or value != value:
        raise InvalidOptionError(key, f"must be 0 (never) or positive, got {raw!r}")
    return value


def _parse_lock_provider(key: str, raw: str) -> str:
    value = str(raw).strip()
    if value not in LOCK_PROVIDERS:
        raise InvalidOptionError(key, f"expected one of {', '.join(LOCK_PROVIDERS)}, "
                                 f"got {raw!r}")
    return value


def _parse_concurrency_mode(key: str, raw: str) -> ConcurrencyMode:
    wanted = str(raw).strip().upper()
    for mode in ConcurrencyMode:
        if wanted == mode.value:
            return mode
    choices = ", ".join(m.value for m in ConcurrencyMode)
    raise InvalidOptionError(key, f"expected one of {choices}, got {raw!r}")


def _parse_count(key: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(key, f"expected a whole number, got {raw!r}") from None
    if value < 0:
        raise InvalidOptionError(key, f"must be 0 or more, got {value}")
    return value


def _parse_text(key: str, raw: str) -> str:
    return str(raw).strip()


def _parse_columns(key: str, raw: str) -> tuple[str, ...]:
    items = [c.strip() for c in str(raw).split(",")]
    items = [c for c in items if c]
    if len(set(items)) != len(items):
        raise InvalidOptionError(key, f"a column is named twice in {raw!r}")
    return tuple(items)


def _parse_layout_strategy(key: str, raw: str) -> str:
    value = str(raw).strip().lower().replace("_", "-")
    if value == "zorder":
        value = "z-order"
    if value not in LAYOUT_STRATEGIES:
        raise InvalidOptionError(key, f"expected one of {', '.join(LAYOUT_STRATEGIES)}, "
                                 f"got {raw!r}")
    return value


def _parse_compaction_strategy(key: str, raw: str) -> str:
    value = str(raw).strip()
    short = value.rsplit(".", 1)[-1]
    if short not in COMPACTION_STRATEGIES:
        raise InvalidOptionError(
            key, f"expected one of {', '.join(COMPACTION_STRATEGIES)} (or Hudi's class name "
            f"org.apache.hudi.table.action.compact.strategy.<name>), got {raw!r}")
    return short


METRICS_REPORTERS = ("GRAPHITE", "INMEMORY", "JMX", "DATADOG", "CONSOLE",
                     "PROMETHEUS_PUSHGATEWAY", "PROMETHEUS", "CLOUDWATCH", "M3")
"""Hudi's ``hoodie.metrics.reporter.type`` values; tidelake's job has ``PROMETHEUS`` only."""


def _parse_metrics_reporter(key: str, raw: str) -> str:
    value = str(raw).strip().upper()
    if value == "PROMETHEUS":
        return value
    if value in METRICS_REPORTERS:
        raise InvalidOptionError(key, f"Hudi's {value} reporter is not available in tidelake; "
                                 "PROMETHEUS (an HTTP endpoint to scrape) is")
    raise InvalidOptionError(key, f"expected PROMETHEUS, got {raw!r}")


def _parse_port(key: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidOptionError(key, f"expected a TCP port number, got {raw!r}") from None
    if not 1 <= value <= 65535:
        raise InvalidOptionError(key, f"expected a TCP port from 1 to 65535, got {value}")
    return value


def _parse_write_version(key: str, raw: str) -> int:
    text = str(raw).strip()
    if text not in {str(v) for v in WRITE_VERSIONS}:
        raise InvalidOptionError(
            key, f"expected one of {', '.join(str(v) for v in WRITE_VERSIONS)} (the table "
            f"version this writer stores the table in), got {raw!r}")
    return int(text)


def _enum_parser(enum_type: type[Enum]) -> Callable[[str, str], Any]:
    def parse(key: str, raw: str) -> Any:
        wanted = str(raw).strip()
        for member in enum_type:
            if wanted.upper() == str(member.value).upper():
                return member
        choices = ", ".join(str(m.value) for m in enum_type)
        raise InvalidOptionError(key, f"expected one of {choices}, got {raw!r}")

    return parse


@dataclass(frozen=True)
class ConfigKey(Generic[T]):
    """One declared option: its key, parser, default, doc and accepted aliases.

    ``attr`` names the field the option fills; ``shown`` is the default as the docs show it
    when the value alone does not say it (an unset default that means something); ``group``
    names the table of docs/configuration.md that lists the option (:func:`describe_options`).
    """

    key: str
    parse: Callable[[str, str], T]
    default: T
    doc: str
    aliases: tuple[str, ...] = ()
    attr: str = ""
    shown: str = ""
    group: str = ""

    @property
    def default_text(self) -> str:
        """The default as docs/configuration.md shows it."""
        if self.shown:
            return self.shown
        value: Any = self.default
        if value is None or value == () or value == "":
            return "none"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, Enum):
            return f"`{value.value}`"
        return f"`{value}`"


def option(key: str, parse: Callable[[str, str], T], default: T, doc: str, *,
           aliases: tuple[str, ...] = (), shown: str = "", group: str = "writer") -> T:
    """Declare a :class:`WriteConfig` field as the option ``key``: the field's default is
    ``default``, :meth:`WriteConfig.from_options` parses the key (and its ``aliases``) with
    ``parse``, and docs/configuration.md lists it with ``doc`` — declared once, here."""
    spec: ConfigKey[T] = ConfigKey(key, parse, default, doc, aliases, shown=shown, group=group)
    return field(default=default, metadata={"option": spec})


ROLLING_METADATA_KEYS = "hoodie.write.rolling.metadata.keys"

_CODECS = ("snappy", "zstd", "gzip", "none", "uncompressed", "lz4", "brotli")


def _codec(key: str, raw: str) -> str:
    value = str(raw).strip().lower()
    if value not in _CODECS:
        raise InvalidOptionError(key, f"expected one of {', '.join(_CODECS)}, got {raw!r}")
    return "none" if value == "uncompressed" else value


@dataclass(frozen=True)
class WriteConfig:
    """Typed writer options, each field declared once by :func:`option` (key, parser,
    default, doc); build with :meth:`from_options`."""

    index_type: IndexType = option(
        "hoodie.index.type", _enum_parser(IndexType), IndexType.SIMPLE,
        "Write-side index. `BUCKET`: the key's hash picks one of a fixed number of file groups per "
        "partition (Hudi's bucket index, bit for bit: Java `List<String>.hashCode`), no lookup; "
        "`SIMPLE`: join incoming keys with the keys stored in the batch's partitions; "
        "`GLOBAL_SIMPLE`: join with all keys of the table, so a record whose partition value "
        "changed is found (it moves: `hoodie.simple.index.update.partition.path`); `BLOOM` / "
        "`GLOBAL_BLOOM`: the same lookups, "
        "reading only the base files whose footer min/max keys and bloom filter admit an "
        "incoming key (slices with log files are read whole); `RECORD_INDEX`: global, the key's "
        "location is looked up in the metadata table's `record_index` partition (only the MDT "
        "file groups the batch's keys hash to are read, their base HFiles through the block "
        "index; docs/engine.md, \"Record index\"), needs the metadata table. Stored in "
        "`hoodie.properties` at "
        "creation and fixed for the table's life: `Table.open` with another value (including "
        "`SIMPLE` ↔ `GLOBAL_SIMPLE`) raises `InvalidOptionError` naming this key, except "
        "`SIMPLE` ↔ `BLOOM` and `GLOBAL_SIMPLE` ↔ `GLOBAL_BLOOM` ↔ `RECORD_INDEX`, which find "
        "the same keys.")
    bucket_engine: BucketEngine = option(
        "hoodie.index.bucket.engine", _enum_parser(BucketEngine), BucketEngine.SIMPLE,
        "How `BUCKET` maps keys to file groups: `SIMPLE` (a fixed number of buckets per partition) "
        "or `CONSISTENT_HASHING` (Hudi's RFC-42: a hash ring per partition in "
        "`.hoodie/.bucket_index/consistent_hashing_metadata/`, starting from "
        "`hoodie.bucket.index.num.buckets` buckets; file ids `<uuid>-0`; MERGE_ON_READ only, "
        "optimistic concurrency). Stored in `hoodie.properties` and fixed for the table's life. "
        "With `CONSISTENT_HASHING` a clustering resizes the buckets (see the "
        "`hoodie.bucket.index.*` keys below); the engine API and the streaming job "
        "(`index.bucket_engine` in a job file, the `BUCKET` index; `GLOBAL_STATE` is refused "
        "naming this key) write such tables.")
    bucket_max_num_buckets: int | None = option(
        "hoodie.bucket.index.max.num.buckets", _parse_positive_int, None,
        "`CONSISTENT_HASHING`: the most buckets a partition may grow to by splits. Unset, no "
        "bucket splits (as in Hudi).", shown="`hoodie.bucket.index.num.buckets`")
    bucket_min_num_buckets: int | None = option(
        "hoodie.bucket.index.min.num.buckets", _parse_positive_int, None,
        "`CONSISTENT_HASHING`: the fewest buckets a partition may shrink to by merges. Unset, no "
        "buckets merge (as in Hudi).", shown="`hoodie.bucket.index.num.buckets`")
    bucket_split_threshold: float = option(
        "hoodie.bucket.index.split.threshold", _parse_positive_float, 2.0,
        "`CONSISTENT_HASHING`: a bucket whose file slice (base and logs) exceeds this times "
        "`hoodie.parquet.max.file.size` splits in two at the next resize (a clustering: "
        "`Table.cluster()`, `tidelake table cluster`, or inline/async clustering).")
    bucket_merge_threshold: float = option(
        "hoodie.bucket.index.merge.threshold", _parse_positive_float, 0.2,
        "`CONSISTENT_HASHING`: ring-adjacent buckets below this times "
        "`hoodie.parquet.max.file.size` merge at the next resize.")
    num_buckets: int = option(
        "hoodie.bucket.index.num.buckets", _parse_positive_int, 4,
        "Buckets (file groups) per partition for `BUCKET`. Fixed for the table's life (stored at "
        "creation; opening with another value is an error). Hudi's own default is 256.")
    log_block_format: LogBlockFormat = option(
        "hoodie.logfile.data.block.format", _enum_parser(LogBlockFormat), LogBlockFormat.PARQUET,
        "Data block format of merge-on-read log files: `parquet` or `avro`. Hudi's own default for "
        "parquet base files is `avro`; tidelake writes `parquet` blocks unless told otherwise: "
        "2.5x smaller than the same rows in Avro, upserts ~45% faster, snapshot reads of slices "
        "with logs ~1.4x faster (docs/benchmarks.md, \"Table services\"). Hudi's Java readers read "
        "both (Spark-written tables with parquet blocks are among `tests/fixtures/hudi-samples`), "
        "hudi-rs too; an existing table's logs stay readable whichever format a writer picks.")
    max_file_size: int = option(
        "hoodie.parquet.max.file.size", _parse_positive_int, 120 * 1024 * 1024,
        "Target base file size; inserts open new file groups of this size.",
        shown="`125829120` (120 MiB)")
    small_file_limit: int = option(
        "hoodie.parquet.small.file.limit", _parse_positive_int, 100 * 1024 * 1024,
        "File groups smaller than this take new inserts first.", shown="`104857600` (100 MiB)")
    record_size_estimate: int = option(
        "hoodie.copyonwrite.record.size.estimate", _parse_positive_int, 1024,
        "Bytes per record assumed until a commit has measured it.")
    compression: str = option(
        "hoodie.parquet.compression.codec", _codec, "snappy",
        "`snappy`, `zstd`, `gzip`, `lz4`, `brotli` or `none`.")
    combine_before_upsert: bool = option(
        "hoodie.combine.before.upsert", _parse_bool, True,
        "Combine records with the same key within one write by the merge mode: on (key, partition "
        "path) with `SIMPLE`, `BLOOM` and `BUCKET`, on the key alone with `GLOBAL_SIMPLE` and "
        "`GLOBAL_BLOOM` (as Hudi).")
    set_null_for_missing_columns: bool = option(
        "hoodie.write.set.null.for.missing.columns", _parse_bool, False,
        "A write whose input lacks columns of the table schema writes nulls for them (the "
        "table keeps them); off, such a write is refused naming the column, as Hudi refuses "
        "it. New input columns and widened types evolve the table either way "
        "(docs/engine.md, \"Schema evolution\").")
    write_bloom_filter: bool = option(
        "hoodie.bloom.filter.enable", _parse_bool, True,
        "Write Hudi's bloom filter and min/max record key into base file footers (used by the "
        "`BLOOM` / `GLOBAL_BLOOM` index, here and in Java writers; readers do not need them). "
        "Off, those indexes read every slice in scope, as `SIMPLE` does.",
        aliases=("tidelake.write.bloom.filter",))
    bloom_num_entries: int = option(
        "hoodie.index.bloom.num_entries", _parse_positive_int, 60_000,
        "Keys per row of a base file's `DYNAMIC_V0` bloom filter, at most: a file of fewer keys "
        "gets a row sized for its own keys (Java always sizes for this many, ~323 KB at the "
        "defaults; readers take the size from the filter), a larger file rows of this size.")
    bloom_fpp: float = option(
        "hoodie.index.bloom.fpp", _parse_probability, 1e-9,
        "Target false-positive probability of each bloom filter row.")
    bloom_max_entries: int = option(
        "hoodie.bloom.index.filter.dynamic.max.entries", _parse_positive_int, 100_000,
        "A `DYNAMIC_V0` filter sized at `hoodie.index.bloom.num_entries` grows by rows up to "
        "this many keys (Java's rule; beyond it keys share the rows).")
    bloom_prune_by_ranges: bool = option(
        "hoodie.bloom.index.prune.by.ranges", _parse_bool, True,
        "`BLOOM`/`GLOBAL_BLOOM`: skip base files whose footer min/max record keys exclude every "
        "incoming key before testing their bloom filters.")
    bloom_use_metadata: bool = option(
        "hoodie.bloom.index.use.metadata", _parse_bool, False,
        "`BLOOM`/`GLOBAL_BLOOM`: take the candidate files' bloom filters from the metadata "
        "table's `bloom_filters` partition, and their min/max record keys from its "
        "`column_stats` partition, when the table keeps them (files without an entry: their "
        "footers), instead of opening every base file's footer.")
    simple_update_partition_path: bool = option(
        "hoodie.simple.index.update.partition.path", _parse_bool, True,
        "`GLOBAL_SIMPLE`: an update whose partition value changed moves the record (`true`: "
        "its old copy is deleted, it is inserted into its new partition) or updates it where "
        "the table stores it (`false`: its `_hoodie_partition_path` stays the stored one, its "
        "columns are the update's). Hudi's key and default (`HoodieIndexConfig`).")
    bloom_update_partition_path: bool = option(
        "hoodie.bloom.index.update.partition.path", _parse_bool, True,
        "`GLOBAL_BLOOM`: as `hoodie.simple.index.update.partition.path`. Hudi's key and "
        "default.")
    record_update_partition_path: bool = option(
        "hoodie.record.index.update.partition.path", _parse_bool, True,
        "`RECORD_INDEX` (the engine's and the streaming job's): as "
        "`hoodie.simple.index.update.partition.path`. Java's default is `false`; tidelake's is "
        "`true`, as for the other global indexes (docs/engine.md, \"Differences from Hudi's "
        "Java writer, on purpose\").")
    write_table_version: int = option(
        WRITE_TABLE_VERSION, _parse_write_version, TABLE_VERSION,
        "The table version a new table is created in: `8` (Hudi 1.0), `9` (Hudi 1.1 and 1.2; "
        "see [table-version-9.md](table-version-9.md)), or `6` (Hudi 0.14/0.15) "
        "for readers that only read version 6 (Athena, older Trino, daft). On an existing table "
        "it must name the table's version, or be left out: a table is never upgraded nor "
        "downgraded. A version-6 table keeps no metadata table; see "
        "[engine.md](engine.md#table-versions). The default stays `8` although Hudi 1.1+ "
        "creates `9`: readers limited to Hudi 1.0 cannot read a version-9 table and tidelake "
        "never downgrades one, while a Java 1.1+ writer upgrades a version-8 table itself (its "
        "`hoodie.write.auto.upgrade`); and not every tidelake test runs on 9 yet "
        "([table-version-9.md](table-version-9.md) §10, step 9).")
    concurrency_mode: ConcurrencyMode | None = option(
        "hoodie.write.concurrency.mode", _parse_concurrency_mode, None,
        "`SINGLE_WRITER`, `OPTIMISTIC_CONCURRENCY_CONTROL` (a commit that overlaps a concurrent "
        "one on a file group is refused with `WriteConflictError`) or "
        "`NON_BLOCKING_CONCURRENCY_CONTROL` (concurrent writers all succeed; MERGE_ON_READ with "
        "`hoodie.index.type=BUCKET` and its SIMPLE engine only, as Hudi, and refused for a writer "
        "that keeps the metadata table's `record_index`, whose entries each writer would compute "
        "from its own snapshot). See [engine.md](engine.md#several-writers).",
        shown="non-blocking for MERGE_ON_READ + BUCKET with a precombine field and no record "
        "index kept, else optimistic")
    lock_provider: str = option(
        "hoodie.write.lock.provider", _parse_lock_provider, FS_LOCK_PROVIDER,
        "The table lock: the file `.hoodie/lock` (local or shared file system), or "
        "`org.apache.hudi.client.transaction.lock.InProcessLockProvider` (threads of one process).")
    lock_wait_ms: int = option(
        "hoodie.write.lock.wait_time_ms", _parse_positive_int, 60_000,
        "How long a writer waits for the lock before `LockTimeoutError`.")
    lock_expire_minutes: float = option(
        "hoodie.write.lock.filesystem.expire", _parse_minutes, 1.0,
        "A file-system lock its holder stopped renewing for this long is stale and is broken (so "
        "is the lock of a holder whose release failed: it stops renewing it); `0`: never, on "
        "local and shared file systems only (refused on an object store, where a crashed "
        "writer's lock would then stay for good).", shown="`1` (minutes)")
    allow_unsafe_single_writer: bool = option(
        SINGLE_WRITER_KEY, _parse_bool, False,
        "Object stores only. Before its first write to a store and bucket, a process checks "
        "that the store enforces conditional writes (a second create-if-absent of a probe "
        "object in `.hoodie/.aux/` must answer 412) and refuses a store that ignores them "
        "(older MinIO, Ceph RGW, some appliances) with `ConditionalWriteUnsupportedError`: "
        "there two writers could both complete one instant or hold the lock, and commits "
        "would be lost silently. `true` writes on such a store anyway, with one warning: only "
        "for a table that exactly one process ever writes (as delta-rs's "
        "`AWS_S3_ALLOW_UNSAFE_RENAME`, also taken among the storage options, so the command "
        "line's `--storage-option` and a job's `[table.storage]` can set it). Local and "
        "mounted file systems are never probed.")
    heartbeat_interval_ms: int = option(
        "hoodie.client.heartbeat.interval_in_ms", _parse_positive_int, 60_000,
        "How often a writer refreshes the heartbeat of its pending instant.")
    heartbeat_tolerable_misses: int = option(
        "hoodie.client.heartbeat.tolerable.misses", _parse_positive_int, 2,
        "A pending instant whose heartbeat is older than interval x misses counts as failed; the "
        "next writer rolls it back.")
    rolling_metadata_keys: tuple[str, ...] = option(
        ROLLING_METADATA_KEYS, _parse_columns, (),
        "extraMetadata keys (comma-separated) that commits of table services copy from the newest "
        "commit carrying them, so that a checkpoint recorded there (a streaming job's Kafka "
        "offsets) survives compactions, clusterings and archival. The streaming job sets its "
        "checkpoint keys.", group="services")
    metadata_enable: bool | None = option(
        "hoodie.metadata.enable", _parse_bool_or_auto, None,
        "Keep the metadata table (`.hoodie/metadata`, Hudi's MDT): its `files` partition lists "
        "every committed data file, so writers, services and readers (ours, hudi-rs, Java) list "
        "nothing in the table folder. A writer creates it at its first write when the table has "
        "none (from a listing of the committed files) and adds one MDT deltacommit to every "
        "action before the action completes; `false` deletes it, as Hudi does, so that no reader "
        "trusts a metadata table nobody keeps. Default: on, except for tables written in "
        "`NON_BLOCKING_CONCURRENCY_CONTROL` mode (MERGE_ON_READ bucket tables by default), whose "
        "new file groups have only log files: hudi-rs 0.5.0 drops such groups when it lists "
        "through a metadata table (docs/engine.md, \"Metadata table\"); `true` keeps one anyway "
        "(Java readers are right, hudi-rs 0.5.0 misses rows until a compaction).",
        shown="`true` (`false` in non-blocking mode)", group="metadata")
    column_stats_enable: bool | None = option(
        "hoodie.metadata.index.column.stats.enable", _parse_bool_or_auto, None,
        "Keep the metadata table's `column_stats` partition: min, max, null and value counts of "
        "the indexed columns of every data file (base and log files), written with the file; "
        "`Table.read(filters=...)` skips the file slices none of whose files can match "
        "(docs/engine.md, \"Column statistics and data skipping\"). Unset: a table keeps what it "
        "has; `false` drops the partition.", shown="unset (keep what the table has)",
        group="metadata")
    column_stats_columns: tuple[str, ...] = option(
        "hoodie.metadata.index.column.stats.column.list", _parse_columns, (),
        "Data columns (comma-separated) to keep stats of, besides `_hoodie_commit_time`, "
        "`_hoodie_partition_path` and `_hoodie_record_key`, which are always indexed. Empty: the "
        "first `hoodie.metadata.index.column.stats.max.columns.to.index` columns of a supported "
        "type (not nested, binary, decimal or time of day).", shown="empty", group="metadata")
    column_stats_max_columns: int = option(
        "hoodie.metadata.index.column.stats.max.columns.to.index", _parse_positive_int, 32,
        "How many data columns get stats when no column list is set.", group="metadata")
    column_stats_file_groups: int = option(
        "hoodie.metadata.index.column.stats.file.group.count", _parse_positive_int, 2,
        "File groups of the `column_stats` partition (set when it is built).", group="metadata")
    partition_stats_enable: bool | None = option(
        "hoodie.metadata.index.partition.stats.enable", _parse_bool_or_auto, None,
        "Keep the metadata table's `partition_stats` partition (partitioned tables; needs "
        "`column_stats`): per partition and column, the bounds over the files of its latest "
        "slices, recomputed for every partition a commit writes; reads skip partitions by it. "
        "Unset: follows `hoodie.metadata.index.column.stats.enable`, as in Hudi.",
        shown="unset (as column stats)", group="metadata")
    partition_stats_file_groups: int = option(
        "hoodie.metadata.index.partition.stats.file.group.count", _parse_positive_int, 1,
        "File groups of the `partition_stats` partition (set when it is built).",
        group="metadata")
    metadata_bloom_filter_enable: bool | None = option(
        "hoodie.metadata.index.bloom.filter.enable", _parse_bool_or_auto, None,
        "Keep the metadata table's `bloom_filters` partition: every base file's bloom filter "
        "(the one in its footer), added by the action that writes the file and marked deleted "
        "by the clean or rollback that removes it. `true` builds it from the base files' "
        "footers at the writer's start when the table lacks it, `false` drops it; unset keeps "
        "what the table has. Read by `BLOOM` / `GLOBAL_BLOOM` with "
        "`hoodie.bloom.index.use.metadata` (and by Java writers).",
        shown="`false`", group="metadata")
    metadata_bloom_filter_file_groups: int = option(
        "hoodie.metadata.index.bloom.filter.file.group.count", _parse_positive_int, 4,
        "File groups of the `bloom_filters` partition when it is built.", group="metadata")
    record_index_enable: bool | None = option(
        "hoodie.metadata.record.index.enable", _parse_bool_or_auto, None,
        "Keep the metadata table's `record_index` partition (record key → partition and file "
        "group; docs/engine.md, \"Record index\"): `true` builds it at the writer's start when "
        "the table lacks it (reading every key of the table), `false` drops it; unset keeps what "
        "the table has. Always kept with `hoodie.index.type=RECORD_INDEX`. Not kept by "
        "`NON_BLOCKING_CONCURRENCY_CONTROL` writers (refused; keeping it makes the default "
        "mode optimistic).",
        shown="`false` (unset: keep what the table has)", group="metadata")
    record_index_min_file_groups: int = option(
        "hoodie.metadata.record.index.min.filegroup.count", _parse_positive_int, 10,
        "Fewest file groups of the `record_index` partition when it is built.", group="metadata")
    record_index_max_file_groups: int = option(
        "hoodie.metadata.record.index.max.filegroup.count", _parse_positive_int, 10_000,
        "Most file groups of the `record_index` partition when it is built.", group="metadata")
    record_index_max_file_group_bytes: int = option(
        "hoodie.metadata.record.index.max.filegroup.size", _parse_positive_int, 1024 ** 3,
        "Bytes one `record_index` file group may reach (48 bytes per key, Hudi's estimate): with "
        "the growth factor, it sets the file group count when the partition is built.",
        group="metadata")
    record_index_growth_factor: float = option(
        "hoodie.metadata.record.index.growth.factor", _parse_positive_float, 2.0,
        "The table's key count is multiplied by this when the `record_index` file group count "
        "is estimated, leaving room to grow.", group="metadata")
    record_index_cache_bytes: int = option(
        "tidelake.metadata.record.index.cache.bytes", _parse_count, 512 * 1024 * 1024,
        "Bytes of `record_index` HFile key indexes a process keeps across lookups (driver or "
        "executor task process; `0` keeps none). A lookup that decompresses a quarter or more "
        "of an HFile's blocks reads the whole file once into arrays (its keys, ~21 bytes each "
        "for 16-byte keys, and its distinct values); later batches search them without "
        "decompressing (Hudi 1.1 keeps decompressed HFile blocks the same way, "
        "`hoodie.hfile.block.cache.*`). Kept by file path, size and modification time, so a "
        "compacted, rolled-back or new file is read afresh; least recently used first out.",
        shown="`536870912` (512 MiB)", group="metadata")
    compact_inline: bool = option(
        "hoodie.compact.inline", _parse_bool, False,
        "Schedule and run a compaction right after a write when one is due (MERGE_ON_READ).",
        group="services")
    compact_schedule_inline: bool = option(
        "hoodie.compact.schedule.inline", _parse_bool, False,
        "Schedule (only) a compaction right after a write when one is due; something else executes "
        "it.", group="services")
    compact_trigger: CompactionTrigger = option(
        "hoodie.compact.inline.trigger.strategy", _enum_parser(CompactionTrigger),
        CompactionTrigger.NUM_COMMITS,
        "When a compaction is due: NUM_COMMITS (deltacommits since the last compaction), "
        "NUM_COMMITS_AFTER_LAST_REQUEST, TIME_ELAPSED, NUM_AND_TIME, NUM_OR_TIME.",
        group="services")
    compact_max_delta_commits: int = option(
        "hoodie.compact.inline.max.delta.commits", _parse_positive_int, 5,
        "Deltacommits after which a compaction is due.", group="services")
    compact_max_delta_seconds: int = option(
        "hoodie.compact.inline.max.delta.seconds", _parse_positive_int, 3600,
        "Seconds after which a compaction is due (time-based triggers).", group="services")
    compaction_strategy: str = option(
        "hoodie.compaction.strategy", _parse_compaction_strategy, "UnBoundedCompactionStrategy",
        "Which file slices a compaction plan takes: UnBoundedCompactionStrategy (every slice with "
        "log files) or LogFileSizeBasedCompactionStrategy (most log bytes first, up to "
        "hoodie.compaction.target.io).", group="services")
    compaction_target_io_mb: int = option(
        "hoodie.compaction.target.io", _parse_positive_int, 512_000,
        "MB of I/O one compaction plan may take (LogFileSizeBasedCompactionStrategy).",
        group="services")
    compaction_log_size_threshold: int = option(
        "hoodie.compaction.logfile.size.threshold", _parse_count, 0,
        "Only slices with at least this many log bytes are compacted.", group="services")
    compaction_log_num_threshold: int = option(
        "hoodie.compaction.logfile.num.threshold", _parse_count, 0,
        "Only slices with at least this many log files are compacted.", group="services")
    compaction_async: bool = option(
        "hoodie.datasource.compaction.async.enable", _parse_bool, True,
        "Streaming job (MERGE_ON_READ): schedule compactions after micro-batches and execute them "
        "in the job's service thread, beside ingestion.", group="services")
    max_pending_compactions: int = option(
        "tidelake.services.max.pending.compactions", _parse_positive_int, 2,
        "Streaming job: when this many compactions are pending, the next micro-batch waits for the "
        "service thread to finish one (back-pressure).", group="services")
    services_parallelism: int = option(
        "tidelake.services.parallelism", _parse_count, 0,
        "Streaming job: Spark tasks a service runs at once (0: half the job's cores, at least 1), "
        "so services never take every executor slot from ingestion.", group="services")
    clean_automatic: bool = option(
        "hoodie.clean.automatic", _parse_bool, True,
        "Clean old file slices after every write.", group="services")
    clean_async: bool = option(
        "hoodie.clean.async", _parse_bool, False,
        "Accepted under Hudi's name, with no effect: where cleaning runs (with "
        "`hoodie.clean.automatic`) is fixed by the writer. The streaming job always cleans "
        "asynchronously, in its service thread beside ingestion (what `true` asks of Hudi); a "
        "`Table` write cleans inline, right after its commit (what `false` asks of Hudi).",
        aliases=("hoodie.clean.async.enabled",), group="services")
    cleaner_policy: CleanerPolicy = option(
        "hoodie.cleaner.policy", _enum_parser(CleanerPolicy), CleanerPolicy.KEEP_LATEST_COMMITS,
        "KEEP_LATEST_COMMITS, KEEP_LATEST_FILE_VERSIONS or KEEP_LATEST_BY_HOURS.",
        aliases=("hoodie.clean.policy",), group="services")
    cleaner_commits_retained: int = option(
        "hoodie.cleaner.commits.retained", _parse_positive_int, 10,
        "KEEP_LATEST_COMMITS: commits whose files stay readable (time travel and incremental "
        "reads).", aliases=("hoodie.clean.commits.retained",), group="services")
    cleaner_fileversions_retained: int = option(
        "hoodie.cleaner.fileversions.retained", _parse_positive_int, 3,
        "KEEP_LATEST_FILE_VERSIONS: file slices kept per file group.",
        aliases=("hoodie.clean.fileversions.retained",), group="services")
    cleaner_hours_retained: int = option(
        "hoodie.cleaner.hours.retained", _parse_positive_int, 24,
        "KEEP_LATEST_BY_HOURS: hours of commits whose files stay readable.",
        aliases=("hoodie.clean.hours.retained",), group="services")
    archive_automatic: bool = option(
        "hoodie.archive.automatic", _parse_bool, True,
        "Archive old instants to the timeline history after every write.", group="services")
    keep_min_commits: int = option(
        "hoodie.keep.min.commits", _parse_positive_int, 20,
        "Completed commits archival keeps on the active timeline.", group="services")
    keep_max_commits: int = option(
        "hoodie.keep.max.commits", _parse_positive_int, 30,
        "Completed commits on the active timeline that trigger archival.", group="services")
    timeline_compaction_batch_size: int = option(
        "hoodie.timeline.compaction.batch.size", _parse_positive_int, 10,
        "Files of one level of the timeline history merged into one of the next.", group="services")
    archive_beyond_savepoint: bool = option(
        "hoodie.archive.beyond.savepoint", _parse_bool, False,
        "Archive past the first savepoint (savepointed commits stay).", group="services")
    clustering_inline: bool = option(
        "hoodie.clustering.inline", _parse_bool, False,
        "Schedule and run a clustering right after a write when one is due.", group="services")
    clustering_inline_max_commits: int = option(
        "hoodie.clustering.inline.max.commits", _parse_positive_int, 4,
        "Commits after which an inline clustering is due.", group="services")
    clustering_schedule_inline: bool = option(
        "hoodie.clustering.schedule.inline", _parse_bool, False,
        "Schedule (only) a clustering right after a write when one is due.", group="services")
    clustering_async: bool = option(
        "hoodie.clustering.async.enabled", _parse_bool, False,
        "Cluster beside ingestion (the streaming job).", group="services")
    clustering_async_max_commits: int = option(
        "hoodie.clustering.async.max.commits", _parse_positive_int, 4,
        "Commits after which an async clustering is due.", group="services")
    clustering_small_file_limit: int = option(
        "hoodie.clustering.plan.strategy.small.file.limit", _parse_positive_int, 300 * 1024 * 1024,
        "File slices smaller than this are clustered.", group="services")
    clustering_target_file_max_bytes: int = option(
        "hoodie.clustering.plan.strategy.target.file.max.bytes", _parse_positive_int,
        1024 * 1024 * 1024,
        "Target size of the file groups clustering writes.", group="services")
    clustering_max_bytes_per_group: int = option(
        "hoodie.clustering.plan.strategy.max.bytes.per.group", _parse_positive_int,
        2 * 1024 * 1024 * 1024,
        "Bytes of input one clustering group takes at most.", group="services")
    clustering_max_num_groups: int = option(
        "hoodie.clustering.plan.strategy.max.num.groups", _parse_positive_int, 30,
        "Clustering groups one plan takes at most.", group="services")
    clustering_sort_columns: tuple[str, ...] = option(
        "hoodie.clustering.plan.strategy.sort.columns", _parse_columns, (),
        "Columns clustering sorts by (comma-separated; none: no sort).", group="services")
    clustering_partitions_selected: tuple[str, ...] = option(
        "hoodie.clustering.plan.strategy.partition.selected", _parse_columns, (),
        "Only these partitions are clustered (comma-separated partition paths).", group="services")
    clustering_partition_regex: str = option(
        "hoodie.clustering.plan.strategy.partition.regex.pattern", _parse_text, "",
        "Only partitions whose path matches this regular expression are clustered.",
        group="services")
    clustering_single_group: bool = option(
        "hoodie.clustering.plan.strategy.single.group.clustering.enabled", _parse_bool, True,
        "Cluster a partition even when it yields a single one-slice group.", group="services")
    layout_optimize_strategy: str = option(
        "hoodie.layout.optimize.strategy", _parse_layout_strategy, "linear",
        "How clustering orders the sort columns: linear, z-order or hilbert.", group="services")
    metrics_on: bool = option(
        "hoodie.metrics.on", _parse_bool, False,
        "The streaming job serves its metrics (docs/ingest.md, \"Metrics\") on a Prometheus "
        "endpoint. Read by the job only; `Table` writes report nothing.", group="metrics")
    metrics_reporter_type: str = option(
        "hoodie.metrics.reporter.type", _parse_metrics_reporter, "PROMETHEUS",
        "PROMETHEUS: an HTTP endpoint on `hoodie.metrics.prometheus.port` for Prometheus to "
        "scrape. Hudi's other reporters (its default, GRAPHITE, JMX, PROMETHEUS_PUSHGATEWAY, "
        "...) are refused.", group="metrics")
    metrics_prometheus_port: int = option(
        "hoodie.metrics.prometheus.port", _parse_port, 9090,
        "Port of the endpoint (`http://HOST:PORT/metrics`, all interfaces, as Hudi's).",
        group="metrics")
    metrics_name_prefix: str = option(
        "hoodie.metrics.reporter.metricsname.prefix", _parse_text, "",
        "Prefix of the metrics under Hudi's names (`<prefix>_deltacommit_duration`); dots "
        "become `_`.", shown="the table name (as Hudi infers it)", group="metrics")
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def heartbeat_expiry_seconds(self) -> float:
        """Age after which a pending instant's heartbeat counts as expired (Hudi's rule:
        interval x tolerable misses)."""
        return self.heartbeat_interval_ms * self.heartbeat_tolerable_misses / 1000.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None,
                     *, allow: tuple[str, ...] = ()) -> WriteConfig:
        """Parse a string map; unknown keys raise :class:`InvalidOptionError` naming them.

        ``allow`` lists extra keys the caller handles itself (e.g. table-creation keys).
        """
        values: dict[str, Any] = {}
        extra: dict[str, str] = {}
        by_name: dict[str, ConfigKey[Any]] = {}
        for spec in WRITE_KEYS:
            by_name[spec.key] = spec
            for alias in spec.aliases:
                by_name[alias] = spec
        for key, raw in (options or {}).items():
            if not isinstance(key, str):
                raise InvalidOptionError(str(key), "option keys must be strings")
            found = by_name.get(key)
            if found is None:
                if key in allow:
                    extra[key] = str(raw)
                    continue
                raise InvalidOptionError(key, "unknown option; see docs/configuration.md")
            values[found.attr] = found.parse(key, raw if isinstance(raw, str) else str(raw))
        return replace(cls(), **values, extra=extra)


WRITE_KEYS: tuple[ConfigKey[Any], ...] = tuple(
    replace(f.metadata["option"], attr=f.name) for f in fields(WriteConfig)
    if "option" in f.metadata)
"""Every writer option, from the :class:`WriteConfig` fields, in the order the docs list them."""


def describe_options(keys: tuple[ConfigKey[Any], ...], group: str) -> str:
    """The Markdown table of the options of ``group`` (docs/configuration.md holds it; a test
    keeps the two the same)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for spec in keys:
        if spec.group != group:
            continue
        also = (" (also " + ", ".join(f"`{a}`" for a in spec.aliases) + ")"
                if spec.aliases else "")
        rows.append(f"| `{spec.key}`{also} | {spec.default_text} | {spec.doc} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------
# Table config: hoodie.properties
# ---------------------------------------------------------------------------------------

P_NAME = "hoodie.table.name"
P_TYPE = "hoodie.table.type"
P_VERSION = "hoodie.table.version"
P_INITIAL_VERSION = "hoodie.table.initial.version"
P_LAYOUT = "hoodie.timeline.layout.version"
P_TIMELINE_PATH = "hoodie.timeline.path"
P_HISTORY_PATH = "hoodie.timeline.history.path"
P_DATABASE = "hoodie.database.name"
P_RECORD_KEYS = "hoodie.table.recordkey.fields"
P_PRECOMBINE = "hoodie.table.precombine.field"
P_ORDERING_V9 = "hoodie.table.ordering.fields"
P_PARTITION_FIELDS = "hoodie.table.partition.fields"
P_KEYGEN_CLASS = "hoodie.table.keygenerator.class"
P_KEYGEN_TYPE = "hoodie.table.keygenerator.type"
P_HIVE_STYLE = "hoodie.datasource.write.hive_style_partitioning"
P_URL_ENCODE = "hoodie.datasource.write.partitionpath.urlencode"
P_SLASH_DATES = "hoodie.datasource.write.slash.separated.date.partitioning"
P_DROP_PARTITION_COLUMNS = "hoodie.datasource.write.drop.partition.columns"
P_BASE_FORMAT = "hoodie.table.base.file.format"
P_LOG_FORMAT = "hoodie.table.log.file.format"
P_POPULATE_META = "hoodie.populate.meta.fields"
P_CREATE_SCHEMA = "hoodie.table.create.schema"
P_ARCHIVE_FOLDER = "hoodie.archivelog.folder"
P_TIMEZONE = "hoodie.table.timeline.timezone"
P_PAYLOAD = "hoodie.compaction.payload.class"
P_LEGACY_PAYLOAD = "hoodie.table.legacy.payload.class"
P_TABLE_FORMAT = "hoodie.table.format"
P_PARTIAL_UPDATE_MODE = "hoodie.table.partial.update.mode"
P_MERGE_PROPERTY_PREFIX = "hoodie.record.merge.property."
P_COMPLEX_KEY_ENCODING = "hoodie.table.complex.keygen.encoding"
P_MERGE_MODE = "hoodie.record.merge.mode"
P_MERGE_STRATEGY = "hoodie.record.merge.strategy.id"
P_CDC = "hoodie.table.cdc.enabled"
P_CHECKSUM = "hoodie.table.checksum"
P_BUCKETS = "hoodie.bucket.index.num.buckets"
P_INDEX_TYPE = "hoodie.index.type"
P_BUCKET_ENGINE = "hoodie.index.bucket.engine"


def _parse_true_false(key: str, raw: str) -> bool:
    lowered = str(raw).strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidOptionError(key, "expected true or false")
    return lowered == "true"


def _parse_merge_mode(key: str, raw: str) -> MergeMode:
    try:
        return MergeMode(str(raw).strip().upper())
    except ValueError:
        raise InvalidOptionError(
            key, "expected EVENT_TIME_ORDERING or COMMIT_TIME_ORDERING") from None


def _parse_as_given(key: str, raw: str) -> str:
    return str(raw)


CREATE_KEYS: tuple[ConfigKey[Any], ...] = (
    ConfigKey(P_HIVE_STYLE, _parse_true_false, False,
              "Partition folders named `field=value` instead of `value`.",
              attr="hive_style", group="create"),
    ConfigKey(P_URL_ENCODE, _parse_true_false, True,
              "How partition values become folder names (see below). New tables record `true`; "
              "tables that record `false` (e.g. created by Java with its default) are written "
              "as Java writes them.", attr="url_encode", group="create"),
    ConfigKey(P_MERGE_MODE, _parse_merge_mode, None, "How two versions of a record resolve.",
              shown="`EVENT_TIME_ORDERING` with a precombine field, else "
              "`COMMIT_TIME_ORDERING`", attr="merge_mode", group="create"),
    ConfigKey(P_DATABASE, _parse_as_given, "default", "Enters `hoodie.table.checksum`.",
              attr="database", group="create"),
)
"""Options ``Table.create`` takes besides the writer options: stored in ``hoodie.properties``
at creation, fixed for the table's life."""


def _parse_flag(key: str, raw: str) -> bool:
    return raw.lower() == "true"  # as Java's Boolean.parseBoolean: anything else is false


def _parse_optional_index(key: str, raw: str) -> IndexType | None:
    return IndexType(raw) if raw else None


def _parse_optional_count(key: str, raw: str) -> int | None:
    return int(raw) if raw else None


def _parse_stored_bucket_engine(key: str, raw: str) -> BucketEngine | None:
    try:
        return BucketEngine(raw.upper()) if raw else None
    except ValueError:
        raise UnsupportedTableError(f"bucket index engine {raw!r} is not supported") from None


PROPERTY_KEYS: tuple[ConfigKey[Any], ...] = (
    ConfigKey(P_HIVE_STYLE, _parse_flag, False, "Partition folders are named `field=value`.",
              attr="hive_style", group="properties"),
    ConfigKey(P_URL_ENCODE, _parse_flag, False,
              "Partition values are escaped in folder names (docs: *Partition values*).",
              attr="url_encode", group="properties"),
    ConfigKey(P_POPULATE_META, _parse_flag, True, "Base files carry the five meta columns.",
              attr="populate_meta_fields", group="properties"),
    ConfigKey(P_CREATE_SCHEMA, _parse_as_given, None,
              "The Avro schema the table was created with.", attr="create_schema",
              group="properties"),
    ConfigKey(P_DATABASE, _parse_as_given, "", "Enters `hoodie.table.checksum`.",
              attr="database", group="properties"),
    ConfigKey(P_TIMELINE_PATH, _parse_as_given, "timeline",
              "The active timeline's folder under `.hoodie`.", attr="timeline_path",
              group="properties"),
    ConfigKey(P_BUCKET_ENGINE, _parse_stored_bucket_engine, None,
              "The BUCKET index's engine (`SIMPLE`, `CONSISTENT_HASHING`).",
              attr="bucket_engine", group="properties"),
    ConfigKey(P_INDEX_TYPE, _parse_optional_index, None, "The index the table was created with.",
              attr="index_type", group="properties"),
    ConfigKey(P_BUCKETS, _parse_optional_count, None,
              "Buckets per partition of a BUCKET table.", attr="num_buckets",
              group="properties"),
)
"""The ``hoodie.properties`` keys :meth:`TableConfig.from_properties` reads one by one: parser
and the value a table without the key has (the key, the record key and partition fields, the
ordering field, the merge mode and the key generator are read together, by the code there)."""


def parse_options(keys: tuple[ConfigKey[Any], ...],
                  options: Mapping[str, str]) -> dict[str, Any]:
    """``attr`` -> value of each of ``keys``: parsed from ``options`` where given (in the order
    ``keys`` declares them), else its default."""
    values: dict[str, Any] = {}
    for spec in keys:
        given = next((k for k in (spec.key, *spec.aliases) if k in options), None)
        values[spec.attr] = spec.default if given is None else spec.parse(given,
                                                                           options[given])
    return values


def table_checksum(database: str, name: str) -> int:
    """Hudi's ``hoodie.table.checksum``: CRC32 of ``"<database>.<name>"`` in UTF-8."""
    return zlib.crc32(f"{database}.{name}".encode())


def _split_fields(raw: str | None) -> tuple[str, ...]:
    if not raw:
        return ()
    fields = []
    for part in raw.split(","):
        name = part.strip()
        if ":" in name:  # CustomKeyGenerator form "f:SIMPLE"
            name = name.split(":", 1)[0]
        if name:
            fields.append(name)
    return tuple(fields)


@dataclass(frozen=True)
class TableConfig:
    """The table's persistent configuration, as stored in ``hoodie.properties``."""

    name: str
    table_type: TableType
    version: int
    record_key_fields: tuple[str, ...]
    partition_fields: tuple[str, ...]
    precombine_field: str | None
    merge_mode: MergeMode
    hive_style: bool
    url_encode: bool
    populate_meta_fields: bool
    create_schema: str | None
    database: str = "default"
    keygen_type: KeyGeneratorType = KeyGeneratorType.SIMPLE
    timeline_path: str = "timeline"
    index_type: IndexType | None = None
    num_buckets: int | None = None
    bucket_engine: BucketEngine | None = None
    raw: Mapping[str, str] = field(default_factory=dict)

    @property
    def partition_paths_hold_values(self) -> bool:
        """False when the table's key generator names partition folders by something else
        than the partition fields' values — Hudi's ``TimestampBasedKeyGenerator`` (the time
        formatted: ``2024/01/15``), a ``CustomKeyGenerator`` with such (``TIMESTAMP``)
        parts among its fields (:func:`formatting_keygen`): a filter on the fields then tells
        nothing of a folder's name. Such tables are read as written, without pruning their
        folders by name."""
        return formatting_keygen(self.raw) is None

    @property
    def consistent_hashing(self) -> bool:
        """True for a BUCKET table with the consistent-hashing engine (RFC-42)."""
        return self.bucket_engine is BucketEngine.CONSISTENT_HASHING

    @property
    def orders_by_event_time(self) -> bool:
        """True when the table orders versions by its precombine field
        (:func:`orders_by_event_time`), else by arrival."""
        return orders_by_event_time(self.merge_mode, self.precombine_field)

    @property
    def is_mor(self) -> bool:
        """True for merge-on-read tables."""
        return self.table_type is TableType.MERGE_ON_READ

    @property
    def table_version(self) -> TableVersion:
        """What the table's version means on disk (:mod:`engine.timeline.version`)."""
        return table_version(self.version)

    @property
    def timeline_layout(self) -> int:
        """Timeline layout version: 1 for tables before version 8, 2 from version 8 on."""
        return self.table_version.timeline_layout

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> TableConfig:
        """Parse ``hoodie.properties``; raises for versions or features we cannot read."""
        try:
            name = props[P_NAME]
            table_type = TableType(props[P_TYPE].upper().replace("COW", "COPY_ON_WRITE")
                                   .replace("MOR", "MERGE_ON_READ"))
        except (KeyError, ValueError) as exc:
            raise UnsupportedTableError(f"hoodie.properties lacks a valid {exc}") from None
        version = table_version(int(props.get(P_VERSION, "6"))).code
        _refuse_unsupported(props)
        precombine = props.get(P_PRECOMBINE) or props.get(P_ORDERING_V9) or None
        if precombine and "," in precombine:
            raise UnsupportedTableError(f"multiple ordering fields {precombine!r} not supported")
        merge_mode = _merge_mode_of(props, precombine)
        partition_fields = _split_fields(props.get(P_PARTITION_FIELDS))
        record_keys = _split_fields(props.get(P_RECORD_KEYS))
        keygen = _keygen_of(props, record_keys, partition_fields)
        return cls(
            name=name, table_type=table_type, version=version,
            record_key_fields=record_keys, partition_fields=partition_fields,
            precombine_field=precombine, merge_mode=merge_mode, keygen_type=keygen,
            **parse_options(PROPERTY_KEYS, props), raw=dict(props),
        )

    def to_properties(self) -> dict[str, str]:
        """The key/value map written to ``hoodie.properties`` (checksum last)."""
        props: dict[str, str] = {
            P_NAME: self.name,
            P_TYPE: self.table_type.value,
            P_VERSION: str(self.version),
            P_LAYOUT: str(self.timeline_layout),
        }
        if self.table_version.initial_version_property:
            props.update({P_INITIAL_VERSION: str(self.version),
                          P_TIMELINE_PATH: self.timeline_path, P_HISTORY_PATH: "history"})
        props.update({
            P_DATABASE: self.database,
            P_RECORD_KEYS: ",".join(self.record_key_fields),
            P_PARTITION_FIELDS: ",".join(self.partition_fields),
            P_KEYGEN_TYPE: self.keygen_type.value,
            P_KEYGEN_CLASS: KEYGEN_CLASSES[self.keygen_type],
            P_HIVE_STYLE: str(self.hive_style).lower(),
            P_URL_ENCODE: str(self.url_encode).lower(),
            P_DROP_PARTITION_COLUMNS: "false",
            P_BASE_FORMAT: "PARQUET",
            P_LOG_FORMAT: "HOODIE_LOG",
            P_POPULATE_META: "true",
            P_ARCHIVE_FOLDER: "archived",
            P_TIMEZONE: "UTC",
            P_CDC: "false",
            P_MERGE_MODE: self.merge_mode.value,
        })
        version = self.table_version
        if version.records_table_format:
            props[P_TABLE_FORMAT] = "native"
        if self.precombine_field:
            props[version.ordering_fields_key] = self.precombine_field
        if not version.writes_payload_and_strategy:
            pass  # the merge mode alone (version 9 on)
        elif self.merge_mode is MergeMode.EVENT_TIME_ORDERING:
            props[P_MERGE_STRATEGY] = EVENT_TIME_STRATEGY_ID
            props[P_PAYLOAD] = DEFAULT_PAYLOAD
        else:
            props[P_MERGE_STRATEGY] = COMMIT_TIME_STRATEGY_ID
            props[P_PAYLOAD] = OVERWRITE_PAYLOAD
        if self.create_schema:
            props[P_CREATE_SCHEMA] = self.create_schema
        if self.index_type is not None:
            props[P_INDEX_TYPE] = self.index_type.value
        if self.num_buckets is not None:
            props[P_BUCKETS] = str(self.num_buckets)
        if self.bucket_engine is not None:
            props[P_BUCKET_ENGINE] = self.bucket_engine.value
        props[P_CHECKSUM] = str(table_checksum(self.database, self.name))
        return props


def _refuse_unsupported(props: Mapping[str, str]) -> None:
    """Refuse, naming the key, what Hudi 1.1/1.2 may record that tidelake would read or write
    wrongly (``docs/table-version-9.md`` §3.3): partial updates, merge properties (delete
    markers of the Debezium / AWS DMS payloads), a non-native table format, a base file
    format other than Parquet (1.2's Lance), several ordering fields (below).
    (:func:`refuse_unwritable` is what is read but not written.)"""
    partial = props.get(P_PARTIAL_UPDATE_MODE, "")
    if partial and partial.upper() != "NONE":
        raise UnsupportedTableError(f"{P_PARTIAL_UPDATE_MODE}={partial} is not supported "
                                    "(partial updates)")
    merge_props = sorted(k for k in props if k.startswith(P_MERGE_PROPERTY_PREFIX))
    if merge_props:
        raise UnsupportedTableError(f"{merge_props[0]} is not supported (merge properties: "
                                    "delete markers of Debezium / AWS DMS payloads)")
    table_format = props.get(P_TABLE_FORMAT, "")
    if table_format and table_format.lower() != "native":
        raise UnsupportedTableError(f"{P_TABLE_FORMAT}={table_format} is not supported "
                                    "(only native)")
    base_format = props.get(P_BASE_FORMAT, "")
    if base_format and base_format.upper() != "PARQUET":
        raise UnsupportedTableError(f"{P_BASE_FORMAT}={base_format} is not supported "
                                    "(only PARQUET)")


def _custom_keygen(props: Mapping[str, str]) -> bool:
    """Whether ``hoodie.properties`` names Hudi's own custom key generator."""
    named = props.get(P_KEYGEN_CLASS, "")
    if named:
        return named in CUSTOM_KEYGEN_CLASSES
    return props.get(P_KEYGEN_TYPE, "").upper() in CUSTOM_KEYGEN_TYPES


def _simple_parts_only(raw: str | None) -> bool:
    """Whether every entry of a custom key generator's ``hoodie.table.partition.fields``
    (``region:SIMPLE,day:simple``, or none) is a ``SIMPLE`` part: Hudi splits each at ``:``
    (``BaseKeyGenerator.CUSTOM_KEY_GENERATOR_SPLIT_REGEX``) and reads the type
    case-insensitively (``CustomAvroKeyGenerator.getPartitionFieldAndKeyType``). An entry
    without a type (version 6 tables, whose types lived in the writer's options) is
    not known to be one."""
    for entry in (raw or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) != 2 or parts[1].upper() != "SIMPLE":
            return False
    return True


def formatting_keygen(props: Mapping[str, str]) -> str | None:
    """``key=value`` of ``hoodie.properties``' key generator when it names partition folders
    by something else than the partition fields' values, or may, else None: Hudi's
    timestamp-based key generators (they format the time, ``2024/01/15``), a custom one
    with a part that is not ``SIMPLE`` (``ts:TIMESTAMP``, or no type recorded; the value
    then names ``hoodie.table.partition.fields`` too), a class named like those that is not
    Hudi's. Hudi's custom key generator with ``SIMPLE`` parts only names each folder by its
    field's value (``CustomAvroKeyGenerator.getPartitionPath``: ``SimpleAvroKeyGenerator``'s
    path per part, joined by ``/``), as the simple and complex ones do: None."""
    kind = props.get(P_KEYGEN_TYPE, "")
    named = props.get(P_KEYGEN_CLASS, "")
    found = (f"{P_KEYGEN_CLASS}={named}"
             if any(part in named for part in ("TimestampBased", "Custom"))
             else f"{P_KEYGEN_TYPE}={kind}"
             if kind.upper().startswith(("TIMESTAMP", "CUSTOM")) else None)
    if found is None:
        return None
    if _custom_keygen(props):
        fields = props.get(P_PARTITION_FIELDS, "")
        return None if _simple_parts_only(fields) else f"{found}, {P_PARTITION_FIELDS}={fields}"
    return found


def user_provided_keygen(props: Mapping[str, str]) -> str | None:
    """``key=value`` of ``hoodie.properties``' key generator when it is not one of Hudi's
    (:data:`HUDI_KEYGEN_TYPES`): a user's class, or the type ``USER_PROVIDED``; else None.
    The class is read first, as Hudi reads it (``KeyGeneratorType.getKeyGeneratorClassName``).
    """
    named = props.get(P_KEYGEN_CLASS, "").strip()
    if named:
        return None if named in HUDI_KEYGEN_TYPES.values() else f"{P_KEYGEN_CLASS}={named}"
    kind = props.get(P_KEYGEN_TYPE, "").strip()
    return f"{P_KEYGEN_TYPE}={kind}" if kind and kind.upper() not in HUDI_KEYGEN_TYPES \
        else None


def refuse_unwritable(props: Mapping[str, str]) -> None:
    """Refuse, naming the key, to write a table whose ``hoodie.properties`` asks for what
    tidelake would write wrongly though it reads it: the value-only complex key encoding
    (``hoodie.table.complex.keygen.encoding``, Hudi after 1.2.1; tidelake writes
    ``field:value`` keys, ``docs/table-version-9.md`` §7), nested record key or partition
    fields, a timestamp-based key generator or a custom one with other parts than
    ``SIMPLE`` (:func:`formatting_keygen`; tidelake's writer would name folders by the raw
    values, not Hudi's formatted time), and Hudi 1.2's slash-separated date partitioning
    where Java applies it (``KeyGenUtils.getPartitionPath``: one partition field, or each
    part of a custom key generator; not the complex key generator's several fields), and a
    key generator that is not Hudi's (:func:`user_provided_keygen`)."""
    for key in (P_RECORD_KEYS, P_PARTITION_FIELDS):
        if any("." in name for name in _split_fields(props.get(key))):
            raise UnsupportedTableError(
                f"{key}={props[key]}: tidelake does not write tables keyed or partitioned by "
                "a nested field (it makes keys of top-level columns only); this refuses "
                "writes only")
    user = user_provided_keygen(props)
    if user:
        raise UnsupportedTableError(
            f"{user}: not one of Hudi's key generators, so tidelake cannot know how it makes "
            "record keys and partition paths; written as the simple or complex generator, a "
            "record the table's own writer keyed otherwise would get a second key (a "
            "duplicate); reading it is supported")
    formatting = formatting_keygen(props)
    if formatting:
        raise UnsupportedTableError(
            f"{formatting}: tidelake does not write tables of a timestamp-based key "
            "generator, nor of a custom key generator other than Hudi's with SIMPLE parts "
            "only (field:SIMPLE) (their partition folders are named by a formatted time, "
            "not by the fields' values as tidelake's writer would name them); reading them "
            "is supported")
    partition_fields = _split_fields(props.get(P_PARTITION_FIELDS))
    if props.get(P_SLASH_DATES, "").strip().lower() == "true" and partition_fields and (
            len(partition_fields) == 1 or _custom_keygen(props)):
        raise UnsupportedTableError(
            f"{P_SLASH_DATES}={props[P_SLASH_DATES]}: Hudi writes this table's partition "
            "values with their dashes as folders (2026-01-05 -> 2026/01/05: one partition "
            "field, or each part of a custom key generator); tidelake does not, so it does "
            "not write it; reading it is supported")
    encoding = props.get(P_COMPLEX_KEY_ENCODING, "")
    if encoding and encoding.upper() != "FIELD_PREFIXED":
        raise UnsupportedTableError(f"{P_COMPLEX_KEY_ENCODING}={encoding} is not supported "
                                    "for writes (tidelake writes field:value keys)")


def _merge_mode_of(props: Mapping[str, str], precombine: str | None) -> MergeMode:
    raw = props.get(P_MERGE_MODE)
    if raw:
        try:
            return MergeMode(raw.upper())
        except ValueError:
            raise UnsupportedTableError(f"merge mode {raw!r} is not supported") from None
    payload = props.get(P_PAYLOAD) or props.get(P_LEGACY_PAYLOAD, "")
    if not precombine or payload.endswith("OverwriteWithLatestAvroPayload"):
        return MergeMode.COMMIT_TIME_ORDERING
    return MergeMode.EVENT_TIME_ORDERING


def _keygen_of(props: Mapping[str, str], record_keys: tuple[str, ...],
               partition_fields: tuple[str, ...]) -> KeyGeneratorType:
    raw_type = props.get(P_KEYGEN_TYPE, "").upper()
    raw_class = props.get(P_KEYGEN_CLASS, "")
    if raw_type in ("SIMPLE", "COMPLEX", "NON_PARTITION"):
        return KeyGeneratorType(raw_type)
    if "Complex" in raw_class:
        return KeyGeneratorType.COMPLEX
    if "Nonpartitioned" in raw_class:
        return KeyGeneratorType.NON_PARTITION
    if _custom_keygen(props):
        # CustomAvroKeyGenerator: SimpleAvroKeyGenerator's key for one key field (the bare
        # value, also with several partition parts), else ComplexAvroKeyGenerator's.
        if len(record_keys) > 1:
            return KeyGeneratorType.COMPLEX
        return KeyGeneratorType.SIMPLE if partition_fields else KeyGeneratorType.NON_PARTITION
    if not partition_fields and len(record_keys) <= 1:
        return KeyGeneratorType.NON_PARTITION if not raw_class else KeyGeneratorType.SIMPLE
    if len(record_keys) > 1 or len(partition_fields) > 1:
        return KeyGeneratorType.COMPLEX
    return KeyGeneratorType.SIMPLE
