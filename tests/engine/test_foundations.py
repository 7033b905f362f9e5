"""Unit tests of the engine's foundations: properties, config, instants, names, paths."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

import pytest

from engine.config import (
    IndexType,
    LogBlockFormat,
    MergeMode,
    TableConfig,
    WriteConfig,
    table_checksum,
)
from engine.errors import ClockSkewError, InvalidOptionError, InvalidRecordError
from engine.format.naming import parse_base_file, parse_log_file
from engine.layout.partition import (
    DEFAULT_PARTITION,
    decode_partition_value,
    encode_partition_value,
    partition_path,
)
from engine.layout.properties import dumps, loads
from engine.storage import Storage
from engine.timeline.instant import (
    Action,
    Instant,
    State,
    format_instant_time,
    new_instant_time,
    parse_instant_time,
)


def test_checksum_known_sample_values_match() -> None:
    assert table_checksum("default", "v6_simplekeygen_nonhivestyle") == 616688896
    assert table_checksum("", "v8_trips_8i3u1d_metadata") == 380169000


def test_properties_round_trip_escapes_like_java() -> None:
    props = {"hoodie.table.create.schema": '{"type":"record","name":"x#y=z!"}',
             "unicode": "naïve ☃ 😀", "spaces": " lead and trail "}
    text = dumps(props, last_key="spaces")
    assert '{"type"\\:"record"' in text
    assert "\\u00EF" in text and "\\uD83D\\uDE00" in text
    assert text.strip().splitlines()[-1].startswith("spaces=")
    assert loads(text) == props


def test_properties_sample_file_parses() -> None:
    text = "#c\nhoodie.table.name=trips\nhoodie.table.create.schema={\"a\"\\:1}\n"
    assert loads(text) == {"hoodie.table.name": "trips", "hoodie.table.create.schema": '{"a":1}'}


def test_write_config_unknown_key_is_named() -> None:
    with pytest.raises(InvalidOptionError, match=r"hoodie\.index\.typo"):
        WriteConfig.from_options({"hoodie.index.typo": "BUCKET"})


def test_write_config_bad_value_names_key_and_choices() -> None:
    with pytest.raises(InvalidOptionError, match=r"hoodie.index.type.*BUCKET, SIMPLE"):
        WriteConfig.from_options({"hoodie.index.type": "HASH"})
    with pytest.raises(InvalidOptionError, match=r"hoodie\.parquet\.max\.file\.size"):
        WriteConfig.from_options({"hoodie.parquet.max.file.size": "-3"})


def test_write_config_parses_typed_values() -> None:
    cfg = WriteConfig.from_options({"hoodie.index.type": "bucket",
                                    "hoodie.bucket.index.num.buckets": 8,
                                    "hoodie.logfile.data.block.format": "PARQUET"})
    assert cfg.index_type is IndexType.BUCKET
    assert cfg.num_buckets == 8
    assert cfg.log_block_format is LogBlockFormat.PARQUET


def test_table_config_round_trips_through_properties() -> None:
    cfg = TableConfig.from_properties({
        "hoodie.table.name": "t", "hoodie.table.type": "MERGE_ON_READ",
        "hoodie.table.version": "8", "hoodie.table.recordkey.fields": "id",
        "hoodie.table.partition.fields": "city", "hoodie.table.precombine.field": "ts"})
    assert cfg.merge_mode is MergeMode.EVENT_TIME_ORDERING
    props = cfg.to_properties()
    assert props["hoodie.timeline.layout.version"] == "2"
    assert props["hoodie.record.merge.strategy.id"] == "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5"
    assert TableConfig.from_properties(props).partition_fields == ("city",)


@pytest.mark.parametrize(("props", "expected"), [
    ({"hoodie.table.precombine.field": "ts"}, True),
    ({"hoodie.table.precombine.field": "ts", "hoodie.record.merge.mode": "COMMIT_TIME_ORDERING"},
     False),
    ({"hoodie.record.merge.mode": "EVENT_TIME_ORDERING"}, False),  # no field to order by
    ({}, False),
])
def test_table_config_orders_by_event_time_needs_mode_and_field(
        props: dict[str, str], expected: bool) -> None:
    cfg = TableConfig.from_properties({
        "hoodie.table.name": "t", "hoodie.table.type": "MERGE_ON_READ",
        "hoodie.table.version": "8", "hoodie.table.recordkey.fields": "id", **props})
    assert cfg.orders_by_event_time is expected


def test_instant_file_names_parse_both_layouts() -> None:
    done = Instant("20250101000000000", Action.DELTA_COMMIT, State.COMPLETED,
                   "20250101000000123")
    assert done.file_name() == "20250101000000000_20250101000000123.deltacommit"
    assert Instant.parse(done.file_name()) == done
    assert Instant.parse("20250101000000000.inflight") == Instant(
        "20250101000000000", Action.COMMIT, State.INFLIGHT)
    assert Instant.parse("20250101000000000.commit").completion_time is None
    assert Instant.parse("hoodie.properties") is None


def test_new_instant_times_strictly_increase() -> None:
    times = [new_instant_time() for _ in range(20)]
    assert times == sorted(set(times))
    parse_instant_time(times[0])


def test_new_instant_time_far_future_timeline_refused_and_not_pinned() -> None:
    with pytest.raises(ClockSkewError, match="29990101000000000"):
        new_instant_time("29990101000000000")
    # The refused floor is not remembered: later instants are wall-clock times again.
    later = new_instant_time()
    assert later < "29990101000000000"
    assert abs((parse_instant_time(later) - _dt.datetime.now(_dt.timezone.utc))
               .total_seconds()) < 60


def test_new_instant_time_small_skew_waited_out() -> None:
    ahead = format_instant_time(_dt.datetime.now(_dt.timezone.utc)
                                + _dt.timedelta(milliseconds=300))
    assert new_instant_time(ahead) > ahead


def test_file_names_parse_and_reject() -> None:
    base = parse_base_file("abc-0_0-1-2_20250101000000000.parquet")
    assert base is not None and base.file_id == "abc-0"
    log = parse_log_file(".abc-0_20250101000000000.log.1_0-1-2")
    assert log is not None and log.version == 1 and log.write_token == "0-1-2"
    assert parse_log_file(".abc-0_20250101000000000.log.1") is None
    assert parse_base_file(".tmp.abc-0_0-1-2_20250101000000000.parquet") is None


@pytest.mark.parametrize("value", ["..", ".", "../../etc", "/abs", "a/b", "%2F", "\x00x",
                                   "C:\\win", "ünï😀", "", None, "=", "a\nb", " "])
def test_hostile_partition_values_stay_inside_table(tmp_path: Path, value: str | None) -> None:
    seg = encode_partition_value(value)
    assert "/" not in seg and "\\" not in seg and seg not in ("", ".", "..")
    assert "\x00" not in seg
    if value:
        assert decode_partition_value(seg) == value
    else:
        assert seg == DEFAULT_PARTITION
    path = partition_path(["p"], [value], hive_style=True)
    storage = Storage(str(tmp_path / "table"))
    storage.makedirs("")
    full = storage.full(path)
    assert os.path.commonpath([full, storage.base_path]) == storage.base_path
    assert full != storage.base_path


def test_partition_value_too_long_is_rejected() -> None:
    with pytest.raises(InvalidRecordError, match="too long"):
        partition_path(["p"], ["x" * 300], hive_style=False)


def test_storage_refuses_escaping_paths(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    with pytest.raises(ValueError, match="escapes"):
        storage.full("../outside")


def test_storage_write_new_is_exclusive(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    storage.write_new("f", b"one")
    with pytest.raises(FileExistsError):
        storage.write_new("f", b"two")
    assert storage.read("f") == b"one"
    assert [s.name for s in storage.list_dir("")] == ["f"]


def test_storage_walk_files_skips_the_named_folders_and_below(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    for rel in ("a/f", ".hoodie/timeline/t", ".hoodie/g", "b/.hoodie/h", "b/c/i"):
        storage.write_new(rel, b"x")
    walked = {folder: sorted(s.name for s in stats)
              for folder, stats in storage.walk_files("", skip=(".hoodie",))}
    assert walked == {"": [], "a": ["f"], "b": [], "b/.hoodie": ["h"], "b/c": ["i"]}
    everything = {folder for folder, _ in storage.walk_files("")}
    assert {".hoodie", ".hoodie/timeline"} <= everything
