"""The ingest job's configuration: a TOML file, every value overridable by a flag.

Each setting is declared once in :data:`SETTINGS` (section, key, type, default, doc); the
TOML file and the ``--section.key value`` flags are parsed into a frozen
:class:`JobConfig`. A setting that fills an argument of the sink takes its default from
:class:`~ingest.sink_config.SinkConfig` (``sink``); one that stands for a table option takes
its default and doc from the option's declaration in :mod:`engine.config` (``option``). An
unknown section or key, or a value of the wrong type, is an
:class:`~engine.errors.InvalidOptionError` naming ``section.key``. Pass-through tables
(``[source.kafka]``, ``[table.options]``, ``[spark.conf]``) take any key of their kind;
values whose key looks secret are redacted wherever the config is printed.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from engine.config import WRITE_KEYS, ConfigKey
from engine.errors import InvalidOptionError
from engine.redact import REDACTED, is_secret_key, redact
from ingest.sink_config import sink_default


def _str(key: str, value: Any) -> str:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    shown = REDACTED if is_secret_key(key) else repr(value)
    raise InvalidOptionError(key, f"expected a string, got {shown}")


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidOptionError(key, f"expected a whole number, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidOptionError(key, f"expected a whole number, got {value!r}") from None


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidOptionError(key, f"expected true or false, got {value!r}")


def _list(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, list | tuple):
        items = [_str(key, v) for v in value]
    else:
        raise InvalidOptionError(key, f"expected a list of strings, got {value!r}")
    return tuple(items)


def _fraction(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise InvalidOptionError(key, f"expected a number from 0 to 1, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidOptionError(key, f"expected a number from 0 to 1, got {value!r}") from None
    if not 0 <= number <= 1:
        raise InvalidOptionError(key, f"expected a number from 0 to 1, got {value!r}")
    return number


def _port(key: str, value: Any) -> int:
    number = _int(key, value)
    if not 1 <= number <= 65535:
        raise InvalidOptionError(key, f"expected a TCP port from 1 to 65535, got {value!r}")
    return number


def _table_location(key: str, value: Any) -> str:
    """A table location: a local folder, ``file://`` URI or object store URI
    (``s3://``, ``gs://``, ``az://``, ``abfs[s]://``; options in ``[table.storage]``)."""
    from engine.errors import UnsupportedStorageError
    from engine.storage import normalize_location

    try:
        return normalize_location(_str(key, value))
    except UnsupportedStorageError as exc:
        raise InvalidOptionError(key, str(exc)) from None


def _location(key: str, value: Any) -> str:
    """A local folder or ``file://`` URI, as a local path; other URIs are refused."""
    from engine.errors import UnsupportedStorageError
    from engine.storage import local_path

    try:
        return local_path(_str(key, value))
    except UnsupportedStorageError as exc:
        raise InvalidOptionError(key, str(exc)) from None


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        text = _str(key, value)
        for choice in choices:
            if text.lower() == choice.lower():
                return choice
        raise InvalidOptionError(key, f"expected one of {', '.join(choices)}, got {value!r}")

    return parse


@dataclass(frozen=True)
class Setting(ConfigKey[Any]):
    """One declared job setting: an option (:class:`~engine.config.ConfigKey`) whose key is
    ``section.key``, plus what it fills or stands for."""

    sink: str = ""
    """The :class:`~ingest.sink_config.SinkConfig` field the setting fills, if any."""
    option: str = ""
    """The table option the setting stands for, if any (``[services]``): unset, the table
    option decides."""
    kafka: str = ""
    """The option of the ``tidelake-kafka`` source the setting sets, if any
    (:func:`source_options`)."""

    @property
    def name(self) -> str:
        """``section.key``."""
        return self.key

    @property
    def section(self) -> str:
        """The TOML table the setting is in."""
        return self.key.split(".", 1)[0]


_NO_DEFAULT: Any = object()


def _sink(name: str, parse: Callable[[str, Any], Any], field_name: str, doc: str,
          default: Any = _NO_DEFAULT) -> Setting:
    """A setting that fills the sink's ``field_name``, by default with the sink's default."""
    value = sink_default(field_name) if default is _NO_DEFAULT else default
    return Setting(name, parse, value, doc, sink=field_name)


def _kafka(name: str, parse: Callable[[str, Any], Any], source_key: str, doc: str,
           default: Any = _NO_DEFAULT) -> Setting:
    """A setting that sets the Kafka source's option ``source_key``, by default to the
    source's own default."""
    from ingest.kafka_options import CLIENT_KEYS, SOURCE_KEYS

    if default is _NO_DEFAULT:
        default = next(s.default for s in (*SOURCE_KEYS, *CLIENT_KEYS) if s.key == source_key)
    return Setting(name, parse, default, doc, kafka=source_key)


def _option(name: str, parse: Callable[[str, Any], Any], option: str, doc: str) -> Setting:
    """A setting that stands for the table option ``option``; its doc ends with the option's
    default and key."""
    spec = next(s for s in WRITE_KEYS if s.key == option)
    value = spec.default
    shown = (str(value).lower() if isinstance(value, bool)
             else getattr(value, "value", value))
    return Setting(name, parse, None, f"{doc} (default {shown}; {option}).", option=option)


SETTINGS: tuple[Setting, ...] = (
    _kafka("source.bootstrap_servers", _str, "kafka.bootstrap.servers",
           "Kafka bootstrap servers (required)."),
    _kafka("source.topics", _list, "subscribe", "Topics to read (required).", default=None),
    _kafka("source.starting_offsets", _str, "startingOffsets",
           "earliest, latest, or JSON {\"topic\": {\"0\": 42}}; used when the checkpoint "
           "and the table hold no offsets.", default="earliest"),
    _kafka("source.max_offsets_per_trigger", _int, "maxOffsetsPerTrigger",
           "Records per micro-batch at most, across partitions.", default=200000),
    _kafka("source.fail_on_data_loss", _bool, "failOnDataLoss",
           "Stop when offsets to read were lost to retention."),
    Setting("source.use_builtin_kafka", _bool, False,
            "Use Spark's own 'kafka' format (needs the spark-sql-kafka jar)."),
    Setting("decode.format", _choice("json", "avro", "avro-confluent"), "json",
            "Value encoding: json (one JSON object per value; schema from decode.schema or "
            "decode.schema_file), avro (Avro binary, one record per value, written with "
            "decode.schema_file) or avro-confluent (Confluent framing: magic byte, schema id, "
            "Avro; not usable from a job file yet, see docs/ingest.md)."),
    Setting("decode.schema", _str, None, "Spark DDL schema of JSON values."),
    Setting("decode.schema_file", _str, None, "Avro .avsc file (JSON or Avro values)."),
    _sink("decode.key_format", _choice("string", "json", "avro"), "key_format",
          "How a tombstone's Kafka key gives its record key: string (the key is the record "
          "key string), json or avro (the key holds the record key fields)."),
    _sink("decode.key_schema", _str, "key_schema",
          "Schema of Kafka keys: DDL or .avsc for json (default: the key and partition "
          "fields), .avsc for avro (required)."),
    _sink("table.path", _table_location, "table_path",
          "Table folder, file:// URI or object store URI (s3://, gs://, az://, abfs[s]://; "
          "store options in [table.storage]) (required).",
          default=None),
    _sink("table.name", _str, "table_name", "Table name (required when creating)."),
    _sink("table.type", _choice("MERGE_ON_READ", "COPY_ON_WRITE"), "table_type",
          "Table type when creating."),
    _sink("table.record_key", _list, "record_key", "Record key field(s) (required)."),
    _sink("table.precombine", _str, "precombine", "Ordering (precombine) field."),
    _sink("table.partition_by", _list, "partition_by", "Partition field(s).", default=()),
    _sink("table.delete_field", _str, "delete_column",
          "Boolean field marking a record as a delete (a Kafka tombstone also deletes)."),
    _sink("index.type", _choice("BUCKET", "GLOBAL_STATE", "RECORD_INDEX"), "index",
          "BUCKET (partition-level), GLOBAL_STATE (state-store global index) or RECORD_INDEX "
          "(global: the metadata table's record_index, looked up per batch; needs "
          "hoodie.metadata.enable, on by default)."),
    _option("index.bucket_engine", _choice("SIMPLE", "CONSISTENT_HASHING"),
            "hoodie.index.bucket.engine",
            "BUCKET: SIMPLE (a fixed bucket count) or CONSISTENT_HASHING (buckets split and "
            "merge as partitions grow and shrink; MERGE_ON_READ only; resizes run with "
            "[services] clustering). Fixed when the table is created"),
    _sink("index.num_buckets", _int, "num_buckets",
          "Buckets per partition (BUCKET; CONSISTENT_HASHING: the initial count)."),
    _sink("index.update_partition_path", _bool, "update_partition_path",
          "GLOBAL_STATE and RECORD_INDEX: a record whose partition changed moves (true: old "
          "copy deleted) or is updated where it is stored (false); RECORD_INDEX: sets "
          "hoodie.record.index.update.partition.path (default: that option, else true)."),
    _sink("index.state_shards", _int, "state_shards",
          "GLOBAL_STATE: key shards of the state (1 to 4096; fixed for a checkpoint): the "
          "state operator runs once per shard and micro-batch."),
    Setting("trigger.processing_time", _str, "5 seconds", "Micro-batch interval."),
    Setting("trigger.available_now", _bool, False,
            "Process what is in the topics now, then stop."),
    Setting("checkpoint.location", _location, None,
            "Spark checkpoint folder or file:// URI (required)."),
    _sink("checkpoint.identifier", _str, "checkpoint_identifier",
          "This job's writer identifier in the table's commits (Hudi's "
          "hoodie.datasource.write.streaming.checkpoint.identifier): give every job that "
          "writes the same table its own."),
    _sink("table.conflict_retries", _int, "conflict_retries",
          "How often a micro-batch refused because a concurrent writer touched the same "
          "file groups is replanned and written again before the job fails."),
    _sink("services.enabled", _bool, "services",
          "Run the table services inside the job (beside ingestion); false leaves them to "
          "'tidelake table compact|clean|...' or another process."),
    _option("services.compaction", _bool, "hoodie.datasource.compaction.async.enable",
            "MERGE_ON_READ: schedule compactions and execute them in the job"),
    _option("services.compaction_delta_commits", _int,
            "hoodie.compact.inline.max.delta.commits",
            "Deltacommits after which a compaction is scheduled"),
    _option("services.max_pending_compactions", _int,
            "tidelake.services.max.pending.compactions",
            "With this many compactions pending the next micro-batch waits"),
    _option("services.clean", _bool, "hoodie.clean.automatic",
            "Clean file slices no longer needed"),
    _option("services.commits_retained", _int, "hoodie.cleaner.commits.retained",
            "Commits whose files the cleaner keeps readable for time travel and incremental "
            "reads"),
    _option("services.archive", _bool, "hoodie.archive.automatic",
            "Archive old instants to the timeline history"),
    _option("services.clustering", _bool, "hoodie.clustering.async.enabled",
            "Schedule and run clustering in the job (not for SIMPLE bucket tables; on "
            "CONSISTENT_HASHING tables a clustering resizes the buckets)"),
    _option("services.clustering_commits", _int, "hoodie.clustering.async.max.commits",
            "Commits after which a clustering is scheduled"),
    _option("services.parallelism", _int, "tidelake.services.parallelism",
            "Spark tasks a service runs at once, 0 for half the cores"),
    _option("metrics.enabled", _bool, "hoodie.metrics.on",
            "Serve the job's metrics on a Prometheus endpoint (docs/ingest.md, \"Metrics\")"),
    _option("metrics.port", _port, "hoodie.metrics.prometheus.port",
            "Port of the metrics endpoint, http://HOST:PORT/metrics on all interfaces"),
    Setting("spark.master", _str, "local[2]", "Spark master URL."),
    Setting("spark.app_name", _str, "tidelake-ingest", "Spark application name."),
    _sink("errors.table_path", _table_location, "error_table_path",
          "Error (dead-letter) table location, as table.path; default: <table.path>_errors."),
    _sink("errors.max_fraction", _fraction, "max_error_fraction",
          "A micro-batch (of 10 records or more) with a larger share of bad records fails "
          "and commits nothing, naming the most common reason; 1 turns the check off."),
)

SERVICE_OPTIONS = {s.name: s.option for s in SETTINGS if s.option}
"""``[services]`` settings (and ``index.bucket_engine``) and the table option each sets."""
SINK_FIELDS = {s.name: s.sink for s in SETTINGS if s.sink}
"""Settings that fill an argument of the sink, and the :class:`SinkConfig` field each fills."""

PASS_THROUGH = {"source.kafka": "kafka.", "table.options": "hoodie.", "spark.conf": "spark.",
                "table.storage": "aws_"}
REQUIRED = ("source.bootstrap_servers", "source.topics", "table.path", "table.record_key",
            "checkpoint.location")


@dataclass(frozen=True)
class JobConfig:
    """A parsed job: ``values`` by ``section.key``, plus the pass-through maps."""

    values: Mapping[str, Any]
    kafka: Mapping[str, str] = field(default_factory=dict)
    table_options: Mapping[str, str] = field(default_factory=dict)
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    """``[table.storage]``: the object store's options of the data and error tables."""

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def redacted(self) -> dict[str, Any]:
        """Everything, with secret-looking values replaced (safe to print or log; see
        :mod:`engine.redact`)."""
        out: dict[str, Any] = dict(self.values)
        for prefix, mapping in (("source.kafka", self.kafka), ("table.options",
                                 self.table_options), ("spark.conf", self.spark_conf),
                                ("table.storage", self.storage_options)):
            for key, value in redact(mapping).items():
                out[f"{prefix}.{key}"] = value
        return out


_BY_NAME = {s.name: s for s in SETTINGS}


def _dotted(options: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Pass-through options as dotted names: TOML reads ``hoodie.a.b = 1`` unquoted as nested
    tables, which name the same option as the quoted ``"hoodie.a.b" = 1``."""
    out: list[tuple[str, Any]] = []
    for key, value in options.items():
        if isinstance(value, dict):
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _flatten(data: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, body in data.items():
        if not isinstance(body, dict):
            raise InvalidOptionError(section, f"{where}: expected a [{section}] table")
        for key, value in body.items():
            name = f"{section}.{key}"
            if name in PASS_THROUGH:
                if not isinstance(value, dict):
                    raise InvalidOptionError(name, f"{where}: expected a table of options")
                for sub, sub_value in _dotted(value):
                    flat[f"{name}.{sub}"] = sub_value
                continue
            flat[name] = value
    return flat


def load(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> JobConfig:
    """Parse a TOML job file (optional) and flag overrides into a :class:`JobConfig`."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidOptionError("config", f"cannot read {path}: {exc}") from None
        try:
            raw = _flatten(tomllib.loads(text), where=str(path))
        except tomllib.TOMLDecodeError as exc:
            raise InvalidOptionError("config", f"{path} is not valid TOML: {exc}") from None
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    values: dict[str, Any] = {s.name: s.default for s in SETTINGS}
    passthrough: dict[str, dict[str, str]] = {k: {} for k in PASS_THROUGH}
    for name, value in raw.items():
        prefix = next((p for p in PASS_THROUGH if name.startswith(p + ".")), None)
        if prefix is not None:
            passthrough[prefix][name[len(prefix) + 1:]] = _str(name, value)
            continue
        setting = _BY_NAME.get(name)
        if setting is None:
            raise InvalidOptionError(name, "unknown setting; see docs/ingest.md")
        values[name] = setting.parse(name, value)
    missing = [name for name in REQUIRED if values.get(name) in (None, ())]
    if missing:
        raise InvalidOptionError(missing[0], "is required (in the file or as a flag)")
    if values["decode.format"] == "json" and not (values["decode.schema"]
                                                  or values["decode.schema_file"]):
        raise InvalidOptionError("decode.schema", "JSON values need decode.schema or "
                                 "decode.schema_file")
    if values["decode.key_format"] == "avro" and not values["decode.key_schema"]:
        raise InvalidOptionError("decode.key_schema", "Avro Kafka keys need their .avsc file")
    if values["decode.key_format"] == "string" and values["decode.key_schema"]:
        raise InvalidOptionError("decode.key_schema", "only used with decode.key_format "
                                 "json or avro")
    if values["decode.format"] != "json" and not values["decode.schema_file"]:
        raise InvalidOptionError("decode.schema_file", f"format {values['decode.format']} "
                                 "needs an Avro schema file (.avsc)")
    if values["decode.format"] == "avro-confluent":
        raise InvalidOptionError(
            "decode.format", "avro-confluent needs each writer schema by its registry id, which "
            "a job file cannot give yet; use avro (plain Avro binary values) or, from Python, "
            "ingest.decode.AvroDecoder(schema, confluent=True, schema_map={id: schema})")
    config = JobConfig(values, passthrough["source.kafka"], passthrough["table.options"],
                       passthrough["spark.conf"], passthrough["table.storage"])
    if not values["source.use_builtin_kafka"]:  # Spark's own source takes Java options unchecked
        check_kafka_options(config)
    return config


_SOURCE_OPTION_SETTINGS = {s.kafka.lower(): s.name for s in SETTINGS if s.kafka}


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return ",".join(value)
    return str(value)


def source_options(config: JobConfig, starting_offsets: str | None = None) -> dict[str, str]:
    """The options of the ``tidelake-kafka`` source for this job: the settings that set one
    (``Setting.kafka``) and ``[source.kafka]`` (``starting_offsets`` replaces
    ``source.starting_offsets``, e.g. by offsets the table recorded)."""
    options = {s.kafka: _option_text(config[s.name]) for s in SETTINGS if s.kafka}
    if starting_offsets:
        options["startingOffsets"] = starting_offsets
    for key, value in config.kafka.items():
        options[f"kafka.{key}"] = value
    return options


def check_kafka_options(config: JobConfig) -> None:
    """Parse the job's Kafka options as the source will, so a typo in ``[source.kafka]`` (an
    unknown key, ``SASL_PLAINTXT``) fails here, before Spark starts; the error names the job
    setting (``source.kafka.security.protocol``)."""
    from ingest.kafka_options import KafkaSourceOptions

    try:
        KafkaSourceOptions.from_options(source_options(config))
    except InvalidOptionError as exc:
        key = exc.key.lower()
        name = _SOURCE_OPTION_SETTINGS.get(key) or (
            f"source.kafka.{exc.key[len('kafka.'):]}" if key.startswith("kafka.") else exc.key)
        message = str(exc).split(": ", 1)[1] if ": " in str(exc) else str(exc)
        raise InvalidOptionError(name, message) from None


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--section.key`` flag per setting, plus ``--set name=value`` for pass-through."""
    for setting in SETTINGS:
        parser.add_argument(f"--{setting.name}", dest=setting.name, default=None,
                            metavar="VALUE", help=setting.doc)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any setting, e.g. --set table.options.hoodie.index.type=BUCKET")


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The flag values given on the command line, by setting name."""
    found: dict[str, Any] = {}
    for setting in SETTINGS:
        value = getattr(args, setting.name, None)
        if value is not None:
            found[setting.name] = value
    for item in getattr(args, "set", []) or []:
        name, sep, value = str(item).partition("=")
        if not sep or not name:
            raise InvalidOptionError(str(item), "expected --set NAME=VALUE")
        found[name.strip()] = value
    return found


def describe(settings: Sequence[Setting] = SETTINGS) -> str:
    """A Markdown table of every setting (kept in sync with docs by a test)."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for s in settings:
        default = "" if s.default in (None, ()) else f"`{s.default}`"
        rows.append(f"| `{s.name}` | {default} | {s.doc} |")
    return "\n".join(rows)


def _markdown(text: str) -> str:
    """A docstring's reST as a Markdown table cell: ``x`` becomes `x`, :role:`~a.b.x` `x`,
    :role:`a.b.x` `a.b.x`; ``|`` is escaped."""
    text = re.sub(r":\w+:`(~?)([\w.]+)`",
                  lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`",
                  text)
    return text.replace("``", "`").replace("|", "\\|")


def describe_sink_arguments() -> str:
    """A Markdown table of :class:`~ingest.sink_config.SinkConfig`'s fields with the job setting
    that fills each (kept in sync with docs/configuration.md by a test)."""
    from dataclasses import MISSING, fields

    from ingest.sink_config import SinkConfig, field_docs

    setting = {field: name for name, field in SINK_FIELDS.items()}
    docs = field_docs()
    rows = ["| argument | job setting | default | meaning |", "|---|---|---|---|"]
    for f in fields(SinkConfig):
        if f.default is MISSING:
            default = "required"
        elif f.default is None:
            default = "none"
        else:
            default = f"`{f.default}`"
        name = f"`{setting[f.name]}`" if f.name in setting else ""
        rows.append(f"| `{f.name}` | {name} | {default} | {_markdown(docs[f.name])} |")
    return "\n".join(rows)
