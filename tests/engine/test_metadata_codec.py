"""Metadata-table records, keys and routing against the v8 and v9 samples and the docs' test
vectors (``docs/table-version-9.md`` §5 for the v9 column stats)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from decimal import Decimal
from pathlib import Path

import fastavro
import pyarrow as pa
import pytest

from engine.format.bloom import hadoop_murmur2
from engine.format.hfile import HFileReader
from engine.format.log_block import HeaderKey
from engine.format.log_format import BlockType, decode_hfile_data_block, iter_blocks
from engine.format.naming import parse_base_file, parse_log_file
from engine.index.bucket import java_string_hash
from engine.metadata import keys
from engine.metadata.records import (
    ColumnStats,
    FileInfo,
    MetadataRecord,
    RecordIndexInfo,
    SecondaryIndexInfo,
    ValueType,
    ValueTypeInfo,
    all_partitions_record,
    bound_value,
    column_stats_record,
    decode_metadata_value,
    encode_metadata_value,
    instant_to_epoch_ms,
    merge_records,
    partition_files_record,
    partition_stats_record,
    record_index_record,
    secondary_index_record,
    wrap_stat_value,
)
from engine.metadata.schema import metadata_schema_json, metadata_schema_without_meta_fields_json
from tests.conftest import SAMPLES, extract_sample

V8_TRIPS = "quickstart_trips_table__mor__avro__v8_trips_8i3u1d"
SF_FILE = "036ded81-9ed4-479f-bcea-7145dfa0079b-0_0-986-2792_20251220210108078.parquet"


@pytest.fixture(scope="module")
def mdt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The v8 trips sample's ``.hoodie/metadata`` folder."""
    table = extract_sample(SAMPLES / f"{V8_TRIPS}.zip", tmp_path_factory.mktemp("v8"),
                           "v8_trips_8i3u1d")
    return table / ".hoodie" / "metadata"


@pytest.fixture(scope="module")
def sample_cells(mdt: Path) -> list[tuple[str, str, bytes, bytes]]:
    """(MDT partition, file name, row, value) of every cell in base files and log blocks."""
    out = []
    for path in sorted(mdt.glob("*/*.hfile")):
        out += [(path.parent.name, path.name, row, value)
                for row, value in HFileReader(path.read_bytes()).cells()]
    for path in sorted(mdt.glob("*/.*.log.*")):
        for block in iter_blocks(path.read_bytes()):
            if block.block_type is BlockType.HFILE_DATA:
                out += [(path.parent.name, path.name, row, value)
                        for row, value in decode_hfile_data_block(block)]
    return out


def test_decode_sample_values_all_reencode_byte_identical(
    sample_cells: list[tuple[str, str, bytes, bytes]],
) -> None:
    types: Counter[int] = Counter()
    for _, file_name, row, value in sample_cells:
        record = decode_metadata_value(row, value)
        types[record.type] += 1
        assert record.key == row.decode()
        base = file_name.endswith(".hfile")
        assert record.file_name == (file_name if base else None)
        assert encode_metadata_value(record) == value, record.key
    assert sum(types.values()) == 366
    assert types == {3: 189, 6: 126, 2: 14, 5: 14, 7: 14, 1: 9}


def test_decode_sample_fare_stats_double_wrapper_kept(
    sample_cells: list[tuple[str, str, bytes, bytes]],
) -> None:
    fare = keys.b64_xxh64("fare")
    stats = [decode_metadata_value(row, value).payload for _, _, row, value in sample_cells
             if row.decode().startswith(fare)]
    bounds = []
    for payload in stats:
        assert isinstance(payload, ColumnStats) and payload.column_name == "fare"
        bounds += [b for b in (payload.min_value, payload.max_value) if b is not None]
    assert len(bounds) > 20
    assert {wrapper for wrapper, _ in bounds} == {"DoubleWrapper"}


def test_sample_keys_route_to_their_file_group(
    sample_cells: list[tuple[str, str, bytes, bytes]], mdt: Path,
) -> None:
    checked = 0
    for partition, file_name, row, _ in sample_cells:
        groups = sorted({name.file_id for p in (mdt / partition).iterdir()
                         if (name := parse_base_file(p.name) or parse_log_file(p.name))})
        file_id = (parse_base_file(file_name) or parse_log_file(file_name)).file_id  # type: ignore[union-attr]
        assert groups == keys.file_group_ids(partition, len(groups))
        assert groups[keys.file_group_index(row.decode(), len(groups))] == file_id
        checked += 1
    assert checked == 366


