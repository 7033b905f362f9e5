"""The tidelake-kafka streaming source: options, offset planning, reading, Spark end to end."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from engine.errors import InvalidOptionError
from ingest import kafka_offsets, kafka_options, kafka_source
from ingest.kafka_offsets import (
    KafkaDataLossError,
    check_offset_range,
    format_hudi_checkpoint,
    parse_hudi_checkpoint,
    plan_end_offsets,
    split_limit,
    starting_offsets_json,
)
from ingest.kafka_options import KafkaSourceOptions, redact_options
from ingest.kafka_produce import create_topic, produce
from ingest.kafka_read import BATCH_ROWS, KafkaReadTimeoutError
from ingest.kafka_read import TASK_CONSUMERS as _TASK_CONSUMERS
from ingest.kafka_schema import ARROW_SCHEMA
from ingest.kafka_source import (
    KafkaDataSource,
    KafkaInputPartition,
    KafkaStreamReader,
    MissingTopicsError,
    read_kafka_stream,
)
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.spark_session import spark  # noqa: F401

# kafka (imported by tests.kafka_broker) may import more of its protocol modules lazily.
pytestmark = pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")

SECRET = "hunter2-s3cr3t"


def _options(**extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "events", **extra}


# --- module layout ----------------------------------------------------------------------------


def test_planning_processes_do_not_import_the_read_path() -> None:
    """Spark's planning processes and the source's driver process unpickle the data source,
    its stream reader and its partitions: importing them loads no pyarrow, numpy, decoder or
    engine write code (each such process held ~30 MiB more with them, until Spark reaps it)."""
    probe = ("import pickle, sys; import ingest.kafka_source as k; "
             "pickle.loads(pickle.dumps(k.KafkaInputPartition('t', 0, 1, 2))); "
             "print(sorted(m for m in ('pyarrow', 'numpy', 'pandas', 'ingest.prepare', "
             "'ingest.kafka_read', 'engine.write') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_kafka_source_reexports_moved_names_unchanged() -> None:
    """``from ingest.kafka_source import parse_hudi_checkpoint`` etc. keep working."""
    moved = {
        kafka_offsets: ["KafkaDataLossError", "Offsets", "TopicPart", "check_offset_range",
                        "format_hudi_checkpoint", "offsets_from_json_dict", "offsets_to_json_dict",
                        "parse_hudi_checkpoint", "plan_end_offsets", "split_limit",
                        "starting_offsets_json"],
        kafka_options: ["CLIENT_OPTIONS", "SOURCE_NAME", "KafkaSourceOptions", "is_secret_key",
                        "redact_options"],
    }
    for module, names in moved.items():
        for name in names:
            assert getattr(kafka_source, name) is getattr(module, name), name
    assert all(hasattr(kafka_source, name) for name in kafka_source.__all__)


# --- options ----------------------------------------------------------------------------------


def test_source_options_defaults_parse_like_spark() -> None:
    parsed = KafkaSourceOptions.from_options(_options(subscribe="a, b,a"))
    assert parsed.topics == ("a", "b")
    assert parsed.starting_offsets == "latest"
    assert parsed.max_offsets_per_trigger is None
    assert parsed.fail_on_data_loss is True
    assert parsed.client_config == {"bootstrap_servers": ["127.0.0.1:1"]}


def test_source_options_client_keys_map_to_kafka_python_args() -> None:
    parsed = KafkaSourceOptions.from_options(_options(**{
        "kafka.security.protocol": "sasl_ssl", "kafka.sasl.mechanism": "plain",
        "kafka.sasl.plain.username": "u", "kafka.sasl.plain.password": SECRET,
        "kafka.ssl.cafile": "/ca.pem", "kafka.ssl.check.hostname": "false",
        "STARTINGOFFSETS": "earliest", "maxOffsetsPerTrigger": "10",
        "failOnDataLoss": "FALSE",
    }))
    assert parsed.client_config == {
        "bootstrap_servers": ["127.0.0.1:1"], "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN", "sasl_plain_username": "u", "sasl_plain_password": SECRET,
        "ssl_cafile": "/ca.pem", "ssl_check_hostname": False}
    assert (parsed.starting_offsets, parsed.max_offsets_per_trigger) == ("earliest", 10)
    assert parsed.fail_on_data_loss is False


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"kafka.ssl.truststore.location": "/x.jks"}, "kafka.ssl.truststore.location"),
        ({"kafka.sasl.jaas.config": f"password='{SECRET}'"}, "kafka.sasl.jaas.config"),
        ({"assign": '{"events": [0]}'}, "assign"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"startingOffsets": "{bad json"}, "startingOffsets"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets"),
        ({"startingOffsets": '{"events": {"0": -3}}'}, "startingOffsets"),
        ({"subscribe": "bad topic!"}, "subscribe"),
        ({"kafka.security.protocol": "SASL_PLAINTXT"}, "kafka.security.protocol"),
        ({"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAN",
          "kafka.sasl.plain.username": "u", "kafka.sasl.plain.password": SECRET},
         "kafka.sasl.mechanism"),
        ({"kafka.security.protocol": "SASL_SSL", "kafka.sasl.plain.username": "u",
          "kafka.sasl.plain.password": SECRET}, "kafka.sasl.mechanism"),
        ({"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
          "kafka.sasl.plain.username": "u"}, "kafka.sasl.plain.password"),
        ({"kafka.sasl.mechanism": "PLAIN"}, "kafka.sasl.mechanism"),
        ({"kafka.isolation.level": "read_commited"}, "kafka.isolation.level"),
        ({"kafka.ssl.endpoint.identification.algorithm": "htps"},
         "kafka.ssl.endpoint.identification.algorithm"),
        ({"kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset"),
        ({"kafka.group.id": "g"}, "kafka.group.id"),
    ],
)
def test_source_options_bad_key_raises_naming_key(extra: dict[str, str], key: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        KafkaSourceOptions.from_options(_options(**extra))
    assert caught.value.key == key
    assert key in str(caught.value)
    assert SECRET not in str(caught.value)


def test_source_options_isolation_level_defaults_to_read_committed() -> None:
    parsed = KafkaSourceOptions.from_options(_options())
    assert parsed.consumer_config()["isolation_level"] == "read_committed"
    relaxed = KafkaSourceOptions.from_options(_options(**{
        "kafka.isolation.level": "READ_UNCOMMITTED"}))
    assert relaxed.consumer_config()["isolation_level"] == "read_uncommitted"


def test_source_options_required_keys_raise_when_missing() -> None:
    with pytest.raises(InvalidOptionError, match=r"kafka\.bootstrap\.servers"):
        KafkaSourceOptions.from_options({"subscribe": "t"})
    with pytest.raises(InvalidOptionError, match="subscribe"):
        KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1"})


def test_source_options_repr_and_data_source_repr_hide_secrets() -> None:
    raw = _options(**{"kafka.sasl.plain.password": SECRET, "kafka.ssl.password": SECRET})
    parsed = KafkaSourceOptions.from_options(raw)
    shown = [repr(parsed), str(parsed), repr(KafkaStreamReader(parsed)),
             repr(KafkaDataSource(raw)), repr(redact_options(raw))]
    for text in shown:
        assert SECRET not in text
        assert "redacted" in text


@pytest.mark.parametrize("key", ["x.password", "my.SECRET.key", "auth.token",
                                 "kafka.sasl.jaas.config"])
def test_redact_options_hides_every_secret_marker(key: str) -> None:
    assert redact_options({key: SECRET, "plain": "v"}) == {
        key: "*********(redacted)", "plain": "v"}


def test_arrow_schema_matches_what_spark_expects_from_read() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(kafka_source.kafka_spark_schema(), timezone="UTC") == ARROW_SCHEMA


# --- offsets and checkpoints --------------------------------------------------------------------


def test_hudi_checkpoint_round_trips_one_and_several_topics() -> None:
    assert parse_hudi_checkpoint("events,0:12,1:34,2:0") == {"events": {0: 12, 1: 34, 2: 0}}
    offsets = {"b.t": {1: 5, 0: 3}, "a-t": {0: 9}}
    text = format_hudi_checkpoint(offsets)
    assert text == "a-t,0:9;b.t,0:3,1:5"
    assert parse_hudi_checkpoint(text) == offsets


@pytest.mark.parametrize("text", ["", "events", "events,0", "events,x:1", "a,0:1;a,1:2",
                                  "bad topic,0:1"])
def test_parse_hudi_checkpoint_malformed_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not a Hudi Kafka checkpoint"):
        parse_hudi_checkpoint(text)


def test_starting_offsets_json_is_sorted_and_parsed_back() -> None:
    text = starting_offsets_json({"b": {10: 1, 2: 7}, "a": {0: 3}})
    assert text == '{"a": {"0": 3}, "b": {"2": 7, "10": 1}}'
    parsed = KafkaSourceOptions.from_options(_options(subscribe="a,b", startingOffsets=text))
    assert parsed.starting_offsets == {"a": {0: 3}, "b": {2: 7, 10: 1}}


def test_split_limit_is_proportional_and_exact() -> None:
    backlog = {("t", 0): 600, ("t", 1): 300, ("t", 2): 100}
    assert split_limit(backlog, 100) == {("t", 0): 60, ("t", 1): 30, ("t", 2): 10}
    assert split_limit(backlog, 10_000) == backlog
    shares = split_limit({("t", 0): 5, ("t", 1): 5, ("t", 2): 5}, 2)
    assert sum(shares.values()) == 2


def test_split_limit_small_limit_rotates_over_partitions() -> None:
    offsets = {"t": {0: 0, 1: 0, 2: 0}}
    latest = {"t": {0: 10, 1: 10, 2: 10}}
    for _ in range(3):
        offsets = plan_end_offsets(offsets, latest, 1, True)
    assert offsets == {"t": {0: 1, 1: 1, 2: 1}}


def test_plan_end_offsets_new_partition_starts_at_zero() -> None:
    end = plan_end_offsets({"t": {0: 5}}, {"t": {0: 8, 1: 4}, "u": {0: 2}}, None, True)
    assert end == {"t": {0: 8, 1: 4}, "u": {0: 2}}


def test_plan_end_offsets_gone_partition_fails_or_is_dropped(
        caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(KafkaDataLossError, match="topic 't' partition 1 no longer exists"):
        plan_end_offsets({"t": {0: 1, 1: 1}}, {"t": {0: 1}}, None, True)
    with caplog.at_level(logging.WARNING, logger="ingest.kafka_source"):
        assert plan_end_offsets({"t": {0: 1, 1: 1}}, {"t": {0: 1}}, None, False) == {"t": {0: 1}}
    assert "partition 1 no longer exists" in caplog.text


def test_plan_end_offsets_offsets_going_back_fail_or_restart_there() -> None:
    with pytest.raises(KafkaDataLossError, match="went back from 50 to 10"):
        plan_end_offsets({"t": {0: 50}}, {"t": {0: 10}}, None, True)
    assert plan_end_offsets({"t": {0: 50}}, {"t": {0: 10}}, None, False) == {"t": {0: 10}}


def test_check_offset_range_below_earliest_fails_naming_topic_partition_offsets(
        caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(KafkaDataLossError) as caught:
        check_offset_range("events", 2, 10, 100, 40, True)
    message = str(caught.value)
    assert "offsets 10 to 39 of topic 'events' partition 2" in message
    assert "earliest offset is 40" in message and "failOnDataLoss=false" in message
    with caplog.at_level(logging.WARNING, logger="ingest.kafka_source"):
        assert check_offset_range("events", 2, 10, 100, 40, False) == 40
        assert check_offset_range("events", 2, 10, 30, 40, False) == 30
    assert "topic 'events' partition 2" in caplog.text
    assert check_offset_range("events", 2, 50, 100, 40, True) == 50


def test_reader_partitions_cover_only_nonempty_ranges() -> None:
    reader = KafkaStreamReader(KafkaSourceOptions.from_options(_options()))
    parts = reader.partitions({"t": {"0": 5, "1": 7}}, {"t": {"0": 9, "1": 7, "2": 3}})
    assert [(p.topic, p.partition, p.start, p.end) for p in parts] == [
        ("t", 0, 5, 9), ("t", 2, 0, 3)]
    assert reader.getDefaultReadLimit() == ReadAllAvailable()
    limited = KafkaStreamReader(KafkaSourceOptions.from_options(
        _options(maxOffsetsPerTrigger="7")))
    assert limited.getDefaultReadLimit() == ReadMaxRows(7)


def test_prepare_option_round_trips_and_bad_values_name_the_option(tmp_path: Path) -> None:
    from engine import Table
    from ingest.decode import JsonDecoder
    from ingest.kafka_source import prepare_option, prepare_spec
    from ingest.prepare import PrepareSpec

    table = Table.create(str(tmp_path / "t"), name="t", record_key="id")
    decoder = JsonDecoder("id STRING, v BIGINT")
    spec = PrepareSpec(decoder, table.config, decoder.schema, num_buckets=4, pack=True)
    options = KafkaSourceOptions.from_options(
        _options(**{"tidelake.prepare": prepare_option(spec)}))
    got = prepare_spec(options)
    assert got is not None and got.decoder.schema.equals(decoder.schema)
    assert dataclasses.replace(got, decoder=decoder) == spec
    assert "(a prepare step)" in repr(KafkaDataSource(dict(_options(**{
        "tidelake.prepare": prepare_option(spec)}))))
    assert json.loads(prepare_option(spec))["decoder"]["kind"] == "json", "plain JSON"
    bad = KafkaSourceOptions.from_options(_options(**{"tidelake.prepare": "bm90IGEgc3BlYw=="}))
    with pytest.raises(InvalidOptionError, match=r"tidelake\.prepare.*not JSON"):
        prepare_spec(bad)
    wrong = json.loads(prepare_option(spec))
    wrong["num_buckets"] = "four"
    with pytest.raises(InvalidOptionError, match=r"tidelake\.prepare.*num_buckets: 'four'"):
        prepare_spec(KafkaSourceOptions.from_options(_options(**{
            "tidelake.prepare": json.dumps(wrong)})))
    with pytest.raises(ValueError, match="prepare"):
        read_kafka_stream(None, _options(), use_builtin=True,  # type: ignore[arg-type]
                          prepare=spec)


class _Touch:
    """Unpickling this creates a file: what a pickled option value could make a task do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Path.touch, (self.path,))


