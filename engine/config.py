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
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Generic, TypeVar

from engine.errors import InvalidOptionError, UnsupportedTableError

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


class IndexType(str, Enum):
    """Write-side tagging index (``hoodie.index.type``)."""

    BUCKET = "BUCKET"
    SIMPLE = "SIMPLE"
    GLOBAL_SIMPLE = "GLOBAL_SIMPLE"


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


KEYGEN_CLASSES = {
    KeyGeneratorType.SIMPLE: "org.apache.hudi.keygen.SimpleKeyGenerator",
    KeyGeneratorType.COMPLEX: "org.apache.hudi.keygen.ComplexKeyGenerator",
    KeyGeneratorType.NON_PARTITION: "org.apache.hudi.keygen.NonpartitionedKeyGenerator",
}


def _parse_bool(key: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidOptionError(key, f"expected true or false, got {raw!r}")


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
    """One declared option: its key, parser, default, doc and accepted aliases."""

    key: str
    parse: Callable[[str, str], T]
    default: T
    doc: str
    aliases: tuple[str, ...] = ()
    attr: str = ""


ROLLING_METADATA_KEYS = "hoodie.write.rolling.metadata.keys"

WRITE_KEYS: tuple[ConfigKey[Any], ...] = (
    ConfigKey("hoodie.index.type", _enum_parser(IndexType), IndexType.SIMPLE,
              "Write-side index: BUCKET (hash of the key picks the file group), SIMPLE "
              "(join with the keys of the partition), GLOBAL_SIMPLE (join with all keys).",
              attr="index_type"),
    ConfigKey("hoodie.index.bucket.engine", _enum_parser(BucketEngine), BucketEngine.SIMPLE,
              "BUCKET index engine: SIMPLE (a fixed number of buckets per partition) or "
              "CONSISTENT_HASHING (RFC-42: a hash ring per partition, starting from "
              "hoodie.bucket.index.num.buckets buckets; MERGE_ON_READ only). Stored in "
              "hoodie.properties; fixed for the table's life.", attr="bucket_engine"),
    ConfigKey("hoodie.bucket.index.num.buckets", _parse_positive_int, 4,
              "Fixed number of buckets (file groups) per partition for the BUCKET index. "
              "Hudi's own default is 256; tidelake defaults to 4, right for tables up to a few "
              "GB per partition.", attr="num_buckets"),
    ConfigKey("hoodie.logfile.data.block.format", _enum_parser(LogBlockFormat),
              LogBlockFormat.PARQUET,
              "Data block format of MOR log files: parquet (tidelake's default: smaller, and "
              "faster to write and read) or avro (Hudi's default for parquet base files). "
              "Hudi readers read both.", attr="log_block_format"),
    ConfigKey("hoodie.parquet.max.file.size", _parse_positive_int, 120 * 1024 * 1024,
              "Target size in bytes of a base file; inserts open new file groups at this size.",
              attr="max_file_size"),
    ConfigKey("hoodie.parquet.small.file.limit", _parse_positive_int, 100 * 1024 * 1024,
              "Base files smaller than this take new inserts before new file groups open.",
              attr="small_file_limit"),
    ConfigKey("hoodie.copyonwrite.record.size.estimate", _parse_positive_int, 1024,
              "Bytes per record assumed before the first commit gives a measured average.",
              attr="record_size_estimate"),
    ConfigKey("hoodie.parquet.compression.codec", lambda k, v: _codec(k, v), "snappy",
              "Parquet compression codec of base files and parquet log blocks.",
              attr="compression"),
    ConfigKey("hoodie.combine.before.upsert", _parse_bool, True,
              "Deduplicate records with the same key within one write by the ordering field.",
              attr="combine_before_upsert"),
    ConfigKey("hoodie.bloom.filter.enable", _parse_bool, True,
              "Write Hudi's bloom filter and min/max record key into base file footers "
              "(needed by Java writers' BLOOM index; not by readers).",
              aliases=("tidelake.write.bloom.filter",), attr="write_bloom_filter"),
    ConfigKey("hoodie.write.concurrency.mode", _parse_concurrency_mode, None,
              "SINGLE_WRITER, OPTIMISTIC_CONCURRENCY_CONTROL or NON_BLOCKING_CONCURRENCY_CONTROL "
              "(MERGE_ON_READ with the BUCKET index only). Unset: non-blocking for "
              "MERGE_ON_READ + BUCKET tables with a precombine field, optimistic for every "
              "other table "
              "(docs/engine.md, 'Several writers').", attr="concurrency_mode"),
    ConfigKey("hoodie.write.lock.provider", _parse_lock_provider, FS_LOCK_PROVIDER,
              "Lock for the short critical sections of a commit: the file-system lock "
              "(a lock file in .hoodie, works on local and shared file systems) or the "
              "in-process lock (writers in one Python process only).", attr="lock_provider"),
    ConfigKey("hoodie.write.lock.wait_time_ms", _parse_positive_int, 60_000,
              "How long a writer waits for the table lock before failing with "
              "LockTimeoutError.", attr="lock_wait_ms"),
    ConfigKey("hoodie.write.lock.filesystem.expire", _parse_minutes, 1.0,
              "Minutes after which a file-system lock that its holder stopped renewing is "
              "stale and may be broken (0: never). A live holder renews it every quarter of "
              "this.", attr="lock_expire_minutes"),
    ConfigKey("hoodie.client.heartbeat.interval_in_ms", _parse_positive_int, 60_000,
              "How often a writer refreshes .hoodie/.heartbeat/<instant> while its instant "
              "is pending.", attr="heartbeat_interval_ms"),
    ConfigKey("hoodie.client.heartbeat.tolerable.misses", _parse_positive_int, 2,
              "Missed heartbeats after which a pending instant counts as failed and the next "
              "writer rolls it back.", attr="heartbeat_tolerable_misses"),
    ConfigKey(ROLLING_METADATA_KEYS, _parse_columns, (),
              "extraMetadata keys (comma-separated) that commits of table services copy "
              "from the newest commit carrying them, so that a checkpoint recorded there "
              "(a streaming job's Kafka offsets) survives compactions, clusterings and "
              "archival. The streaming job sets its checkpoint keys.",
              attr="rolling_metadata_keys"),
    # -- table services (docs/engine.md, "Table services") -------------------------------
    ConfigKey("hoodie.compact.inline", _parse_bool, False,
              "Schedule and run a compaction right after a write when one is due "
              "(MERGE_ON_READ).", attr="compact_inline"),
    ConfigKey("hoodie.compact.schedule.inline", _parse_bool, False,
              "Schedule (only) a compaction right after a write when one is due; something "
              "else executes it.", attr="compact_schedule_inline"),
    ConfigKey("hoodie.compact.inline.trigger.strategy", _enum_parser(CompactionTrigger),
              CompactionTrigger.NUM_COMMITS,
              "When a compaction is due: NUM_COMMITS (deltacommits since the last "
              "compaction), NUM_COMMITS_AFTER_LAST_REQUEST, TIME_ELAPSED, NUM_AND_TIME, "
              "NUM_OR_TIME.", attr="compact_trigger"),
    ConfigKey("hoodie.compact.inline.max.delta.commits", _parse_positive_int, 5,
              "Deltacommits after which a compaction is due.", attr="compact_max_delta_commits"),
    ConfigKey("hoodie.compact.inline.max.delta.seconds", _parse_positive_int, 3600,
              "Seconds after which a compaction is due (time-based triggers).",
              attr="compact_max_delta_seconds"),
    ConfigKey("hoodie.compaction.strategy", _parse_compaction_strategy,
              "UnBoundedCompactionStrategy",
              "Which file slices a compaction plan takes: UnBoundedCompactionStrategy (every "
              "slice with log files) or LogFileSizeBasedCompactionStrategy (most log bytes "
              "first, up to hoodie.compaction.target.io).", attr="compaction_strategy"),
    ConfigKey("hoodie.compaction.target.io", _parse_positive_int, 512_000,
              "MB of I/O one compaction plan may take (LogFileSizeBasedCompactionStrategy).",
              attr="compaction_target_io_mb"),
    ConfigKey("hoodie.compaction.logfile.size.threshold", _parse_count, 0,
              "Only slices with at least this many log bytes are compacted.",
              attr="compaction_log_size_threshold"),
    ConfigKey("hoodie.compaction.logfile.num.threshold", _parse_count, 0,
              "Only slices with at least this many log files are compacted.",
              attr="compaction_log_num_threshold"),
    ConfigKey("hoodie.datasource.compaction.async.enable", _parse_bool, True,
              "Streaming job (MERGE_ON_READ): schedule compactions after micro-batches and "
              "execute them in the job's service thread, beside ingestion.",
              attr="compaction_async"),
    ConfigKey("tidelake.services.max.pending.compactions", _parse_positive_int, 2,
              "Streaming job: when this many compactions are pending, the next micro-batch "
              "waits for the service thread to finish one (back-pressure).",
              attr="max_pending_compactions"),
    ConfigKey("tidelake.services.parallelism", _parse_count, 0,
              "Streaming job: Spark tasks a service runs at once (0: half the job's cores, at "
              "least 1), so services never take every executor slot from ingestion.",
              attr="services_parallelism"),
    ConfigKey("hoodie.clean.automatic", _parse_bool, True,
              "Clean old file slices after every write.", attr="clean_automatic"),
    ConfigKey("hoodie.clean.async", _parse_bool, False,
              "Run the automatic clean beside ingestion instead of after the write (the "
              "streaming job).", aliases=("hoodie.clean.async.enabled",), attr="clean_async"),
    ConfigKey("hoodie.cleaner.policy", _enum_parser(CleanerPolicy),
              CleanerPolicy.KEEP_LATEST_COMMITS,
              "KEEP_LATEST_COMMITS, KEEP_LATEST_FILE_VERSIONS or KEEP_LATEST_BY_HOURS.",
              aliases=("hoodie.clean.policy",), attr="cleaner_policy"),
    ConfigKey("hoodie.cleaner.commits.retained", _parse_positive_int, 10,
              "KEEP_LATEST_COMMITS: commits whose files stay readable (time travel and "
              "incremental reads).", aliases=("hoodie.clean.commits.retained",),
              attr="cleaner_commits_retained"),
    ConfigKey("hoodie.cleaner.fileversions.retained", _parse_positive_int, 3,
              "KEEP_LATEST_FILE_VERSIONS: file slices kept per file group.",
              aliases=("hoodie.clean.fileversions.retained",),
              attr="cleaner_fileversions_retained"),
    ConfigKey("hoodie.cleaner.hours.retained", _parse_positive_int, 24,
              "KEEP_LATEST_BY_HOURS: hours of commits whose files stay readable.",
              aliases=("hoodie.clean.hours.retained",), attr="cleaner_hours_retained"),
    ConfigKey("hoodie.archive.automatic", _parse_bool, True,
              "Archive old instants to the timeline history after every write.",
              attr="archive_automatic"),
    ConfigKey("hoodie.keep.min.commits", _parse_positive_int, 20,
              "Completed commits archival keeps on the active timeline.",
              attr="keep_min_commits"),
    ConfigKey("hoodie.keep.max.commits", _parse_positive_int, 30,
              "Completed commits on the active timeline that trigger archival.",
              attr="keep_max_commits"),
    ConfigKey("hoodie.timeline.compaction.batch.size", _parse_positive_int, 10,
              "Files of one level of the timeline history merged into one of the next.",
              attr="timeline_compaction_batch_size"),
    ConfigKey("hoodie.archive.beyond.savepoint", _parse_bool, False,
              "Archive past the first savepoint (savepointed commits stay).",
              attr="archive_beyond_savepoint"),
    ConfigKey("hoodie.clustering.inline", _parse_bool, False,
              "Schedule and run a clustering right after a write when one is due.",
              attr="clustering_inline"),
    ConfigKey("hoodie.clustering.inline.max.commits", _parse_positive_int, 4,
              "Commits after which an inline clustering is due.",
              attr="clustering_inline_max_commits"),
    ConfigKey("hoodie.clustering.schedule.inline", _parse_bool, False,
              "Schedule (only) a clustering right after a write when one is due.",
              attr="clustering_schedule_inline"),
    ConfigKey("hoodie.clustering.async.enabled", _parse_bool, False,
              "Cluster beside ingestion (the streaming job).", attr="clustering_async"),
    ConfigKey("hoodie.clustering.async.max.commits", _parse_positive_int, 4,
              "Commits after which an async clustering is due.",
              attr="clustering_async_max_commits"),
    ConfigKey("hoodie.clustering.plan.strategy.small.file.limit", _parse_positive_int,
              300 * 1024 * 1024, "File slices smaller than this are clustered.",
              attr="clustering_small_file_limit"),
    ConfigKey("hoodie.clustering.plan.strategy.target.file.max.bytes", _parse_positive_int,
              1024 * 1024 * 1024, "Target size of the file groups clustering writes.",
              attr="clustering_target_file_max_bytes"),
    ConfigKey("hoodie.clustering.plan.strategy.max.bytes.per.group", _parse_positive_int,
              2 * 1024 * 1024 * 1024, "Bytes of input one clustering group takes at most.",
              attr="clustering_max_bytes_per_group"),
    ConfigKey("hoodie.clustering.plan.strategy.max.num.groups", _parse_positive_int, 30,
              "Clustering groups one plan takes at most.", attr="clustering_max_num_groups"),
    ConfigKey("hoodie.clustering.plan.strategy.sort.columns", _parse_columns, (),
              "Columns clustering sorts by (comma-separated; none: no sort).",
              attr="clustering_sort_columns"),
    ConfigKey("hoodie.clustering.plan.strategy.partition.selected", _parse_columns, (),
              "Only these partitions are clustered (comma-separated partition paths).",
              attr="clustering_partitions_selected"),
    ConfigKey("hoodie.clustering.plan.strategy.partition.regex.pattern", _parse_text, "",
              "Only partitions whose path matches this regular expression are clustered.",
              attr="clustering_partition_regex"),
    ConfigKey("hoodie.clustering.plan.strategy.single.group.clustering.enabled", _parse_bool,
              True, "Cluster a partition even when it yields a single one-slice group.",
              attr="clustering_single_group"),
    ConfigKey("hoodie.bucket.index.max.num.buckets", _parse_positive_int, None,
              "CONSISTENT_HASHING: most buckets a partition may grow to by splits (unset: "
              "hoodie.bucket.index.num.buckets, i.e. no split, as in Hudi).",
              attr="bucket_max_num_buckets"),
    ConfigKey("hoodie.bucket.index.min.num.buckets", _parse_positive_int, None,
              "CONSISTENT_HASHING: fewest buckets a partition may shrink to by merges (unset: "
              "hoodie.bucket.index.num.buckets, i.e. no merge, as in Hudi).",
              attr="bucket_min_num_buckets"),
    ConfigKey("hoodie.bucket.index.split.threshold", _parse_positive_float, 2.0,
              "CONSISTENT_HASHING: a bucket whose file slice exceeds this times "
              "hoodie.parquet.max.file.size splits in two at the next resize.",
              attr="bucket_split_threshold"),
    ConfigKey("hoodie.bucket.index.merge.threshold", _parse_positive_float, 0.2,
              "CONSISTENT_HASHING: adjacent buckets whose file slices are together below this "
              "times hoodie.parquet.max.file.size merge at the next resize.",
              attr="bucket_merge_threshold"),
    ConfigKey("hoodie.layout.optimize.strategy", _parse_layout_strategy, "linear",
              "How clustering orders the sort columns: linear, z-order or hilbert.",
              attr="layout_optimize_strategy"),
)

_CODECS = ("snappy", "zstd", "gzip", "none", "uncompressed", "lz4", "brotli")


def _codec(key: str, raw: str) -> str:
    value = str(raw).strip().lower()
    if value not in _CODECS:
        raise InvalidOptionError(key, f"expected one of {', '.join(_CODECS)}, got {raw!r}")
    return "none" if value == "uncompressed" else value


@dataclass(frozen=True)
class WriteConfig:
    """Typed writer options; build with :meth:`from_options`."""

    index_type: IndexType = IndexType.SIMPLE
    bucket_engine: BucketEngine = BucketEngine.SIMPLE
    num_buckets: int = 4
    log_block_format: LogBlockFormat = LogBlockFormat.PARQUET
    max_file_size: int = 120 * 1024 * 1024
    small_file_limit: int = 100 * 1024 * 1024
    record_size_estimate: int = 1024
    compression: str = "snappy"
    combine_before_upsert: bool = True
    write_bloom_filter: bool = True
    concurrency_mode: ConcurrencyMode | None = None
    lock_provider: str = FS_LOCK_PROVIDER
    lock_wait_ms: int = 60_000
    lock_expire_minutes: float = 1.0
    heartbeat_interval_ms: int = 60_000
    heartbeat_tolerable_misses: int = 2
    rolling_metadata_keys: tuple[str, ...] = ()
    compact_inline: bool = False
    compact_schedule_inline: bool = False
    compact_trigger: CompactionTrigger = CompactionTrigger.NUM_COMMITS
    compact_max_delta_commits: int = 5
    compact_max_delta_seconds: int = 3600
    compaction_strategy: str = "UnBoundedCompactionStrategy"
    compaction_target_io_mb: int = 512_000
    compaction_log_size_threshold: int = 0
    compaction_log_num_threshold: int = 0
    compaction_async: bool = True
    max_pending_compactions: int = 2
    services_parallelism: int = 0
    clean_automatic: bool = True
    clean_async: bool = False
    cleaner_policy: CleanerPolicy = CleanerPolicy.KEEP_LATEST_COMMITS
    cleaner_commits_retained: int = 10
    cleaner_fileversions_retained: int = 3
    cleaner_hours_retained: int = 24
    archive_automatic: bool = True
    keep_min_commits: int = 20
    keep_max_commits: int = 30
    timeline_compaction_batch_size: int = 10
    archive_beyond_savepoint: bool = False
    clustering_inline: bool = False
    clustering_inline_max_commits: int = 4
    clustering_schedule_inline: bool = False
    clustering_async: bool = False
    clustering_async_max_commits: int = 4
    clustering_small_file_limit: int = 300 * 1024 * 1024
    clustering_target_file_max_bytes: int = 1024 * 1024 * 1024
    clustering_max_bytes_per_group: int = 2 * 1024 * 1024 * 1024
    clustering_max_num_groups: int = 30
    clustering_sort_columns: tuple[str, ...] = ()
    clustering_partitions_selected: tuple[str, ...] = ()
    clustering_partition_regex: str = ""
    clustering_single_group: bool = True
    layout_optimize_strategy: str = "linear"
    bucket_max_num_buckets: int | None = None
    bucket_min_num_buckets: int | None = None
    bucket_split_threshold: float = 2.0
    bucket_merge_threshold: float = 0.2
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
P_DROP_PARTITION_COLUMNS = "hoodie.datasource.write.drop.partition.columns"
P_BASE_FORMAT = "hoodie.table.base.file.format"
P_LOG_FORMAT = "hoodie.table.log.file.format"
P_POPULATE_META = "hoodie.populate.meta.fields"
P_CREATE_SCHEMA = "hoodie.table.create.schema"
P_ARCHIVE_FOLDER = "hoodie.archivelog.folder"
P_TIMEZONE = "hoodie.table.timeline.timezone"
P_PAYLOAD = "hoodie.compaction.payload.class"
P_MERGE_MODE = "hoodie.record.merge.mode"
P_MERGE_STRATEGY = "hoodie.record.merge.strategy.id"
P_CDC = "hoodie.table.cdc.enabled"
P_CHECKSUM = "hoodie.table.checksum"
P_BUCKETS = "hoodie.bucket.index.num.buckets"
P_INDEX_TYPE = "hoodie.index.type"
P_BUCKET_ENGINE = "hoodie.index.bucket.engine"


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
    def consistent_hashing(self) -> bool:
        """True for a BUCKET table with the consistent-hashing engine (RFC-42)."""
        return self.bucket_engine is BucketEngine.CONSISTENT_HASHING

    @property
    def is_mor(self) -> bool:
        """True for merge-on-read tables."""
        return self.table_type is TableType.MERGE_ON_READ

    @property
    def timeline_layout(self) -> int:
        """Timeline layout version: 1 for tables before version 8, 2 from version 8 on."""
        return 2 if self.version >= 8 else 1

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> TableConfig:
        """Parse ``hoodie.properties``; raises for versions or features we cannot read."""
        try:
            name = props[P_NAME]
            table_type = TableType(props[P_TYPE].upper().replace("COW", "COPY_ON_WRITE")
                                   .replace("MOR", "MERGE_ON_READ"))
        except (KeyError, ValueError) as exc:
            raise UnsupportedTableError(f"hoodie.properties lacks a valid {exc}") from None
        version = int(props.get(P_VERSION, "6"))
        if version not in (6, 8, 9):
            raise UnsupportedTableError(
                f"table version {version} is not supported (only 6, 8 and 9)")
        precombine = props.get(P_PRECOMBINE) or props.get(P_ORDERING_V9) or None
        if precombine and "," in precombine:
            raise UnsupportedTableError(f"multiple ordering fields {precombine!r} not supported")
        merge_mode = _merge_mode_of(props, precombine)
        partition_fields = _split_fields(props.get(P_PARTITION_FIELDS))
        record_keys = _split_fields(props.get(P_RECORD_KEYS))
        keygen = _keygen_of(props, record_keys, partition_fields)
        index_raw = props.get(P_INDEX_TYPE)
        buckets_raw = props.get(P_BUCKETS)
        engine_raw = props.get(P_BUCKET_ENGINE)
        try:
            engine = BucketEngine(engine_raw.upper()) if engine_raw else None
        except ValueError:
            raise UnsupportedTableError(f"bucket index engine {engine_raw!r} is not "
                                        "supported") from None
        return cls(
            name=name, table_type=table_type, version=version,
            record_key_fields=record_keys, partition_fields=partition_fields,
            precombine_field=precombine, merge_mode=merge_mode,
            hive_style=props.get(P_HIVE_STYLE, "false").lower() == "true",
            url_encode=props.get(P_URL_ENCODE, "false").lower() == "true",
            populate_meta_fields=props.get(P_POPULATE_META, "true").lower() == "true",
            create_schema=props.get(P_CREATE_SCHEMA),
            database=props.get(P_DATABASE, ""),
            keygen_type=keygen,
            timeline_path=props.get(P_TIMELINE_PATH, "timeline"),
            index_type=IndexType(index_raw) if index_raw else None,
            num_buckets=int(buckets_raw) if buckets_raw else None,
            bucket_engine=engine,
            raw=dict(props),
        )

    def to_properties(self) -> dict[str, str]:
        """The key/value map written to ``hoodie.properties`` (checksum last)."""
        props: dict[str, str] = {
            P_NAME: self.name,
            P_TYPE: self.table_type.value,
            P_VERSION: str(self.version),
            P_INITIAL_VERSION: str(self.version),
            P_LAYOUT: str(self.timeline_layout),
            P_TIMELINE_PATH: self.timeline_path,
            P_HISTORY_PATH: "history",
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
        }
        if self.precombine_field:
            props[P_PRECOMBINE] = self.precombine_field
        if self.merge_mode is MergeMode.EVENT_TIME_ORDERING:
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


def _merge_mode_of(props: Mapping[str, str], precombine: str | None) -> MergeMode:
    raw = props.get(P_MERGE_MODE)
    if raw:
        try:
            return MergeMode(raw.upper())
        except ValueError:
            raise UnsupportedTableError(f"merge mode {raw!r} is not supported") from None
    payload = props.get(P_PAYLOAD, "")
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
    if not partition_fields and len(record_keys) <= 1:
        return KeyGeneratorType.NON_PARTITION if not raw_class else KeyGeneratorType.SIMPLE
    if len(record_keys) > 1 or len(partition_fields) > 1:
        return KeyGeneratorType.COMPLEX
    return KeyGeneratorType.SIMPLE