def test_schema_verbatim_with_and_without_meta_fields(mdt: Path) -> None:
    assert len(metadata_schema_json()) == 7969
    commit = mdt / ".hoodie" / "timeline" / "00000000000000001_20251220210108534.deltacommit"
    with commit.open("rb") as handle:
        (metadata,) = list(fastavro.reader(handle))
    assert metadata_schema_without_meta_fields_json() == metadata["extraMetadata"]["schema"]


@pytest.mark.parametrize(("text", "hex_digest", "b64"), [
    ("driver", "023a49ecdd600597", "AjpJ7N1gBZc="),
    ("fare", "93a03410821b29b5", "k6A0EIIbKbU="),
    ("city=chennai", "a9622852a7705fbe", "qWIoUqdwX74="),
    ("city=san_francisco", "f0bd9c823e83b553", "8L2cgj6DtVM="),
    (".", "1574e11f07a52133", "FXThHwelITM="),
])
def test_xxh64_sign_extended_seed_doc_vectors(text: str, hex_digest: str, b64: str) -> None:
    assert keys.xxh64(text).hex() == hex_digest
    assert keys.b64_xxh64(text) == b64


def test_index_keys_doc_examples() -> None:
    assert keys.b64_md5(SF_FILE) == "R0v7g76tSFUukD8HWc7Klw=="
    assert keys.column_stats_key("driver", "city=san_francisco", SF_FILE) == (
        "AjpJ7N1gBZc=8L2cgj6DtVM=R0v7g76tSFUukD8HWc7Klw==")
    assert keys.partition_stats_key("driver", "city=chennai") == "AjpJ7N1gBZc=qWIoUqdwX74="
    assert keys.partition_stats_key("driver", "") == "AjpJ7N1gBZc=FXThHwelITM="
    assert keys.bloom_filter_key("", SF_FILE) == "FXThHwelITM=R0v7g76tSFUukD8HWc7Klw=="
    assert keys.secondary_index_key("rider-J", "c8abbe79-8d89-47ea-b4ce-4d224bae5bfa") == (
        "rider-J$c8abbe79-8d89-47ea-b4ce-4d224bae5bfa")
    assert keys.secondary_index_key("a$b\\", "k") == "a\\$b\\\\$k"


@pytest.mark.parametrize(("key", "h", "group"), [
    ("e96c4396-3fad-413a-a942-4cb36106d721", 343329391, 1),
    ("c8abbe79-8d89-47ea-b4ce-4d224bae5bfa", -117635293, 3),
    ("7a84095f-737f-40bc-b62f-6b69664712d2", -2144902229, 9),
    ("rider-J$c8abbe79-8d89-47ea-b4ce-4d224bae5bfa", 852481520, 0),
    ("polygenelubricants", -(2**31), 8),
])
def test_file_group_index_doc_routing_table(key: str, h: int, group: int) -> None:
    assert java_string_hash(key) == h
    assert keys.file_group_index(key, 10) == group


def test_java_string_hash_utf16_surrogates_counted_as_units() -> None:
    # U+1F600 is the surrogate pair D83D DE00 in Java: h = 31 * 0xD83D + 0xDE00.
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00
    assert java_string_hash("") == 0


def test_file_group_ids_prefixes_and_default_counts() -> None:
    assert keys.file_group_ids("files") == ["files-0000-0"]
    assert keys.file_group_ids("column_stats") == ["col-stats-0000-0", "col-stats-0001-0"]
    assert keys.file_group_ids("record_index")[7] == "record-index-0007-0"
    assert len(keys.file_group_ids("bloom_filters")) == 4
    assert keys.file_group_ids("partition_stats") == ["partition-stats-0000-0"]
    assert keys.file_group_id("secondary_index_rider_idx", 3) == (
        "secondary-index-rider-idx-0003-0")
    with pytest.raises(ValueError, match="unknown"):
        keys.file_group_id("nope", 0)
    assert keys.partition_identifier("") == "." and keys.partition_identifier("a/b") == "a/b"