def test_prepare_option_is_never_unpickled(tmp_path: Path) -> None:
    from ingest.kafka_source import prepare_spec

    marker = tmp_path / "unpickled"
    payload = base64.b64encode(pickle.dumps(_Touch(marker))).decode("ascii")
    options = KafkaSourceOptions.from_options(_options(**{"tidelake.prepare": payload}))
    with pytest.raises(InvalidOptionError, match=r"tidelake\.prepare"):
        prepare_spec(options)
    assert not marker.exists(), "the option value was unpickled"


def test_prepare_option_round_trips_avro_decoder_with_schema_map(tmp_path: Path) -> None:
    from engine import Table
    from ingest.decode import AvroDecoder
    from ingest.kafka_source import prepare_option, prepare_spec
    from ingest.prepare import PrepareSpec

    reader = {"type": "record", "name": "r", "fields": [
        {"name": "id", "type": "string"}, {"name": "n", "type": ["null", "long"],
                                           "default": None}]}
    writer = {"type": "record", "name": "r", "fields": [{"name": "id", "type": "string"}]}
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", partition_by="id")
    decoder = AvroDecoder(reader, confluent=True, schema_map={7: writer})
    spec = PrepareSpec(decoder, Table.open(table.path).config, decoder.schema,
                       delete_column=None, tombstone_partition="none")
    got = prepare_spec(KafkaSourceOptions.from_options(
        _options(**{"tidelake.prepare": prepare_option(spec)})))
    assert got is not None and isinstance(got.decoder, AvroDecoder)
    assert dataclasses.replace(got, decoder=decoder) == spec
    value = b"\x00\x00\x00\x00\x07" + b"\x02a"  # Confluent framing, schema 7, id "a"
    result = got.decoder.decode(pa.array([value], pa.binary()))
    assert result.table.to_pylist() == [{"id": "a", "n": None}]


