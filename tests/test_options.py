"""Every option is declared once (key, parser, default, doc), and its declaration, its use and
docs/configuration.md agree."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from engine.config import (
    CREATE_KEYS,
    PROPERTY_KEYS,
    WRITE_KEYS,
    TableConfig,
    WriteConfig,
    describe_options,
)
from engine.errors import InvalidOptionError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"

NOT_READ = {
    "clean_async": "hoodie.clean.async is accepted under Hudi's name and documented as having "
                   "no effect: the streaming job always cleans in its service thread, a Table "
                   "write inline (test_clean_async_has_no_effect_on_where_cleaning_runs)",
}
"""Declared options no code reads, each with the reason it is still accepted."""


def _source(*, skip: tuple[str, ...] = ()) -> str:
    parts = []
    for package in ("engine", "ingest", "jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)) not in skip:
                parts.append(path.read_text())
    return "\n".join(parts)


def _doc_table_keys(heading: str) -> list[str]:
    text = DOC.read_text()
    start = text.index(heading)
    table = text[text.index("| key |", start):text.index("\n\n", text.index("| key |", start))]
    return re.findall(r"^\| `([^`]+)`", table, re.M)


def test_write_config_fields_are_the_declared_options_with_their_defaults() -> None:
    declared = {spec.attr: spec for spec in WRITE_KEYS}
    defaults = WriteConfig()
    for f in fields(WriteConfig):
        if f.name == "extra":
            continue
        assert f.name in declared, f"WriteConfig.{f.name} has no option declaration"
        assert f.default is not MISSING
        assert f.default == declared[f.name].default == getattr(defaults, f.name), f.name
    names = [k for spec in WRITE_KEYS for k in (spec.key, *spec.aliases)]
    assert len(names) == len(set(names)), "an option key or alias is declared twice"
    assert all(spec.doc and spec.group in ("writer", "services", "metadata", "metrics")
               for spec in WRITE_KEYS)


def test_every_declared_write_option_is_read() -> None:
    source = _source(skip=("engine/config.py",))
    unread = [spec.attr for spec in WRITE_KEYS
              if spec.attr not in NOT_READ and not re.search(rf"\.{spec.attr}\b", source)]
    assert unread == []
    assert all(attr in {s.attr for s in WRITE_KEYS} for attr in NOT_READ)


@pytest.mark.parametrize(("heading", "group"), [("## Writer options", "writer"),
                                                ("## Table services", "services"),
                                                ("## Metadata table", "metadata"),
                                                ("## Metrics", "metrics"),
                                                ("## Table options (only at creation)",
                                                 "create"),
                                                ("## hoodie.properties keys", "properties")])
def test_docs_list_exactly_the_declared_table_options(heading: str, group: str) -> None:
    keys = (*WRITE_KEYS, *CREATE_KEYS, *PROPERTY_KEYS)
    assert describe_options(keys, group) in DOC.read_text()
    assert _doc_table_keys(heading) == [s.key for s in keys if s.group == group]


def test_creation_options_are_declared_read_and_accepted_only_at_creation(
        tmp_path: Path) -> None:
    from engine import Table

    source = _source(skip=("engine/config.py",))
    for spec in CREATE_KEYS:
        assert re.search(rf"created\[\"{spec.attr}\"\]", source), spec.attr
        if spec.key == "hoodie.database.name":  # any text: it only enters the checksum
            continue
        with pytest.raises(InvalidOptionError) as caught:
            Table.create(str(tmp_path / "t"), name="t", record_key="id",
                         options={spec.key: "\x00 not a value"})
        assert caught.value.key == spec.key
        with pytest.raises(InvalidOptionError, match="unknown option"):
            WriteConfig.from_options({spec.key: "true"})  # Table.open refuses it
    assert not {s.key for s in CREATE_KEYS} & {s.key for s in WRITE_KEYS}


def test_bad_write_option_error_names_the_option() -> None:
    for spec in WRITE_KEYS:
        for key in (spec.key, *spec.aliases):
            try:
                WriteConfig.from_options({key: "\x00 not a value"})
            except InvalidOptionError as exc:
                assert exc.key == key and f"'{key}'" in str(exc)


# -- job settings and the sink --------------------------------------------------------------

_JOB_DEFAULTS_OF_THEIR_OWN = {"table.path": None, "table.partition_by": (),
                              "errors.table_path": None}
"""Sink-filling settings whose default is not the sink's: the path is required (the sink has
no default), no partition fields, and the job derives the error table's path."""