def test_murmur_hash_hudi_tail_order_doc_vectors() -> None:
    assert hadoop_murmur2(b"abc", 0) == 1775488903
    assert hadoop_murmur2(b"city=sao_paulo", 0) == 876977833


def test_record_index_worked_example_matches_sample(
    sample_cells: list[tuple[str, str, bytes, bytes]],
) -> None:
    key = "e96c4396-3fad-413a-a942-4cb36106d721"
    built = record_index_record(key, "city=san_francisco",
                                "036ded81-9ed4-479f-bcea-7145dfa0079b-0", "20251220210108078")
    info = built.payload
    assert isinstance(info, RecordIndexInfo)
    assert (info.file_id_high_bits, info.file_id_low_bits, info.file_index) == (
        247114695546521503, -4833926705110317157, 0)
    assert info.instant_time == 1766264468078 == instant_to_epoch_ms("20251220210108078")
    assert info.location_file_id == "036ded81-9ed4-479f-bcea-7145dfa0079b-0"
    (value,) = [v for _, name, row, v in sample_cells
                if row == key.encode() and not name.endswith(".hfile")]
    assert encode_metadata_value(built) == value
    raw = record_index_record("k", "", "my-file-group", "20251220210108078").payload
    assert isinstance(raw, RecordIndexInfo)
    assert (raw.file_id_encoding, raw.file_id, raw.file_index) == (1, "my-file-group", -1)
    assert raw.location_file_id == "my-file-group"
    bare = record_index_record("k", "", "036ded81-9ed4-479f-bcea-7145dfa0079b", "20251220210108078")
    assert isinstance(bare.payload, RecordIndexInfo) and bare.payload.file_index == -1


def test_files_records_builders_identifier_and_sizes() -> None:
    record = all_partitions_record(["", "city=a"], deleted=["city=b"])
    assert record.key == "__all_partitions__" and record.type == 1
    assert record.payload == {".": FileInfo(0), "city=a": FileInfo(0), "city=b": FileInfo(0, True)}
    files = partition_files_record("", {"f1.parquet": 10}, deleted=["f0.parquet"])
    assert files.key == "." and files.payload == {"f1.parquet": FileInfo(10),
                                                  "f0.parquet": FileInfo(0, True)}
    with pytest.raises(ValueError, match="> 0"):
        partition_files_record("p", {"f.parquet": 0})
    assert decode_metadata_value(files.key, encode_metadata_value(files)) == files


def test_stats_records_wrappers_round_trip() -> None:
    cases = [
        (pa.bool_(), True, "BooleanWrapper"), (pa.int32(), 5, "IntWrapper"),
        (pa.int64(), 5, "LongWrapper"), (pa.float32(), 1.5, "FloatWrapper"),
        (pa.float64(), 1.5, "DoubleWrapper"), (pa.string(), "x", "StringWrapper"),
        (pa.binary(), b"x", "BytesWrapper"), (pa.date32(), dt.date(1970, 1, 3), "DateWrapper"),
        (pa.decimal128(10, 2), Decimal("1.25"), "DecimalWrapper"),
        (pa.timestamp("ms", "UTC"), 1000, "TimestampMicrosWrapper"),
    ]
    for arrow_type, value, wrapper in cases:
        wrapped = wrap_stat_value(value, arrow_type)
        assert wrapped is not None and wrapped[0] == wrapper
        stats = ColumnStats(None, None, wrapped, wrapped, 3, 0, 10, 20)
        record = column_stats_record("p", "f.parquet", "c", stats)
        assert decode_metadata_value(record.key, encode_metadata_value(record)) == record
    assert wrap_stat_value(1000, pa.timestamp("ms", "UTC")) == ("TimestampMicrosWrapper",
                                                                1_000_000)
    assert wrap_stat_value(None, pa.int32()) is None
    part = partition_stats_record("city=x", "c", ColumnStats(None, None, None, None, 1, 1, 0, 0))
    assert isinstance(part.payload, ColumnStats) and part.payload.is_tight_bound
    assert part.payload.file_name == "city=x"


def _files(key: str, **entries: FileInfo) -> MetadataRecord:
    return MetadataRecord(key, 2, dict(entries))