# --- reading a range, with a stand-in consumer --------------------------------------------------


class _FakeConsumer:
    """Serves fixed records: gaps in offsets, a position that jumps past control batches.

    A script entry is ``(offsets, position after)``, optionally with the high watermark the
    poll's fetch answer carried as a third item, or ``"out of range"``: the poll raises
    kafka-python's OffsetOutOfRangeError, as it does when the leader answers so.
    """

    script: ClassVar[list[Any]] = []  # per poll
    highwater_value: ClassVar[int | None] = None
    end_value: ClassVar[int | None] = None  # ListOffsets(latest); default: the high watermark
    max_polls: ClassVar[int] = 10_000  # a task still polling after this many is looping

    created: ClassVar[list[_FakeConsumer]] = []

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.polls = list(self.script)
        self._position = 0
        self._highwater = self.highwater_value
        self.poll_count = 0
        self.closed = False
        self.created.append(self)

    def assign(self, tps: list[Any]) -> None:
        self.tp = tps[0]

    def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: 0 for tp in tps}

    def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        end = self.end_value if self.end_value is not None else self.highwater_value
        return {tp: 10**9 if end is None else end for tp in tps}

    def seek(self, tp: Any, offset: int) -> None:
        self._position = offset

    def poll(self, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        from kafka.consumer.fetcher import ConsumerRecord
        from kafka.errors import OffsetOutOfRangeError

        self.poll_count += 1
        if self.poll_count > self.max_polls:
            raise RuntimeError(f"still polling after {self.max_polls} polls")
        if not self.polls:  # an empty fetch answer, with the high watermark
            time.sleep(timeout_ms / 10_000)
            self._highwater = self.highwater_value
            return {}
        entry = self.polls.pop(0)
        if entry == "out of range":
            self.polls.insert(0, entry)  # the leader keeps saying so
            raise OffsetOutOfRangeError({self.tp: self._position})
        offsets, self._position, *highwater = entry
        self._highwater = highwater[0] if highwater else self.highwater_value
        return {self.tp: [ConsumerRecord(self.tp.topic, self.tp.partition, 0, o, 1000 + o, 0,
                                         None, b"v%d" % o, [], None, 0, 2, 0) for o in offsets]}

    def position(self, tp: Any) -> int:
        return self._position

    def highwater(self, tp: Any) -> int | None:
        return self._highwater

    def unsubscribe(self) -> None:
        self.tp = None
        self._highwater = None  # a new assignment starts without a high watermark

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_consumer(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_FakeConsumer]]:
    import kafka

    _TASK_CONSUMERS.clear()
    monkeypatch.setattr(kafka, "KafkaConsumer", _FakeConsumer)
    yield _FakeConsumer
    _TASK_CONSUMERS.clear()
    _FakeConsumer.script, _FakeConsumer.highwater_value = [], None
    _FakeConsumer.end_value, _FakeConsumer.max_polls = None, 10_000
    _FakeConsumer.created = []


