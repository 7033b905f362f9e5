"""Hudi log blocks: framing, recovery, and every block type, checked against real log files."""

from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import hudi
import pyarrow as pa
import pytest

from engine.format.avro_codec import arrow_schema_to_avro
from engine.format.log_format import (
    MAGIC,
    BlockType,
    DeleteRecord,
    HeaderKey,
    LogBlock,
    LogFormatError,
    decode_avro_data_block,
    decode_delete_block,
    decode_parquet_data_block,
    delete_record_list_schema,
    encode_avro_data_block,
    encode_delete_block,
    encode_delete_content,
    encode_parquet_data_block,
    encode_rollback_command_block,
    frame_block,
    iter_blocks,
    read_log_file,
)
from tests.conftest import SAMPLES
from tests.engine.helpers import dictionary_encoded

V8_TRIPS = "quickstart_trips_table__mor__avro__v8_trips_8i3u1d"
ROLLBACK = "sample_table__mor__parquet__v6_nonpartitioned_rollback"
SAO_PAULO_DELETE = (
    "city=sao_paulo/.8aa68f7e-afd6-4c94-b86c-8a886552e08d-0_20251220210125441.log.1_0-1047-3000"
)
SAO_PAULO_BASE = (
    "city=sao_paulo/8aa68f7e-afd6-4c94-b86c-8a886552e08d-0_1-986-2793_20251220210108078.parquet"
)

# Appendix A.1: the whole 105-byte rollback log file `.0712b9f9-...log.2_1-0-1` (v6 sample).
ROLLBACK_FILE = bytes.fromhex(
    "234855444923"  # #HUDI#
    "000000000000005b"  # blockLen 91
    "00000001"  # log format version 1
    "00000000"  # COMMAND
    "00000003"  # 3 header entries
    "00000000"
    "00000011"
    + b"20250126040936578".hex()  # INSTANT_TIME
    + "00000003"
    "00000001"
    + b"0".hex()  # COMMAND_BLOCK_TYPE = ROLLBACK
    + "00000001"
    "00000011"
    + b"20250126040826878".hex()  # TARGET_INSTANT_TIME
    + "0000000000000000"  # content length 0
    "00000000"  # empty footer
    "0000000000000061"  # total block length 97
)


def _extract(name: str, dest: Path) -> Path:
    with zipfile.ZipFile(SAMPLES / f"{name}.zip") as zf:
        for member in zf.namelist():
            if not member.startswith("__MACOSX/"):
                zf.extract(member, dest)
    return dest