def test_merge_files_tombstones_and_max_size() -> None:
    old = _files("p", a=FileInfo(10), b=FileInfo(5), c=FileInfo(0, True))
    new = _files("p", a=FileInfo(7), b=FileInfo(0, True), c=FileInfo(0, True), d=FileInfo(0, True))
    merged = merge_records(old, new)
    assert merged is not None
    assert merged.payload == {"a": FileInfo(10), "c": FileInfo(0, True), "d": FileInfo(0, True)}
    assert merge_records(old, None) is None
    assert merge_records(None, new) == new


def test_merge_column_stats_range_sums_and_overrides() -> None:
    old = ColumnStats("f", "c", ("IntWrapper", 3), ("IntWrapper", 9), 5, 1, 100, 200)
    new = ColumnStats("f", "c", ("IntWrapper", 1), None, 2, 0, 10, 20)
    merged = merge_records(MetadataRecord("k", 3, old), MetadataRecord("k", 3, new))
    assert merged is not None and merged.payload == ColumnStats(
        "f", "c", ("IntWrapper", 1), ("IntWrapper", 9), 7, 1, 110, 220)
    deleted = ColumnStats("f", "c", None, None, None, None, None, None, is_deleted=True)
    assert merge_records(MetadataRecord("k", 3, old), MetadataRecord("k", 3, deleted)) == (
        MetadataRecord("k", 3, deleted))
    tight = ColumnStats("p", "c", ("IntWrapper", 4), ("IntWrapper", 4), 1, 0, 0, 0,
                        is_tight_bound=True)
    assert merge_records(MetadataRecord("k", 6, old), MetadataRecord("k", 6, tight)) == (
        MetadataRecord("k", 6, tight))


def test_merge_secondary_index_deleted_dropped() -> None:
    live = secondary_index_record("v", "k")
    gone = MetadataRecord(live.key, 7, SecondaryIndexInfo(True))
    assert merge_records(live, gone) is None
    assert merge_records(gone, live) == live


# -- table version 9 (Hudi 1.1.1 samples) --------------------------------------------------------

V9_SAMPLES = ("sample_table__mor__avro__v9_txns_simple_meta",
              "sample_table__cow__v9_txns_simple_meta")
V9_BASE = "3e93c8a9-fda0-4e8a-91dc-b4ade7dab76d-0_1-27-53_20260307162557587.parquet"


@pytest.fixture(scope="module")
def v9_cells(tmp_path_factory: pytest.TempPathFactory
             ) -> list[tuple[str, str, str, bytes, bytes, str]]:
    """(sample, MDT partition, file name, row, value, writer schema) of every cell in the
    base files and log blocks of the two v9 samples' metadata tables."""
    out = []
    for sample in V9_SAMPLES:
        table = extract_sample(SAMPLES / f"{sample}.zip", tmp_path_factory.mktemp("v9"),
                               "v9_txns_simple_meta")
        mdt = table / ".hoodie" / "metadata"
        for path in sorted(mdt.glob("*/*.hfile")):
            reader = HFileReader(path.read_bytes())
            schema = reader.file_info["schema"].decode()
            out += [(sample, path.parent.name, path.name, row, value, schema)
                    for row, value in reader.cells()]
        for path in sorted(mdt.glob("*/.*.log.*")):
            for block in iter_blocks(path.read_bytes()):
                if block.block_type is BlockType.HFILE_DATA:
                    schema = block.header[HeaderKey.SCHEMA]
                    out += [(sample, path.parent.name, path.name, row, value, schema)
                            for row, value in decode_hfile_data_block(block)]
    return out


def test_v9_cells_all_decode_with_file_schema_and_reencode_byte_identical(
    v9_cells: list[tuple[str, str, str, bytes, bytes, str]],
) -> None:
    types: Counter[int] = Counter()
    value_types: Counter[int | None] = Counter()
    for _, _, file_name, row, value, schema in v9_cells:
        assert schema == metadata_schema_json(value_types=True)  # 1.1's, verbatim
        record = decode_metadata_value(row, value, schema)
        types[record.type] += 1
        assert record.key == row.decode()
        # 1.1.1 leaves _hoodie_file_name null in some base files (the secondary indexes',
        # the files partition's bootstrap file); set, it is the file's own name
        assert record.file_name in ((file_name, None) if file_name.endswith(".hfile")
                                    else (None,))
        assert encode_metadata_value(record, value_types=True) == value, record.key
        if isinstance(record.payload, ColumnStats):
            value_types[record.payload.value_type and record.payload.value_type.ordinal] += 1
    assert types[3] > 0 and types[6] > 0 and types[5] > 0 and types[7] > 0
    assert None not in value_types  # Hudi 1.1.1 writes V2 stats only on a fresh v9 table
    assert set(value_types) <= {v.value for v in ValueType} - {0}