def _read(part: KafkaInputPartition, **options: str) -> pa.Table:
    reader = KafkaStreamReader(KafkaSourceOptions.from_options(_options(**options)))
    return pa.Table.from_batches(list(reader.read(part)), schema=ARROW_SCHEMA)


def test_read_range_with_offset_gaps_stops_at_end(fake_consumer: type[_FakeConsumer]) -> None:
    # offsets 2-4 compacted away, 8-9 are transaction markers: position jumps to 10 = end
    fake_consumer.script = [([0, 1], 2), ([5, 6, 7], 10)]
    table = _read(KafkaInputPartition("events", 0, 0, 10))
    assert table.column("offset").to_pylist() == [0, 1, 5, 6, 7]
    assert table.column("value").to_pylist() == [b"v0", b"v1", b"v5", b"v6", b"v7"]


def test_read_tasks_reuse_a_consumer_only_after_a_clean_read(
        fake_consumer: type[_FakeConsumer]) -> None:
    fake_consumer.script = [([0, 1, 2], 3)]
    assert _read(KafkaInputPartition("events", 0, 0, 3)).num_rows == 3
    first = fake_consumer.created[0]
    assert not first.closed and first.tp is None  # back in the pool, unassigned
    first.polls = [([3, 4], 5)]
    assert _read(KafkaInputPartition("events", 0, 3, 5)).num_rows == 2
    assert fake_consumer.created == [first]  # the same consumer served the second task
    first.polls = []
    reader = KafkaStreamReader(KafkaSourceOptions.from_options(
        _options(**{"kafkaConsumer.pollTimeoutMs": "200"})))
    rows = reader.read(KafkaInputPartition("events", 0, 5, 9))
    with pytest.raises(KafkaReadTimeoutError):
        list(rows)  # no records come: the task fails, and its consumer is closed
    assert first.closed
    fake_consumer.script = [([5], 6)]
    assert _read(KafkaInputPartition("events", 0, 5, 6)).num_rows == 1
    assert len(fake_consumer.created) == 2 and not fake_consumer.created[1].closed


def test_read_range_drops_records_past_end(fake_consumer: type[_FakeConsumer]) -> None:
    fake_consumer.script = [([3, 4, 5, 6], 7)]
    assert _read(KafkaInputPartition("events", 0, 3, 5)).column("offset").to_pylist() == [3, 4]


def test_read_range_log_shorter_than_planned_is_data_loss(
        fake_consumer: type[_FakeConsumer]) -> None:
    fake_consumer.script, fake_consumer.highwater_value = [([0, 1], 2)], 2
    with pytest.raises(KafkaDataLossError, match="ends at 2 but offsets up to 5"):
        _read(KafkaInputPartition("events", 0, 0, 5))
    fake_consumer.script = [([0, 1], 2)]
    table = _read(KafkaInputPartition("events", 0, 0, 5), failOnDataLoss="false")
    assert table.num_rows == 2


def test_read_range_without_progress_times_out(fake_consumer: type[_FakeConsumer]) -> None:
    fake_consumer.script, fake_consumer.highwater_value = [([0], 1)], 9
    with pytest.raises(KafkaReadTimeoutError, match="between offsets 1 and 5 within 300 ms"):
        _read(KafkaInputPartition("events", 0, 0, 5), **{"kafkaConsumer.pollTimeoutMs": "300"})


# --- against the broker -------------------------------------------------------------------------


def _reader(bootstrap: str, topic: str, **extra: str) -> KafkaStreamReader:
    return KafkaStreamReader(KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **extra}))


@pytest.mark.kafka
def test_latest_offset_after_multi_record_produce_is_exact(kafka_bootstrap: str) -> None:  # noqa: F811
    topic = unique_topic("quirk")
    create_topic(kafka_bootstrap, topic, 3)
    produce(kafka_bootstrap, topic, [(None, b"single", 0)])  # one-record request first
    produce(kafka_bootstrap, topic, [(b"k%d" % i, b"v%d" % i, i % 3) for i in range(300)])
    reader = _reader(kafka_bootstrap, topic, startingOffsets="earliest")
    try:
        start = reader.initialOffset()
        assert start == {topic: {"0": 0, "1": 0, "2": 0}}
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {topic: {"0": 101, "1": 100, "2": 100}}
        assert reader.latestOffset(start, ReadMaxRows(30)) == {topic: {"0": 10, "1": 10, "2": 10}}
        assert reader.reportLatestOffset() == end
    finally:
        reader.stop()