@pytest.fixture(scope="module")
def sample_logs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Every log file of every sample table (data and metadata tables)."""
    root = tmp_path_factory.mktemp("samples")
    for archive in sorted(SAMPLES.glob("*.zip")):
        _extract(archive.stem, root / archive.stem)
    logs = sorted(p for p in root.rglob("*") if p.is_file() and ".log." in p.name)
    assert logs, "the samples hold log files"
    return logs


def _v8_table(sample_logs: list[Path]) -> Path:
    path = next(p for p in sample_logs if p.name == Path(SAO_PAULO_DELETE).name)
    return path.parent.parent


def _small_blocks() -> list[bytes]:
    schema = arrow_schema_to_avro(pa.schema([("k", pa.string()), ("v", pa.int64())]), "r", "n")
    table = pa.table({"k": ["a", "bb", "#HUDI#"], "v": [1, -2, 3]})
    return [
        encode_avro_data_block(table, schema, "20250101000000001"),
        encode_delete_block([DeleteRecord("a", "p", 5)], "20250101000000002", "long"),
        encode_rollback_command_block("20250101000000003", "20250101000000001"),
    ]


# ------------------------------------------------------------------------------------------
# Real log files
# ------------------------------------------------------------------------------------------


def test_read_log_file_every_sample_reframes_byte_identically(sample_logs: list[Path]) -> None:
    kinds: Counter[BlockType] = Counter()
    for path in sample_logs:
        blocks = read_log_file(path)
        assert blocks, path
        assert b"".join(b.to_bytes() for b in blocks) == path.read_bytes(), path
        kinds.update(b.block_type for b in blocks)
    assert set(kinds) == {
        BlockType.AVRO_DATA,
        BlockType.PARQUET_DATA,
        BlockType.DELETE,
        BlockType.COMMAND,
        BlockType.HFILE_DATA,
    }


def test_decode_every_sample_block_by_type_succeeds(sample_logs: list[Path]) -> None:
    for path in sample_logs:
        for block in read_log_file(path):
            assert block.instant_time.isdigit()
            if block.block_type is BlockType.AVRO_DATA:
                table = decode_avro_data_block(block)
                assert block.schema is not None
                assert table.column_names == [f["name"] for f in block.schema["fields"]]
                assert table.num_rows > 0
            elif block.block_type is BlockType.PARQUET_DATA:
                table = decode_parquet_data_block(block)
                assert block.schema is not None
                assert table.column_names == [f["name"] for f in block.schema["fields"]]
            elif block.block_type is BlockType.DELETE:
                records = decode_delete_block(block)
                # every delete Spark wrote is natural order: IntWrapper(0), bytes 04 00
                assert all(r.ordering_value is None for r in records)
            elif block.block_type is BlockType.COMMAND:
                assert block.is_rollback
                assert block.content == b""


def test_decode_avro_data_block_v8_sample_matches_hudi_rs_snapshot(sample_logs: list[Path]) -> None:
    expected = json.loads((SAMPLES / "expected" / f"{V8_TRIPS}.json").read_text())["rows"]
    by_key = {row["_hoodie_record_key"]: row for row in expected}
    path = next(p for p in sample_logs if p.name.endswith("20251220210123755.log.1_0-1022-2928"))
    (block,) = read_log_file(path)
    rows = decode_avro_data_block(block).to_pylist()
    assert len(rows) == 1
    row = rows[0]
    hudi_rs_row = by_key[row["_hoodie_record_key"]]
    for column in ("_hoodie_commit_time", "_hoodie_commit_seqno", "ts", "rider", "fare", "city"):
        assert row[column] == hudi_rs_row[column]
    assert row["_hoodie_file_name"] == "036ded81-9ed4-479f-bcea-7145dfa0079b-0"  # fileId only


def test_encode_avro_data_block_every_sample_reencodes_byte_identically(
    sample_logs: list[Path],
) -> None:
    seen = 0
    for path in sample_logs:
        for block in read_log_file(path):
            if block.block_type is BlockType.AVRO_DATA:
                table = decode_avro_data_block(block)
                schema = block.header[HeaderKey.SCHEMA]
                (ours,) = iter_blocks(encode_avro_data_block(table, schema, block.instant_time))
                assert ours.content == block.content, path
                assert dict(ours.header) == dict(block.header)
                seen += 1
    assert seen == 7  # 4 of Hudi 1.0 samples, 3 of Hudi 1.1.1 (table version 9)


def test_parquet_sample_rows_through_avro_data_block_nested_fallback_equal(
    sample_logs: list[Path],
) -> None:
    path = next(p for p in sample_logs if p.name.endswith("20250121000647668.log.1_0-73-101"))
    (block,) = read_log_file(path)
    table = decode_parquet_data_block(block)
    assert block.schema is not None  # Spark's: fixed decimal, arrays of records, maps, structs
    (avro_block,) = iter_blocks(encode_avro_data_block(table, block.schema, block.instant_time))
    assert decode_avro_data_block(avro_block, table.schema).to_pylist() == table.to_pylist()


def test_encode_delete_content_every_sample_delete_reencodes_byte_identically(
    sample_logs: list[Path],
) -> None:
    seen = 0
    for path in sample_logs:
        for block in read_log_file(path):
            if block.block_type is BlockType.DELETE:
                content = encode_delete_content(decode_delete_block(block), "long")
                assert frame_block(block.block_type, block.header, content) == block.to_bytes()
                seen += 1
    assert seen > 0


def test_encode_delete_block_v8_sample_same_header_order_byte_identical(
    sample_logs: list[Path],
) -> None:
    path = next(p for p in sample_logs if p.name == Path(SAO_PAULO_DELETE).name)
    original = path.read_bytes()
    (block,) = read_log_file(path)
    assert list(block.header) == [HeaderKey.SCHEMA, HeaderKey.INSTANT_TIME]  # Java HashMap order
    records = decode_delete_block(block)
    assert records == [DeleteRecord("e3cf430c-889d-4015-bc98-59bdce1e530c", "city=sao_paulo", None)]
    assert block.content[-3:] == b"\x04\x00\x00"  # IntWrapper(0), end of array
    content = encode_delete_content(records, "long")
    assert frame_block(BlockType.DELETE, block.header, content) == original
    # our own header order (INSTANT_TIME first) only moves the header entries
    ours = read_log_file_bytes(
        encode_delete_block(records, block.instant_time, "long", block.schema)
    )
    assert ours.content == block.content
    assert dict(ours.header) == dict(block.header)


def read_log_file_bytes(data: bytes) -> LogBlock:
    (block,) = iter_blocks(data)
    return block


def test_encode_rollback_command_block_sample_byte_identical(sample_logs: list[Path]) -> None:
    path = next(p for p in sample_logs if p.name.endswith(".log.2_1-0-1"))
    assert path.read_bytes() == ROLLBACK_FILE
    (block,) = read_log_file(path)
    assert block.target_instant_time == "20250126040826878"


# ------------------------------------------------------------------------------------------
# Framing
# ------------------------------------------------------------------------------------------


def test_encode_rollback_command_block_appendix_a1_framing_arithmetic() -> None:
    data = encode_rollback_command_block("20250126040936578", "20250126040826878")
    assert data == ROLLBACK_FILE
    assert len(data) == 105
    (block_len,) = struct.unpack_from(">q", data, 6)
    assert block_len == 91
    header_len = 4 + 3 * 8 + 17 + 1 + 17
    assert header_len == 63
    assert block_len == 4 + 4 + header_len + 8 + 0 + 4 + 8
    (total,) = struct.unpack_from(">q", data, len(data) - 8)
    assert total == 97 == block_len + 6 == len(data) - 8
    (block,) = iter_blocks(data)
    assert block.is_rollback
    assert block.instant_time == "20250126040936578"
    assert list(block.header) == [
        HeaderKey.INSTANT_TIME,
        HeaderKey.COMMAND_BLOCK_TYPE,
        HeaderKey.TARGET_INSTANT_TIME,
    ]


def test_frame_block_footer_and_header_order_round_trip() -> None:
    header = {HeaderKey.SCHEMA: "{}", HeaderKey.INSTANT_TIME: "1", HeaderKey.IS_PARTIAL: "true"}
    footer = {HeaderKey.BLOCK_IDENTIFIER: "ünïcode"}
    data = frame_block(BlockType.CDC_DATA, header, b"xyz", footer)
    (block,) = iter_blocks(data)
    assert block == LogBlock(BlockType.CDC_DATA, header, b"xyz", footer)
    assert list(block.header) == list(header)
    assert block.to_bytes() == data


def test_iter_blocks_every_truncation_point_yields_only_complete_blocks() -> None:
    blocks = _small_blocks()
    data = b"".join(blocks)
    ends = [sum(map(len, blocks[: i + 1])) for i in range(len(blocks))]
    for cut in range(len(data) + 1):
        got = [b.to_bytes() for b in iter_blocks(data[:cut])]
        assert got == [b for b, end in zip(blocks, ends, strict=True) if end <= cut], cut


def test_iter_blocks_corrupt_trailer_skips_only_that_block() -> None:
    first, second, third = _small_blocks()
    broken = second[:-1] + bytes([second[-1] ^ 0xFF])
    got = [b.to_bytes() for b in iter_blocks(first + broken + third)]
    assert got == [first, third]


def test_iter_blocks_garbage_between_blocks_skipped() -> None:
    first, second, third = _small_blocks()
    data = b"junk" + first + b"\x00#HUD" + second + b"#HUDI#\xff\xff" + third
    assert [b.to_bytes() for b in iter_blocks(data)] == [first, second, third]


def test_iter_blocks_inflated_block_length_skips_block() -> None:
    first, second, third = _small_blocks()
    (block_len,) = struct.unpack_from(">q", second, 6)
    bad = second[:6] + struct.pack(">q", block_len + 3) + second[14:]
    assert [b.to_bytes() for b in iter_blocks(first + bad + third)] == [first, third]


def test_iter_blocks_unknown_block_type_raises_log_format_error() -> None:
    data = bytearray(frame_block(BlockType.COMMAND, {HeaderKey.INSTANT_TIME: "1"}, b""))
    data[18:22] = struct.pack(">i", 9)
    with pytest.raises(LogFormatError, match="unknown log block type 9"):
        list(iter_blocks(bytes(data)))


def test_iter_blocks_unknown_header_key_raises_log_format_error() -> None:
    data = bytearray(frame_block(BlockType.COMMAND, {HeaderKey.INSTANT_TIME: "1"}, b""))
    data[26:30] = struct.pack(">i", 42)
    with pytest.raises(LogFormatError, match="header key 42"):
        list(iter_blocks(bytes(data)))


def test_log_block_instant_time_missing_raises_log_format_error() -> None:
    block = LogBlock(BlockType.DELETE, {}, b"")
    with pytest.raises(LogFormatError, match="INSTANT_TIME"):
        _ = block.instant_time


# ------------------------------------------------------------------------------------------
# Data blocks
# ------------------------------------------------------------------------------------------


def _trips(n: int = 5) -> tuple[pa.Table, dict[str, Any]]:
    table = pa.table(
        {
            "_hoodie_commit_time": ["20250101000000001"] * n,
            "_hoodie_commit_seqno": [f"20250101000000001_0_{i}" for i in range(n)],
            "_hoodie_record_key": [f"k{i}" for i in range(n)],
            "_hoodie_partition_path": ["city=é"] * n,
            "_hoodie_file_name": ["f-0"] * n,
            "ts": pa.array([10**12 + i for i in range(n)], pa.int64()),
            "fare": [None if i % 2 else i / 3 for i in range(n)],
        }
    )
    return table, arrow_schema_to_avro(table.schema, "trips_record", "hoodie.trips")


def test_encode_avro_data_block_round_trip_equal_and_version_3() -> None:
    table, schema = _trips()
    (block,) = iter_blocks(encode_avro_data_block(table, schema, "20250101000000001"))
    assert block.block_type is BlockType.AVRO_DATA
    assert list(block.header) == [HeaderKey.INSTANT_TIME, HeaderKey.SCHEMA]
    assert block.schema == schema
    assert struct.unpack_from(">ii", block.content) == (3, 5)
    assert decode_avro_data_block(block).equals(table)


def test_encode_avro_data_block_records_readable_by_fastavro() -> None:
    table, schema = _trips(3)
    (block,) = iter_blocks(encode_avro_data_block(table, schema, "1"))
    parsed = fastavro.parse_schema(schema)
    pos, rows = 8, []
    for _ in range(3):
        (length,) = struct.unpack_from(">i", block.content, pos)
        record = io.BytesIO(block.content[pos + 4 : pos + 4 + length])
        rows.append(fastavro.schemaless_reader(record, parsed, None))
        pos += 4 + length
    assert rows == table.to_pylist()


def test_decode_avro_data_block_reader_schema_fills_new_columns_with_nulls() -> None:
    table, schema = _trips()
    (block,) = iter_blocks(encode_avro_data_block(table, schema, "1"))
    reader = table.schema.append(pa.field("added", pa.string()))
    result = decode_avro_data_block(block, reader)
    assert result.schema == reader
    assert result.column("added").null_count == 5


def test_decode_avro_data_block_wrong_schema_raises_log_format_error() -> None:
    table, schema = _trips()
    data = encode_avro_data_block(table, schema, "1")
    (block,) = iter_blocks(data)
    wrong = dict(schema, fields=schema["fields"][:-1])
    header = {HeaderKey.INSTANT_TIME: "1", HeaderKey.SCHEMA: json.dumps(wrong)}
    with pytest.raises(LogFormatError):
        decode_avro_data_block(LogBlock(BlockType.AVRO_DATA, header, block.content))


def test_encode_avro_data_block_nested_schema_round_trip_equal() -> None:
    table = pa.table(
        {
            "_hoodie_record_key": ["a", "b"],
            "s": pa.array(
                [{"x": 1, "y": "q"}, None], pa.struct([("x", pa.int32()), ("y", pa.string())])
            ),
            "l": pa.array([[1.5, None], []], pa.list_(pa.float64())),
            "d": pa.array([Decimal("1.25"), None], pa.decimal128(10, 2)),
        }
    )
    schema = arrow_schema_to_avro(table.schema, "r", "n")
    (block,) = iter_blocks(encode_avro_data_block(table, schema, "1"))
    assert decode_avro_data_block(block, table.schema).equals(table)


def test_encode_parquet_data_block_round_trip_equal() -> None:
    table, schema = _trips()
    data = encode_parquet_data_block(table, schema, "20250101000000001")
    (block,) = iter_blocks(data)
    assert block.block_type is BlockType.PARQUET_DATA
    assert block.content[:4] == b"PAR1" and block.content[-4:] == b"PAR1"
    assert decode_parquet_data_block(block, table.schema).equals(table)


def test_encode_parquet_data_block_dictionary_encodes_repeated_strings_only() -> None:
    n = 3000
    table = pa.table({
        "_hoodie_commit_time": ["20250101000000001"] * n,
        "_hoodie_record_key": [f"k{i}" for i in range(n)],
        "city": [f"city-{i % 7}" for i in range(n)],
        "uuid": [f"uuid-{i:06d}" for i in range(n)],
        "n": list(range(n))})
    schema = arrow_schema_to_avro(table.schema, "r", "n")
    (block,) = iter_blocks(encode_parquet_data_block(table, schema, "20250101000000001"))
    assert dictionary_encoded(pa.BufferReader(block.content)) == {
        "_hoodie_commit_time": True, "_hoodie_record_key": False,
        "city": True, "uuid": False, "n": False}
    assert decode_parquet_data_block(block, table.schema).equals(table)


# ------------------------------------------------------------------------------------------
# Delete blocks
# ------------------------------------------------------------------------------------------

BRANCH_CASES = [
    ("boolean", True, "0201"),
    ("int", -3, "0405"),
    ("long", 1695516137016, "06f0d898cad862"),
    ("float", 1.5, "080000c03f"),
    ("double", 2.0, "0a0000000000000040"),
    ("bytes", b"\x01", "0c0201"),
    ("string", "z", "0e027a"),
]


@pytest.mark.parametrize(("ordering_type", "value", "expected_hex"), BRANCH_CASES)
def test_encode_delete_content_ordering_branch_matches_type(
    ordering_type: str, value: object, expected_hex: str
) -> None:
    record = DeleteRecord("k", "p", value)
    content = encode_delete_content([record], ordering_type)
    assert content.endswith(bytes.fromhex(expected_hex) + b"\x00")
    block = LogBlock(BlockType.DELETE, {HeaderKey.INSTANT_TIME: "1"}, content)
    assert decode_delete_block(block) == [record]


@pytest.mark.parametrize("ordering_type", [None, "int", "long", "float", "double", "string"])
def test_encode_delete_content_null_ordering_is_int_wrapper_zero(ordering_type: str | None) -> None:
    content = encode_delete_content([DeleteRecord("k", "", None)], ordering_type)
    assert content == struct.pack(">ii", 3, 9) + bytes.fromhex("02 02 02 6b 02 00 04 00 00")


@pytest.mark.parametrize(
    ("branch_bytes", "expected"),
    [
        (bytes.fromhex("10 f2 b0 02"), 19513),  # DateWrapper: days
        (bytes.fromhex("12 0e") + (1_500_000_000_000_000).to_bytes(7, "big"), Decimal("1.5")),
        (bytes.fromhex("14 02"), 1),  # TimeMicrosWrapper
        (bytes.fromhex("16 80 01"), 64),  # TimestampMicrosWrapper
        (bytes.fromhex("00"), None),  # null
    ],
)
def test_decode_delete_block_other_wrappers_python_values(
    branch_bytes: bytes, expected: object
) -> None:
    avro = bytes.fromhex("02 02 02 6b 02 00") + branch_bytes + b"\x00"
    block = LogBlock(BlockType.DELETE, {}, struct.pack(">ii", 3, len(avro)) + avro)
    assert decode_delete_block(block) == [DeleteRecord("k", "", expected)]


def test_encode_delete_content_long_zero_is_not_natural_order() -> None:
    content = encode_delete_content([DeleteRecord("k", "", 0)], "long")
    assert content.endswith(b"\x06\x00\x00")  # LongWrapper(0): compared, not natural order
    block = LogBlock(BlockType.DELETE, {HeaderKey.INSTANT_TIME: "1"}, content)
    assert decode_delete_block(block) == [DeleteRecord("k", "", 0)]


def test_encode_delete_content_matches_fastavro_with_hudi_schema() -> None:
    records = [
        DeleteRecord("k1", "p=1", 7),
        DeleteRecord("k2", "", None),
        DeleteRecord("ключ", "p=ü", -(2**40)),
    ]
    wrapped: list[dict[str, Any]] = [
        {
            "recordKey": r.record_key,
            "partitionPath": r.partition_path,
            "orderingVal": (
                ("org.apache.hudi.avro.model.IntWrapper", {"value": 0})
                if r.ordering_value is None
                else ("org.apache.hudi.avro.model.LongWrapper", {"value": r.ordering_value})
            ),
        }
        for r in records
    ]
    out = io.BytesIO()
    fastavro.schemaless_writer(
        out, fastavro.parse_schema(delete_record_list_schema()), {"deleteRecordList": wrapped}
    )
    assert encode_delete_content(records, "long")[8:] == out.getvalue()
    assert encode_delete_content(records, "long")[4:8] == struct.pack(">i", len(out.getvalue()))


def test_encode_delete_content_table_input_equals_records_input() -> None:
    records = [DeleteRecord(f"k{i}", "p", None if i % 3 == 0 else i * 10) for i in range(50)]
    table = pa.table(
        {
            "_hoodie_record_key": [r.record_key for r in records],
            "_hoodie_partition_path": [r.partition_path for r in records],
            "ordering": pa.array([r.ordering_value for r in records], pa.int64()),
            "other": list(range(50)),
        }
    )
    assert encode_delete_content(table, "long") == encode_delete_content(records, "long")
    block = LogBlock(BlockType.DELETE, {}, encode_delete_content(table, "long"))
    assert decode_delete_block(block) == records


def test_encode_delete_content_double_with_natural_rows_round_trip() -> None:
    records = [DeleteRecord("a", "p", 1.25), DeleteRecord("b", "p", None)]
    content = encode_delete_content(records, "double")
    block = LogBlock(BlockType.DELETE, {}, content)
    assert decode_delete_block(block) == records


def test_encode_delete_content_ordering_without_type_raises_value_error() -> None:
    with pytest.raises(ValueError, match="ordering_type"):
        encode_delete_content([DeleteRecord("k", "p", 5)], None)


def test_encode_delete_content_int_out_of_range_raises_value_error() -> None:
    with pytest.raises(ValueError, match="int"):
        encode_delete_content([DeleteRecord("k", "p", 2**40)], "int")


def test_encode_delete_block_empty_list_matches_metadata_table_sample() -> None:
    data = encode_delete_block([], "00000000000000004", None)
    assert len(data) == 80  # the size of every empty MDT delete log in the v8 sample
    (block,) = iter_blocks(data)
    assert block.content == bytes.fromhex("000000030000000100")
    assert decode_delete_block(block) == []


def test_decode_delete_block_array_with_byte_size_blocks() -> None:
    item = bytes.fromhex("02 02 6b 02 00 06 0a")  # key "k", partition "", LongWrapper(5)
    # count -2 (zigzag 03): a block of two items preceded by its byte size, then the end (00)
    avro = bytes.fromhex("03") + bytes([len(item) * 4]) + item * 2 + bytes.fromhex("00")
    content = struct.pack(">ii", 3, len(avro)) + avro
    block = LogBlock(BlockType.DELETE, {}, content)
    assert decode_delete_block(block) == [DeleteRecord("k", "", 5)] * 2


def test_decode_delete_block_kryo_version_raises_log_format_error() -> None:
    block = LogBlock(BlockType.DELETE, {}, struct.pack(">ii", 2, 0))
    with pytest.raises(LogFormatError, match="version 2"):
        decode_delete_block(block)


def test_decode_delete_block_truncated_avro_raises_log_format_error() -> None:
    content = encode_delete_content([DeleteRecord("key", "p", 5)], "long")
    bad = struct.pack(">ii", 3, len(content) - 10) + content[8:-2]
    with pytest.raises(LogFormatError):
        decode_delete_block(LogBlock(BlockType.DELETE, {}, bad))


def test_encode_delete_block_hudi_rs_applies_event_time_ordering(
    sample_logs: list[Path], tmp_path: Path
) -> None:
    table_dir = tmp_path / "v8"
    shutil.copytree(_v8_table(sample_logs), table_dir)
    (original,) = read_log_file(table_dir / SAO_PAULO_DELETE)
    key, ts = "e3cf430c-889d-4015-bc98-59bdce1e530c", 1695516137016  # rider-F in the base file
    cases = {None: True, ts: True, ts + 1: True, ts - 1: False, 0: False}
    for ordering, deleted in cases.items():
        record = DeleteRecord(key, "city=sao_paulo", ordering)
        block = encode_delete_block([record], original.instant_time, "long", original.schema)
        (table_dir / SAO_PAULO_DELETE).write_bytes(block)
        reader = hudi.HudiFileGroupReader(str(table_dir))
        batch = reader.read_file_slice_from_paths(SAO_PAULO_BASE, [SAO_PAULO_DELETE])
        riders = batch.column("rider").to_pylist()
        assert ("rider-F" not in riders) is deleted, ordering
        assert "rider-G" in riders


def test_delete_record_list_schema_orders_wrappers_as_hudi() -> None:
    items = delete_record_list_schema()["fields"][0]["type"]["items"]
    branches = items["fields"][2]["type"]
    names = [b if isinstance(b, str) else b["name"] for b in branches]
    assert names[:12] == [
        "null",
        "BooleanWrapper",
        "IntWrapper",
        "LongWrapper",
        "FloatWrapper",
        "DoubleWrapper",
        "BytesWrapper",
        "StringWrapper",
        "DateWrapper",
        "DecimalWrapper",
        "TimeMicrosWrapper",
        "TimestampMicrosWrapper",
    ]


def test_magic_is_hudi_marker() -> None:
    assert MAGIC == b"#HUDI#"