def test_sink_settings_take_the_sinks_defaults() -> None:
    from ingest.sink_config import SinkConfig, sink_default
    from jobs.job_config import SETTINGS, SINK_FIELDS

    fields_of_sink = {f.name for f in fields(SinkConfig)}
    by_name = {s.name: s for s in SETTINGS}
    for name, field_name in SINK_FIELDS.items():
        assert field_name in fields_of_sink, name
        expected = (_JOB_DEFAULTS_OF_THEIR_OWN[name] if name in _JOB_DEFAULTS_OF_THEIR_OWN
                    else sink_default(field_name))
        assert by_name[name].default == expected, name
    assert len(set(SINK_FIELDS.values())) == len(SINK_FIELDS)


def test_service_settings_stand_for_declared_options_and_show_their_defaults() -> None:
    from jobs.job_config import SERVICE_OPTIONS, SETTINGS

    declared = {spec.key: spec for spec in WRITE_KEYS}
    by_name = {s.name: s for s in SETTINGS}
    for name, key in SERVICE_OPTIONS.items():
        spec = declared[key]
        setting = by_name[name]
        assert setting.default is None  # unset: the table option decides
        value = spec.default
        shown = str(value).lower() if isinstance(value, bool) else getattr(value, "value", value)
        assert setting.doc.endswith(f"(default {shown}; {key}).")


def test_job_builds_the_sink_config_from_its_settings(tmp_path: Path) -> None:
    from ingest.sink_config import SinkConfig
    from jobs.ingest_job import sink_config
    from jobs.job_config import load

    config = load(None, {"source.bootstrap_servers": "127.0.0.1:9", "source.topics": "t",
                         "table.path": str(tmp_path / "t"), "table.record_key": "id",
                         "checkpoint.location": str(tmp_path / "cp"),
                         "decode.schema": "id STRING", "index.state_shards": "7",
                         "source.use_builtin_kafka": "true"})
    decoder = object()
    built = sink_config(config, decoder)  # type: ignore[arg-type]
    assert built == SinkConfig(
        str(tmp_path / "t"), decoder=decoder, record_key=("id",),  # type: ignore[arg-type]
        partition_by=(), state_shards=7, options={},
        error_table_path=f"{tmp_path / 't'}_errors")


def test_every_job_setting_is_read() -> None:
    from jobs.job_config import PASS_THROUGH, SERVICE_OPTIONS, SETTINGS, SINK_FIELDS

    source = _source()
    unread = [s.name for s in SETTINGS  # read by name, or through one of the three mappings
              if s.name not in SINK_FIELDS and s.name not in SERVICE_OPTIONS and not s.kafka
              and f'"{s.name}"' not in source and f"'{s.name}'" not in source]
    assert unread == []
    assert set(PASS_THROUGH) == {"source.kafka", "table.options", "spark.conf", "table.storage"}


def test_docs_list_every_sink_argument_and_job_setting() -> None:
    from jobs.job_config import describe, describe_sink_arguments

    assert describe_sink_arguments() in DOC.read_text()
    assert describe() in (ROOT / "docs" / "ingest.md").read_text()


def test_sink_takes_a_config_object() -> None:
    from ingest.sink import HudiStreamingSink
    from ingest.sink_config import SinkConfig

    with pytest.raises(TypeError, match="SinkConfig"):
        HudiStreamingSink("/tmp/t")  # type: ignore[arg-type]
    for bad, field_name in (({"index": "BLOOM"}, "index"), ({"state_shards": 0}, "state_shards"),
                            ({"max_error_fraction": 2}, "max_error_fraction"),
                            ({"conflict_retries": -1}, "conflict_retries")):
        with pytest.raises(ValueError, match=f"^{field_name}: "):
            SinkConfig("/tmp/t", decoder=None, **bad)  # type: ignore[arg-type]


# -- the Kafka source -------------------------------------------------------------------------