def test_v9_stats_cell_misread_under_hudi_10_schema(
    v9_cells: list[tuple[str, str, str, bytes, bytes, str]],
) -> None:
    """Why cells are decoded with their file's schema: 1.0's cannot read a V2 stats value."""
    row, value = next((r, v) for _, part, _, r, v, _ in v9_cells if part == "column_stats")
    with pytest.raises(ValueError, match="malformed Avro value"):
        decode_metadata_value(row, value)


def _v9_stats(cells: list[tuple[str, str, str, bytes, bytes, str]], key: str,
              file_name: str | None = None) -> ColumnStats:
    found = [decode_metadata_value(r, v, s).payload for sample, _, name, r, v, s in cells
             if sample == V9_SAMPLES[0] and r.decode() == key
             and (file_name is None or name == file_name)]
    assert found, key
    stats = found[-1]
    assert isinstance(stats, ColumnStats)
    return stats


@pytest.mark.parametrize(("key", "column", "value_type", "lo", "hi", "domain"), [
    ("kIkwFCiqBoI=431THTTwO5Q=F01d3NbdD9QcFpSCtykrRA==", "amount",
     ValueTypeInfo(10, "15,2"), ("BytesWrapper", bytes.fromhex("2327")),
     ("BytesWrapper", bytes.fromhex("07a120")), (Decimal("89.99"), Decimal("5000.00"))),
    ("5RNSbpYG6oU=431THTTwO5Q=F01d3NbdD9QcFpSCtykrRA==", "fee_amount",
     ValueTypeInfo(10, "10,2"), ("BytesWrapper", b"\x00"),
     ("BytesWrapper", bytes.fromhex("09c4")), (Decimal("0.00"), Decimal("25.00"))),
    ("eMxr4ya/RTg=431THTTwO5Q=F01d3NbdD9QcFpSCtykrRA==", "txn_datetime",
     ValueTypeInfo(16), ("LongWrapper", 1705336200000000), ("LongWrapper", 1705350000000000),
     (1705336200000000000, 1705350000000000000)),
    ("rpc04bPLuAM=431THTTwO5Q=F01d3NbdD9QcFpSCtykrRA==", "txn_date",
     ValueTypeInfo(12), ("IntWrapper", 19737), ("IntWrapper", 19737), (19737, 19737)),
    ("mgnDpF60ARA=431THTTwO5Q=F01d3NbdD9QcFpSCtykrRA==", "txn_ts",
     ValueTypeInfo(4), ("LongWrapper", 1700000000001), ("LongWrapper", 1700000000003),
     (1700000000001, 1700000000003)),
    ("0FD2vn2+Kvk=431THTTwO5Q=F01d3NbdD9QcFpSCtykrRA==", "merchant_name",
     ValueTypeInfo(7), ("StringWrapper", "Amazon"), ("StringWrapper", "Netflix"),
     ("Amazon", "Netflix")),
])
def test_v9_column_stats_doc_vectors(
    v9_cells: list[tuple[str, str, str, bytes, bytes, str]], key: str, column: str,
    value_type: ValueTypeInfo, lo: tuple[str, object], hi: tuple[str, object],
    domain: tuple[object, object],
) -> None:
    """docs/table-version-9.md §5.3: the MOR sample's base file in ``region=us``."""
    stats = _v9_stats(v9_cells, key)
    assert stats.column_name == column and stats.file_name == V9_BASE
    assert stats.value_type == value_type
    assert (stats.min_value, stats.max_value) == (lo, hi)
    assert stats.min_value is not None and stats.max_value is not None
    assert (bound_value(stats.min_value, stats.value_type),
            bound_value(stats.max_value, stats.value_type)) == domain