@pytest.mark.kafka
@pytest.mark.parametrize("fast_decode", ["true", "false"])
def test_read_partition_returns_exact_range_as_arrow(
        kafka_bootstrap: str, fast_decode: str) -> None:  # noqa: F811
    topic = unique_topic("read")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [(None, b"first", 0), (b"k", None, 0)])
    produce(kafka_bootstrap, topic, [(b"k%d" % i, b"v%d" % i, 0) for i in range(25_000)],
            headers=[("trace", b"t1"), ("empty", b"")])
    reader = _reader(kafka_bootstrap, topic, fastDecode=fast_decode)
    batches = list(reader.read(KafkaInputPartition(topic, 0, 1, 20_002)))
    assert max(b.num_rows for b in batches) <= BATCH_ROWS
    table = pa.Table.from_batches(batches)
    assert table.schema == ARROW_SCHEMA
    assert table.column("offset").to_pylist() == list(range(1, 20_002))
    first, second = table.slice(0, 2).to_pylist()
    assert (first["key"], first["value"], first["headers"]) == (b"k", None, None)
    assert second["value"] == b"v0"
    assert second["headers"] == [{"key": "trace", "value": b"t1"}, {"key": "empty", "value": b""}]
    assert second["topic"] == topic and second["partition"] == 0
    assert abs(second["timestamp"].timestamp() - time.time()) < 600