def test_kafka_source_fields_are_its_declared_options() -> None:
    from ingest.kafka_options import CLIENT_KEYS, SOURCE_KEYS, KafkaSourceOptions

    declared = {spec.attr: spec for spec in SOURCE_KEYS}
    for f in fields(KafkaSourceOptions):
        if f.name == "client_config":
            continue
        assert f.name in declared, f"KafkaSourceOptions.{f.name} has no option declaration"
        assert f.default == declared[f.name].default, f.name
    parsed = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1",
                                              "subscribe": "t"})
    for spec in SOURCE_KEYS[1:]:
        assert getattr(parsed, spec.attr) == spec.default, spec.key
    names = [k.lower() for spec in (*SOURCE_KEYS, *CLIENT_KEYS)
             for k in (spec.key, *spec.aliases)]
    assert len(names) == len(set(names))


def test_kafka_client_settings_are_kafka_python_consumer_arguments() -> None:
    import kafka

    from ingest.kafka_options import CLIENT_KEYS

    accepted = set(kafka.KafkaConsumer.DEFAULT_CONFIG)
    assert [spec.attr for spec in CLIENT_KEYS if spec.attr not in accepted] == []


def test_job_source_settings_set_declared_source_options() -> None:
    from ingest.kafka_options import CLIENT_KEYS, SOURCE_KEYS
    from jobs.job_config import SETTINGS

    declared = {spec.key: spec for spec in (*SOURCE_KEYS, *CLIENT_KEYS)}
    own_defaults = {"source.topics": None, "source.starting_offsets": "earliest",
                    "source.max_offsets_per_trigger": 200000}
    """The job reads from the earliest offset and bounds its batches; the source does not."""
    for setting in SETTINGS:
        if setting.kafka:
            expected = own_defaults.get(setting.name, declared[setting.kafka].default)
            assert setting.default == expected, setting.name


def test_docs_list_exactly_the_declared_kafka_options() -> None:
    from ingest.kafka_options import CLIENT_GROUP, CLIENT_KEYS, SOURCE_GROUP, SOURCE_KEYS

    text = DOC.read_text()
    assert describe_options(SOURCE_KEYS, SOURCE_GROUP) in text
    assert describe_options(CLIENT_KEYS, CLIENT_GROUP) in text


def test_stored_properties_fill_table_config_fields_with_their_defaults() -> None:
    fields_of_table = {f.name: f for f in fields(TableConfig)}
    minimal = TableConfig.from_properties({"hoodie.table.name": "t",
                                           "hoodie.table.type": "COPY_ON_WRITE"})
    for spec in PROPERTY_KEYS:
        assert spec.attr in fields_of_table, spec.attr
        assert getattr(minimal, spec.attr) == spec.default, spec.key
    written = TableConfig.from_properties(minimal.to_properties())
    assert written.to_properties() == minimal.to_properties()


def test_every_kafka_source_option_and_sink_argument_is_read() -> None:
    from ingest.kafka_options import SOURCE_KEYS
    from ingest.sink_config import SinkConfig

    source = _source(skip=("ingest/kafka_options.py", "ingest/sink_config.py"))
    assert [s.attr for s in SOURCE_KEYS if not re.search(rf"\.{s.attr}\b", source)] == []
    assert [f.name for f in fields(SinkConfig)
            if not re.search(rf"config\.{f.name}\b", source)] == []


@pytest.mark.parametrize("clean_async", ["true", "false"])
def test_clean_async_has_no_effect_on_where_cleaning_runs(tmp_path: Path,
                                                          clean_async: str) -> None:
    import pyarrow as pa

    from engine import Table
    from ingest.services import StreamingServices

    table = Table.create(str(tmp_path), name="t", record_key="k", precombine="ts",
                         table_type="COPY_ON_WRITE",
                         options={"hoodie.clean.async": clean_async,
                                  "hoodie.cleaner.commits.retained": "1",
                                  "hoodie.archive.automatic": "false"})
    for ts in range(3):
        table.upsert(pa.table({"k": ["a"], "ts": [ts], "v": [ts]}))
    # A Table write cleans inline, right after its commit...
    assert [e.action for e in table.timeline()].count("clean") >= 1
    # ...and the streaming job in its service thread.
    assert StreamingServices(table).clean is True


def test_docs_list_exactly_the_declared_read_options() -> None:
    from engine.read.options import READ_GROUP, READ_KEYS, ReadOptions

    assert describe_options(READ_KEYS, READ_GROUP) in DOC.read_text()
    assert _doc_table_keys("## Read options") == [s.key for s in READ_KEYS]
    defaults = ReadOptions()
    assert all(getattr(defaults, s.attr) == s.default for s in READ_KEYS)