def test_v9_delete_only_log_stats_null_value_type(
    v9_cells: list[tuple[str, str, str, bytes, bytes, str]],
) -> None:
    logs = [decode_metadata_value(r, v, s).payload for sample, part, _, r, v, s in v9_cells
            if sample == V9_SAMPLES[0] and part == "column_stats"]
    nulls = [p for p in logs if isinstance(p, ColumnStats) and p.value_type is not None
             and p.value_type.ordinal == ValueType.NULL]
    assert nulls and all(p.min_value is None and p.max_value is None for p in nulls)
    assert any(p.value_count == 0 and (p.file_name or "").startswith(".") for p in nulls)


def test_bound_value_v1_and_v2_layouts_share_one_domain() -> None:
    assert bound_value(("TimestampMicrosWrapper", 5), None) == 5_000
    assert bound_value(("LongWrapper", 5), ValueTypeInfo(ValueType.TIMESTAMP_MILLIS)) == 5_000_000
    assert bound_value(("LongWrapper", 5), ValueTypeInfo(ValueType.TIMESTAMP_MICROS)) == 5_000
    assert bound_value(("LongWrapper", 5), ValueTypeInfo(ValueType.LOCAL_TIMESTAMP_NANOS)) == 5
    assert bound_value(("DateWrapper", 19737), None) == bound_value(
        ("IntWrapper", 19737), ValueTypeInfo(ValueType.DATE))
    assert bound_value(("DecimalWrapper", Decimal("-1.50")), None) == bound_value(
        ("BytesWrapper", (-150).to_bytes(2, "big", signed=True)),
        ValueTypeInfo(ValueType.DECIMAL, "10,2"))
    assert bound_value(("IntWrapper", 1500), ValueTypeInfo(ValueType.TIME_MILLIS)) == (
        dt.time(0, 0, 1, 500_000))
    with pytest.raises(ValueError, match="unknown"):
        bound_value(("IntWrapper", 1), ValueTypeInfo(99))


def test_v2_stats_refused_in_hudi_10_schema_round_trip_in_11() -> None:
    stats = ColumnStats(None, None, ("IntWrapper", 19737), ("IntWrapper", 19740), 3, 0, 9, 9,
                        value_type=ValueTypeInfo(ValueType.DATE))
    record = column_stats_record("p", "f.parquet", "d", stats)
    with pytest.raises(ValueError, match="valueType"):
        encode_metadata_value(record)
    encoded = encode_metadata_value(record, value_types=True)
    assert decode_metadata_value(record.key, encoded,
                                 metadata_schema_json(value_types=True)) == record


def test_merge_v2_decimal_stats_compares_values_not_bytes() -> None:
    dec = ValueTypeInfo(ValueType.DECIMAL, "10,2")

    def b(cents: int) -> tuple[str, bytes]:
        return "BytesWrapper", cents.to_bytes(2, "big", signed=True)

    old = ColumnStats("p", "c", b(-5), b(200), 3, 0, 0, 0, value_type=dec)
    new = ColumnStats("p", "c", b(3), b(1000), 2, 0, 0, 0, value_type=dec)
    merged = merge_records(MetadataRecord("k", 6, old), MetadataRecord("k", 6, new))
    assert merged is not None and isinstance(merged.payload, ColumnStats)
    assert (merged.payload.min_value, merged.payload.max_value) == (b(-5), b(1000))
    v1 = ColumnStats("p", "c", ("DecimalWrapper", Decimal(1)), ("DecimalWrapper", Decimal(2)),
                     1, 0, 0, 0)
    mixed = merge_records(MetadataRecord("k", 6, v1), MetadataRecord("k", 6, new))
    assert mixed is not None and isinstance(mixed.payload, ColumnStats)
    assert (mixed.payload.min_value, mixed.payload.max_value, mixed.payload.value_count) == (
        None, None, 3)  # layouts differ: no bound kept, so nothing is pruned by it


def test_v9_commit_schema_without_meta_fields_is_java_11s(tmp_path: Path) -> None:
    """The MDT commits of a v9 table record 1.1's schema without meta fields, as Java."""
    from engine.timeline.commit_metadata import CommitMetadata

    table = extract_sample(SAMPLES / f"{V9_SAMPLES[0]}.zip", tmp_path, "v9_txns_simple_meta")
    timeline = table / ".hoodie" / "metadata" / ".hoodie" / "timeline"
    schemas = {CommitMetadata.from_bytes(p.read_bytes()).schema
               for p in timeline.glob("*_*.deltacommit")}
    assert schemas == {metadata_schema_without_meta_fields_json(value_types=True)}