def _broker_reports_aborted_transactions(bootstrap: str, topic: str, aborted: bytes) -> bool:
    """False on brokers whose fetch responses list no aborted transactions (Tansu 0.6): a
    read_committed consumer then cannot tell aborted records from committed ones."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             isolation_level="read_committed")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b"committed-3" not in seen:
            seen += [r.value for r in consumer.poll(200).get(tp, [])]
        return aborted not in seen
    finally:
        consumer.close()


@pytest.mark.kafka
@pytest.mark.parametrize("fast_decode", ["true", "false"])
def test_aborted_transaction_records_are_not_read(
        kafka_bootstrap: str, fast_decode: str) -> None:  # noqa: F811
    from kafka import KafkaProducer

    topic = unique_topic("txn")
    create_topic(kafka_bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap,
                             transactional_id=unique_topic("txn-producer"))
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"committed-1", partition=0)
        producer.send(topic, b"committed-2", partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(topic, b"aborted", partition=0)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"committed-3", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    if not _broker_reports_aborted_transactions(kafka_bootstrap, topic, b"aborted"):
        pytest.skip("this broker lists no aborted transactions in fetch responses (Tansu "
                    "0.6): read_committed cannot skip them there; see docs/ingest.md")
    reader = _reader(kafka_bootstrap, topic, startingOffsets="earliest", fastDecode=fast_decode)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        [part] = reader.partitions(start, end)
        values = [row["value"] for batch in reader.read(part) for row in batch.to_pylist()]
    finally:
        reader.stop()
    assert values == [b"committed-1", b"committed-2", b"committed-3"]


@pytest.mark.kafka
def test_initial_offset_missing_topic_raises_topic_not_found(kafka_bootstrap: str) -> None:  # noqa: F811
    reader = _reader(kafka_bootstrap, "no-such-topic-" + unique_topic("x"))
    try:
        with pytest.raises(MissingTopicsError, match="do not exist"):
            reader.initialOffset()
    finally:
        reader.stop()


@pytest.mark.kafka
def test_starting_offsets_json_resolves_earliest_latest_and_missing(
        kafka_bootstrap: str) -> None:  # noqa: F811
    topic = unique_topic("start")
    create_topic(kafka_bootstrap, topic, 3)
    produce(kafka_bootstrap, topic, [(None, b"x", i % 3) for i in range(30)])
    spec = json.dumps({topic: {"0": 4, "1": -1}})
    reader = _reader(kafka_bootstrap, topic, startingOffsets=spec)
    try:
        assert reader.initialOffset() == {topic: {"0": 4, "1": 10, "2": 0}}
    finally:
        reader.stop()
    past_end = _reader(kafka_bootstrap, topic, startingOffsets=json.dumps({topic: {"0": 99}}))
    try:
        with pytest.raises(KafkaDataLossError, match=r"99 for topic .* is past its end 10"):
            past_end.initialOffset()
    finally:
        past_end.stop()


@pytest.mark.kafka
def test_secrets_never_reach_logs_reprs_or_errors(
        kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    topic = unique_topic("secret")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [(None, b"x", 0)] * 5)
    reader = _reader(kafka_bootstrap, topic, startingOffsets="earliest",
                     **{"kafka.ssl.password": SECRET, "kafka.sasl.plain.password": SECRET})
    with caplog.at_level(logging.DEBUG):
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            rows = sum(b.num_rows for p in reader.partitions(start, end) for b in reader.read(p))
            assert rows == 5
            with pytest.raises(KafkaDataLossError) as caught:
                plan_end_offsets({topic: {0: 9}}, {topic: {0: 5}}, None, True)
        finally:
            reader.stop()
    assert caplog.records  # kafka-python logged at DEBUG: the check below means something
    for text in (caplog.text, repr(reader), str(caught.value), repr(reader.partitions(start, end))):
        assert SECRET not in text


@pytest.mark.kafka
def test_new_partitions_are_read_from_offset_zero(kafka_bootstrap: str) -> None:  # noqa: F811
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions
    from kafka.errors import IncompatibleBrokerVersion

    topic = unique_topic("grow")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [(None, b"a", 0)] * 3)
    reader = _reader(kafka_bootstrap, topic, startingOffsets="latest")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        start = reader.initialOffset()
        try:
            admin.create_partitions({topic: NewPartitions(total_count=2)})
        except IncompatibleBrokerVersion:
            pytest.skip("the broker (Tansu) does not implement CreatePartitions")
        deadline = time.monotonic() + 30
        while True:
            produce(kafka_bootstrap, topic, [(None, b"b", 1)])
            end = reader.latestOffset(start, ReadAllAvailable())
            if "1" in end[topic] or time.monotonic() > deadline:
                break
        assert end[topic]["0"] == 3 and end[topic]["1"] >= 1
        assert [(p.partition, p.start) for p in reader.partitions(start, end)] == [(1, 0)]
    finally:
        admin.close()
        reader.stop()


# --- Spark end to end -----------------------------------------------------------------------------


def _run_available_now(spark: Any, options: dict[str, str], checkpoint: Path  # noqa: F811
                       ) -> list[list[dict[str, Any]]]:
    """Run the source with trigger(availableNow) into foreachBatch; rows per micro-batch."""
    batches: list[list[dict[str, Any]]] = []

    def collect(frame: Any, batch_id: int) -> None:
        rows = frame.select("topic", "partition", "offset", "key", "value").collect()
        batches.append([row.asDict() for row in rows])

    query = (read_kafka_stream(spark, options).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    return [b for b in batches if b]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.kafka
def test_stream_reads_every_record_once_and_resumes_from_checkpoint(
        spark: Any, kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    topic = unique_topic("stream")
    create_topic(kafka_bootstrap, topic, 3)
    produce(kafka_bootstrap, topic, [(b"k%d" % i, b"v%d" % i, i % 3) for i in range(3000)])
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", "kafka.sasl.plain.password": SECRET}
    first = [row for batch in _run_available_now(spark, options, tmp_path / "ck")
             for row in batch]
    assert len(first) == 3000
    for partition in range(3):
        offsets = sorted(r["offset"] for r in first if r["partition"] == partition)
        assert offsets == list(range(1000))
    assert {r["value"] for r in first} == {b"v%d" % i for i in range(3000)}

    produce(kafka_bootstrap, topic, [(None, b"w%d" % i, i % 3) for i in range(30)])
    second = [row for batch in _run_available_now(spark, options, tmp_path / "ck")
              for row in batch]
    assert sorted(r["value"] for r in second) == sorted(b"w%d" % i for i in range(30))
    assert {r["offset"] for r in second} == set(range(1000, 1010))

    plan = read_kafka_stream(spark, options)._jdf.queryExecution().toString()
    assert "redacted" in plan and SECRET not in plan


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.kafka
def test_stream_max_offsets_per_trigger_splits_batches_and_json_start(
        spark: Any, kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    topic = unique_topic("limit")
    create_topic(kafka_bootstrap, topic, 2)
    produce(kafka_bootstrap, topic, [(None, b"%d" % i, i % 2) for i in range(1000)])
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
               "startingOffsets": starting_offsets_json({topic: {0: 100, 1: -2}}),
               "maxOffsetsPerTrigger": "250"}
    batches = _run_available_now(spark, options, tmp_path / "ck")
    assert [len(b) for b in batches] == [250, 250, 250, 150]
    rows = [r for b in batches for r in b]
    assert sorted(r["offset"] for r in rows if r["partition"] == 0) == list(range(100, 500))
    assert sorted(r["offset"] for r in rows if r["partition"] == 1) == list(range(500))


@pytest.mark.slow
@pytest.mark.spark
def test_stream_bad_options_fail_before_the_query_starts(spark: Any) -> None:  # noqa: F811
    with pytest.raises(InvalidOptionError, match=r"kafka\.bogus"):
        read_kafka_stream(spark, {"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                                  "kafka.bogus": "1"})
    kafka_source.register(spark)
    assert "|jaas|key|" in spark.conf.get("spark.sql.redaction.options.regex")
    assert "tidelake\\.prepare" in spark.conf.get("spark.sql.redaction.options.regex")
    with pytest.raises(Exception, match="nosuchoption"):
        (spark.readStream.format("tidelake-kafka").option("kafka.bootstrap.servers", "h:1")
         .option("subscribe", "t").option("noSuchOption", "1").load())
    with pytest.raises(Exception, match="kafka"):  # no spark-sql-kafka jar on this classpath
        read_kafka_stream(spark, {"kafka.bootstrap.servers": "h:1", "subscribe": "t"},
                          use_builtin=True)


def test_prepare_option_round_trips_json_key_decoder(tmp_path: Path) -> None:
    from engine import Table
    from ingest.decode import JsonDecoder
    from ingest.kafka_source import prepare_option, prepare_spec
    from ingest.prepare import PrepareSpec

    table = Table.create(str(tmp_path / "t"), name="t", record_key="id,region")
    decoder = JsonDecoder("id STRING, region STRING, v BIGINT")
    keys = JsonDecoder("id STRING, region STRING")
    spec = PrepareSpec(decoder, table.config, decoder.schema, key_decoder=keys)
    got = prepare_spec(KafkaSourceOptions.from_options(
        _options(**{"tidelake.prepare": prepare_option(spec)})))
    assert got is not None and got.key_decoder is not None
    assert got.key_decoder.schema.equals(keys.schema)


# --- offsets: read what was planned, reach the end, call loss only on evidence ------------------


def test_read_range_past_log_end_out_of_range_reports_loss_instead_of_looping(
        fake_consumer: type[_FakeConsumer], caplog: pytest.LogCaptureFixture) -> None:
    # A replayed range [5, 10) after the topic was recreated with 3 records: the leader answers
    # OFFSET_OUT_OF_RANGE at 5 on every fetch, and its log starts at 0.
    fake_consumer.script, fake_consumer.end_value = ["out of range"], 3
    fake_consumer.max_polls = 50
    with pytest.raises(KafkaDataLossError, match=r"topic 'events' partition 0 ends at 3 but "
                                                 r"offsets up to 10 were planned"):
        _read(KafkaInputPartition("events", 0, 5, 10))
    with caplog.at_level(logging.WARNING, logger="ingest.kafka_source"):
        table = _read(KafkaInputPartition("events", 0, 5, 10), failOnDataLoss="false")
    assert table.num_rows == 0
    assert caplog.text.count("partition 0 ends at 3") == 1  # reported once, then stopped


def test_read_range_carried_over_highwater_is_not_the_log_end(
        fake_consumer: type[_FakeConsumer]) -> None:
    # A pooled consumer's previous task left a fetch at offset 10 in flight; its answer (no
    # records, high watermark 10 of that time) arrives in this task's first poll. The records
    # 10-14 exist (ListOffsets says 15) and come with the task's own fetch.
    # A deterministic stand-in: the real broker answers too fast to lose this race on demand.
    fake_consumer.script = [([], 10, 10), ([10, 11, 12, 13, 14], 15, 15)]
    fake_consumer.end_value = 15
    table = _read(KafkaInputPartition("events", 0, 10, 15))
    assert table.column("offset").to_pylist() == [10, 11, 12, 13, 14]


def _record_batches(*runs: tuple[int, int]) -> bytes:
    """Real message-format-v2 record batches, one per ``(base offset, count)``."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    out = b""
    for base, count in runs:
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                            producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                            batch_size=1 << 20)
        for delta in range(count):
            builder.append(delta, timestamp=1000 + delta, key=None,
                           value=b"v%d" % (base + delta), headers=[])
        batch = bytearray(builder.build())
        batch[0:8] = base.to_bytes(8, "big")
        out += bytes(batch)
    return out


@pytest.mark.kafka
@pytest.mark.parametrize("fast_decode", [True, False])
def test_offset_hole_in_uncompacted_topic_stops_the_position_before_it(
        kafka_bootstrap: str, fast_decode: bool) -> None:  # noqa: F811
    # A fetch answer whose batches skip offsets 3-4 (a later batch visible before an earlier
    # one). The broker cannot be made to answer so on demand; the answer's bytes are real
    # record batches, parsed by a real consumer's fetcher.
    from kafka import KafkaConsumer, TopicPartition
    from kafka.record.memory_records import MemoryRecords

    from ingest.kafka_records import contiguous_length, refuse_offset_holes, use_record_chunks

    data = _record_batches((0, 3), (5, 2))
    first_batch = len(_record_batches((0, 3)))
    assert contiguous_length(data, 0) == (first_batch, (3, 5))
    assert contiguous_length(data, 1) == (first_batch, (3, 5))
    assert contiguous_length(_record_batches((0, 3), (3, 2)), 2)[1] is None

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None)
    try:
        if fast_decode:
            assert use_record_chunks(consumer)
        tp = TopicPartition("events", 0)
        records_class = consumer._fetcher.PartitionRecords
        assert refuse_offset_holes(consumer, {"events"})
        part = consumer._fetcher.PartitionRecords(0, tp, MemoryRecords(data))
        taken = part.take()
        offsets = [o for item in taken for o in getattr(item, "offsets", [item.offset])]
        assert offsets == [0, 1, 2]
        assert part.next_fetch_offset == 3  # the next fetch asks for offset 3 again

        assert refuse_offset_holes(consumer, set())  # a compacted topic: holes are skipped
        part = consumer._fetcher.PartitionRecords(0, tp, MemoryRecords(data))
        offsets = [o for item in part.take() for o in getattr(item, "offsets", [item.offset])]
        assert offsets == [0, 1, 2, 5, 6]
        assert issubclass(consumer._fetcher.PartitionRecords, records_class)
    finally:
        consumer.close()


def test_merge_offsets_after_accepted_regression_resumes_after_what_was_read() -> None:
    from ingest.checkpoint import merge_offsets

    # The table recorded 100 for partition 0; the topic was recreated and, with
    # failOnDataLoss=false, the batch read the new log's offsets 0-4.
    merged = merge_offsets({"ev": {0: 100, 1: 7}}, {("ev", 0): 4})
    assert merged == {"ev": {0: 5, 1: 7}}
    assert merge_offsets(merged, {("ev", 1): 9}) == {"ev": {0: 5, 1: 10}}


def test_merge_offsets_with_planned_ends_records_unread_partitions_at_their_end() -> None:
    from ingest.checkpoint import merge_offsets

    # After an accepted loss both partitions resumed at the new log's 0; this batch planned
    # [0, 5) of partition 0 and [0, 0) of partition 1, and read partition 0's offsets 0-3
    # (offset 4: a transaction marker). Each partition resumes at its planned end.
    planned = {"ev": {0: 5, 1: 0}}
    assert merge_offsets({"ev": {0: 100, 1: 100}, "old": {0: 3}}, {("ev", 0): 3},
                         planned) == {"ev": {0: 5, 1: 0}, "old": {0: 3}}
    with pytest.raises(ValueError, match="partition 0: the batch holds offset 5, past its "
                                         "planned end 5"):
        merge_offsets(None, {("ev", 0): 5}, planned)


def _open_transaction(bootstrap: str, topic: str) -> Any:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap,
                             transactional_id=unique_topic("open-txn"))
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"in an open transaction", partition=0)
    producer.flush()
    return producer


@pytest.mark.kafka
def test_latest_offset_with_open_transaction_never_plans_backwards(
        kafka_bootstrap: str) -> None:  # noqa: F811
    # On Tansu, ListOffsets under read_committed answers 0 while a transaction is open; a
    # single probe fetch from there saw only the first 64 KiB: an estimate far below the
    # offsets already read, which the planner took for data loss and availableNow for its end.
    topic = unique_topic("opentxn")
    create_topic(kafka_bootstrap, topic, 1)
    for _ in range(10):  # 10 batches of 20 KB: more than one 64 KiB fetch
        end = produce(kafka_bootstrap, topic, [(None, b"x" * 200, 0)] * 100)[-1] + 1
    producer = _open_transaction(kafka_bootstrap, topic)
    reader = _reader(kafka_bootstrap, topic)
    try:
        planned = reader.latestOffset({topic: {"0": end}}, ReadAllAvailable())
        assert planned[topic]["0"] >= end
        reader.prepareForTriggerAvailableNow()
        target = reader.latestOffset({topic: {"0": 0}}, ReadAllAvailable())
        assert target[topic]["0"] >= end  # every committed record is in the run
    finally:
        reader.stop()
        producer.abort_transaction()
        producer.close()


@contextlib.contextmanager
def _fetches_sent() -> Iterator[dict[str, int]]:
    """Count the Fetch requests kafka-python sends while the block runs, and the bytes of record
    data their answers carry: ``{"requests": n, "record_bytes": n}``. Instruments the client's
    one send path (``KafkaConnectionManager.send``, which consumer polls and any direct request
    go through); the broker and its answers are real."""
    from kafka.net.manager import KafkaConnectionManager
    from kafka.protocol.consumer import FetchRequest

    counts = {"requests": 0, "record_bytes": 0}
    original = KafkaConnectionManager.send

    def answered(response: Any) -> None:
        counts["record_bytes"] += sum(len(p.records or b"") for t in response.responses
                                      for p in t.partitions)

    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        future = original(self, request, *args, **kwargs)
        if isinstance(request, FetchRequest):
            counts["requests"] += 1
            future.add_callback(answered)
        return future

    KafkaConnectionManager.send = send  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        KafkaConnectionManager.send = original  # type: ignore[method-assign]


@pytest.mark.kafka
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_latest_offset_under_steady_production_fetches_once_and_reaches_the_end(
        kafka_bootstrap: str, isolation: str) -> None:  # noqa: F811
    # A producer keeps sending (~3,000 records/s) while the driver plans. Planning used to
    # fetch from the listed end until a fetch came back empty, which under steady production
    # never happens: it chased the moving end for 5 s, fetching (and decoding) every record
    # on the way. Now it asks once per leader, whatever the rate, and still plans at least up
    # to every record acknowledged before it began; every planned offset is then read.

    topic = unique_topic("steady")
    create_topic(kafka_bootstrap, topic, 2)
    stop = threading.Event()

    def endless() -> Iterator[tuple[bytes | None, bytes, int]]:
        sent = 0
        while not stop.is_set():
            yield None, b"steady-%08d" % sent + b"." * 48, sent % 2
            sent += 1

    steady = {"rate": 3_000.0, "linger_ms": 5, "batch_size": 16 << 10}  # a batch every ~5 ms
    background = threading.Thread(target=produce, args=(kafka_bootstrap, topic, endless()),
                                  kwargs=steady, daemon=True)
    background.start()
    reader = _reader(kafka_bootstrap, topic, startingOffsets="earliest",
                     **{"kafka.isolation.level": isolation})
    try:
        start = reader.initialOffset()
        for _ in range(3):
            # acknowledged before planning begins (multi-record requests: Tansu's ListOffsets
            # lists only the base offset + 1 of such a batch)
            marks = produce(kafka_bootstrap, topic, [(None, b"mark", p) for p in (0, 1)] * 5)
            with _fetches_sent() as fetched:
                end = reader.latestOffset(start, ReadAllAvailable())
            assert fetched["requests"] <= 2, fetched  # one per leader, whatever the rate
            assert fetched["record_bytes"] <= 64 << 10, fetched  # at most one batch (<= 16 KiB)
            for p in (0, 1):
                assert end[topic][str(p)] > max(marks[p::2]), (end, marks)
            for part in reader.partitions(start, end):
                offsets = [o for b in reader.read(part) for o in b.column("offset").to_pylist()]
                assert offsets == list(range(part.start, part.end))  # every planned offset read
            start = end
        assert background.is_alive()  # the producer was sending throughout
    finally:
        stop.set()
        background.join(timeout=60)
        reader.stop()


@pytest.mark.kafka
@pytest.mark.parametrize("fail", [True, False])
def test_recreated_topic_is_loss_once_and_resumes_at_new_log_start(
        kafka_bootstrap: str, fail: bool, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    from kafka import KafkaAdminClient

    topic = unique_topic("recreate")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [(None, b"old", 0)] * 10)
    reader = _reader(kafka_bootstrap, topic, startingOffsets="earliest",
                     failOnDataLoss=str(fail).lower())
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        start = reader.initialOffset()
        start = reader.latestOffset(start, ReadAllAvailable())
        assert start == {topic: {"0": 10}}
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(Exception):  # gone already: an earlier round deleted it
                admin.delete_topics([topic])
            try:
                create_topic(kafka_bootstrap, topic, 1)
                break
            except Exception:  # the deletion is not done yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        produce(kafka_bootstrap, topic, [(None, b"new%d" % i, 0) for i in range(3)])
        if fail:
            with pytest.raises(KafkaDataLossError, match=rf"topic '{topic}' partition 0: the "
                                                         "topic was recreated"):
                reader.latestOffset(start, ReadAllAvailable())
            return
        with caplog.at_level(logging.WARNING, logger="ingest.kafka_source"):
            resumed = reader.latestOffset(start, ReadAllAvailable())
            assert resumed == {topic: {"0": 0}}  # nothing read in this batch
            assert reader.partitions(start, resumed) == []
            end = reader.latestOffset(resumed, ReadAllAvailable())
        ours = [r for r in caplog.records if r.name == "ingest.kafka_source"]
        assert len(ours) == 1 and "recreated" in ours[0].getMessage()
        [part] = reader.partitions(resumed, end)
        values = [r["value"] for b in reader.read(part) for r in b.to_pylist()]
        assert values == [b"new0", b"new1", b"new2"]  # the new topic's records, all of them
    finally:
        admin.close()
        reader.stop()


@pytest.mark.kafka
def test_read_task_past_log_end_reports_loss_naming_partition(kafka_bootstrap: str) -> None:  # noqa: F811
    # Spark replays [5, 10) after the topic was truncated to 3 records (here: a new topic).
    topic = unique_topic("pastend")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [(None, b"x", 0)] * 3)
    reader = _reader(kafka_bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": "20000"})
    with pytest.raises(KafkaDataLossError, match=rf"topic '{topic}' partition 0 ends at 3"):
        list(reader.read(KafkaInputPartition(topic, 0, 5, 10)))
    relaxed = _reader(kafka_bootstrap, topic, failOnDataLoss="false",
                      **{"kafkaConsumer.pollTimeoutMs": "20000"})
    assert list(relaxed.read(KafkaInputPartition(topic, 0, 5, 10))) == []
    # the consumer went back to the pool: the next task on that partition reads its range
    produce(kafka_bootstrap, topic, [(None, b"y", 0)] * 7)
    rows = [r["offset"] for b in relaxed.read(KafkaInputPartition(topic, 0, 3, 10))
            for r in b.to_pylist()]
    assert rows == list(range(3, 10))


def test_importing_the_source_leaves_the_prepare_step_to_read_tasks() -> None:
    """Spark unpickles the source in several Python processes per query (planning, the
    stream reader's driver side); only read tasks and the schema need ingest.prepare, so
    importing the source must not pull it in (a third of the source's import time)."""
    import subprocess
    import sys

    code = ("import sys, ingest.kafka_source; "
            "print(sorted(m for m in sys.modules if m in ('ingest.prepare', 'ingest.decode')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
