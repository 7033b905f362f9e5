"""HFile v3 and metadata-table log files, checked byte for byte against the Spark-written sample."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from engine.errors import CorruptTableError
from engine.format.bloom import BloomFilter
from engine.format.hfile import (
    HFileError,
    HFileReader,
    gzip_boundary_hazard,
    gzip_member,
    key_value_key,
    row_order,
    write_hfile,
    write_hudi_base_hfile,
)
from engine.format.hfile import _midpoint_row as midpoint_row
from engine.format.log_format import (
    BlockType,
    HeaderKey,
    decode_delete_block,
    decode_hfile_data_block,
    encode_hfile_data_block,
    encode_initial_log_block,
    encode_metadata_delete_block,
    iter_blocks,
)
from engine.format.naming import parse_base_file, parse_log_file
from tests.conftest import SAMPLES, extract_sample

V8_TRIPS = "quickstart_trips_table__mor__avro__v8_trips_8i3u1d"


@pytest.fixture(scope="module")
def mdt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The v8 trips sample's ``.hoodie/metadata`` folder (unzipped once per module)."""
    dest = tmp_path_factory.mktemp("v8_trips")
    table = extract_sample(SAMPLES / f"{V8_TRIPS}.zip", dest, "v8_trips_8i3u1d")
    return table / ".hoodie" / "metadata"


def _base_files(mdt: Path) -> list[Path]:
    return sorted(mdt.glob("*/*.hfile"))


def _log_files(mdt: Path) -> list[Path]:
    return sorted(mdt.glob("*/.*.log.*"))


def test_sample_base_hfiles_regenerated_byte_identical(mdt: Path) -> None:
    files = _base_files(mdt)
    assert len(files) == 24
    for path in files:
        data = path.read_bytes()
        reader = HFileReader(data, verify_checksums=True)
        cells = list(reader.cells())
        assert len(cells) == reader.entry_count
        schema = reader.file_info["schema"].decode()
        assert len(schema) == 7969
        assert write_hudi_base_hfile(cells, schema) == data, path.name
        bloom = reader.meta_block("bloomFilter")
        assert bloom is not None
        assert reader.meta_block("nope") is None
        rebuilt = BloomFilter.deserialize(bloom.decode(), "DYNAMIC_V0")
        assert all(rebuilt.might_contain(row.decode()) for row, _ in cells)
        for row, value in cells:
            assert reader.get(row) == [value]


def test_sample_log_files_regenerated_byte_identical(mdt: Path) -> None:
    files = _log_files(mdt)
    assert len(files) == 63
    kinds = {"hfile": 0, "init": 0, "delete": 0}
    for path in files:
        data = path.read_bytes()
        parts = []
        for block in iter_blocks(data):
            schema = block.header.get(HeaderKey.SCHEMA)
            if block.block_type is BlockType.HFILE_DATA:
                assert schema is not None and list(block.header) == [
                    HeaderKey.SCHEMA, HeaderKey.INSTANT_TIME]
                cells = decode_hfile_data_block(block)
                parts.append(encode_hfile_data_block(cells, schema, block.instant_time))
                kinds["hfile"] += 1
                continue
            assert block.block_type is BlockType.DELETE
            records = decode_delete_block(block)
            if schema is None:
                assert records == [] and len(data) == 80
                parts.append(encode_initial_log_block(block.instant_time))
                kinds["init"] += 1
            else:
                assert {r.partition_path for r in records} == {path.parent.name}
                parts.append(encode_metadata_delete_block(
                    [r.record_key for r in records], path.parent.name, block.instant_time,
                    schema))
                kinds["delete"] += 1
        assert b"".join(parts) == data, path.name
    assert kinds == {"hfile": 35, "init": 24, "delete": 4}


def test_scan_frames_sample_logs_equal_whole_file_blocks_truncated_is_none(mdt: Path) -> None:
    """Reading a log's blocks by their frames (ranges) finds exactly the blocks, headers and
    contents a whole-file read finds, in every MDT log of the sample; a truncated or
    corrupt file gives None (the caller then reads it whole, which skips bad blocks)."""
    from engine.format.log_block import scan_frames

    for path in _log_files(mdt):
        data = path.read_bytes()
        frames = scan_frames(len(data), lambda offset, length, d=data: d[offset : offset + length])
        assert frames is not None, path.name
        blocks = list(iter_blocks(data))
        assert [(f.block_type, dict(f.header)) for f in frames] == [
            (b.block_type, dict(b.header)) for b in blocks]
        assert [data[f.content_offset : f.content_offset + f.content_length]
                for f in frames] == [b.content for b in blocks]
        cut = data[:-3]
        assert scan_frames(len(cut), lambda o, n, cut=cut: cut[o : o + n]) is None
        broken = data[:10] + b"\xff" + data[11:]  # the block length's high bytes
        assert scan_frames(len(broken), lambda o, n, b=broken: b[o : o + n]) is None


def test_initial_log_block_matches_doc_bytes_80() -> None:
    expected = bytes.fromhex(
        "234855444923" "0000000000000042" "00000001" "00000001"
        "00000001" "00000000" "00000011") + b"00000000000000000" + bytes.fromhex(
        "0000000000000009" "00000003" "00000001" "00" "00000000" "0000000000000048")
    assert encode_initial_log_block("00000000000000000") == expected


def test_naming_mdt_base_and_log_names_parse() -> None:
    base = parse_base_file("files-0000-0_0-955-2690_00000000000000000.hfile")
    assert base is not None
    assert (base.file_id, base.write_token, base.extension) == ("files-0000-0", "0-955-2690",
                                                                 "hfile")
    log = parse_log_file(".files-0000-0_20251220210108078.log.1_10-999-2838")
    assert log is not None
    assert (log.file_id, log.instant_time, log.version, log.write_token) == (
        "files-0000-0", "20251220210108078", 1, "10-999-2838")
    si = parse_base_file("secondary-index-rider-idx-0000-0_22-1133-3301_20251220210130942.hfile")
    assert si is not None and si.file_id == "secondary-index-rider-idx-0000-0"
    init = parse_log_file(".record-index-0007-0_00000000000000002.log.1_0-0-0")
    assert init is not None and init.file_id == "record-index-0007-0"


def _cells(n: int, value_size: int = 40, seed: int = 7) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    rows = sorted({f"key-{rng.randrange(10**9):09d}".encode() for _ in range(n)})
    return [(row, rng.randbytes(value_size)) for row in rows]


def test_write_hfile_small_block_size_multi_block_every_key_found() -> None:
    cells = _cells(2000)
    for compression in ("GZ", "NONE"):
        data = write_hfile(cells, compression=compression, block_size=1024)
        reader = HFileReader(data, verify_checksums=True)
        assert reader.block_count > 50
        assert reader.entry_count == len(cells)
        assert list(reader.cells()) == cells
        for row, value in cells:
            assert reader.get(row) == [value]
        assert reader.get(b"key-") == [] and reader.get(b"zzz") == [] and reader.get(b"") == []
        assert reader.file_info["hfile.LASTKEY"] == key_value_key(cells[-1][0])
        lo, hi = cells[100][0], cells[900][0]
        assert list(reader.scan(lo, hi)) == cells[100:900]
        prefix = cells[500][0][:7]
        assert list(reader.rows_with_prefix(prefix)) == [c for c in cells if
                                                         c[0].startswith(prefix)]


def test_hfile_get_many_multi_block_equals_filtered_cells() -> None:
    rng = random.Random(11)
    cells = _cells(2000)
    dup = [(b"a", b"1" * 200), (b"b", b"x" * 600), (b"b", b"y" * 600), (b"b", b"z"),
           (b"c", b"3")]
    for data, all_cells in ((write_hfile(cells, block_size=1024), cells),
                            (write_hfile(cells, compression="NONE", block_size=1024), cells),
                            (write_hfile(dup, block_size=100, allow_duplicates=True), dup)):
        reader = HFileReader(data)
        rows = [c[0] for c in rng.sample(all_cells, min(40, len(all_cells)))]
        rows += [b"", b"key-", b"zzz", b"b"]
        wanted = set(rows)
        assert list(reader.get_many(rows)) == [c for c in all_cells if c[0] in wanted]
        # dense: most rows of the file wanted (every block walked), unsorted, repeated
        rows = [c[0] for c in rng.sample(all_cells, len(all_cells) * 2 // 3)] + rows
        wanted = set(rows)
        assert list(reader.get_many(rows)) == [c for c in all_cells if c[0] in wanted]
        assert list(reader.get_many([])) == []


def test_hfile_get_many_value_holding_a_cell_of_another_row_is_not_a_cell() -> None:
    """A value whose bytes are exactly another row's cell (an attacker's string, or chance)
    is never taken for that row: a lookup finds only cells the block's walk lands on."""
    import struct

    def cell(row: bytes, value: bytes) -> bytes:
        key = struct.pack(">H", len(row)) + row + b"\x00" + struct.pack(">q", 0) + b"\x04"
        return struct.pack(">ii", len(key), len(value)) + key + value + b"\x00"

    fake = cell(b"key-b", b"forged")
    cells = [(b"key-a", b"pad" + fake + b"pad"), (b"key-c", fake), (b"key-d", b"ok")]
    for compression in ("GZ", "NONE"):
        reader = HFileReader(write_hfile(cells, compression=compression, block_size=1 << 16))
        assert list(reader.get_many([b"key-b"])) == []
        assert list(reader.get_many([b"key-b", b"key-c", b"key-d"])) == cells[1:]
        assert list(reader.get_many([b"key-a", b"key-b"])) == cells[:1]
        # many rows wanted in one block: one walk over its cells, the same answer
        many = [b"key-b", b"key-c", b"key-d"] + [b"absent-%d" % i for i in range(10)]
        assert len(many) >= HFileReader.DENSE_LOOKUP
        assert list(reader.get_many(many)) == cells[1:]
        assert list(reader.get_many([b"key-a", b"key-b", *many[3:]])) == cells[:1]


def test_hfile_get_many_reads_neighbouring_blocks_in_one_range() -> None:
    """Wanted blocks next to each other are fetched by one ranged read."""
    cells = _cells(2000)
    data = write_hfile(cells, block_size=1024)
    fetched: list[tuple[int, int]] = []

    def read_range(offset: int, length: int) -> bytes:
        fetched.append((offset, length))
        return data[offset : offset + length]

    ranged = HFileReader.from_ranges(len(data), read_range)
    opened = len(fetched)
    rows = [c[0] for c in cells[::7]]  # every block holds one
    assert list(ranged.get_many(rows)) == [c for c in cells if c[0] in set(rows)]
    assert len(fetched) - opened == 1


def test_hfile_from_ranges_reads_only_tail_and_wanted_blocks() -> None:
    """A ranged reader finds what a whole-file reader finds, fetching the trailer, the
    load-on-open section and only the data blocks that hold the wanted rows."""
    rng = random.Random(12)
    cells = _cells(2000)
    data = write_hfile(cells, block_size=1024)
    whole = HFileReader(data)
    fetched: list[tuple[int, int]] = []

    def read_range(offset: int, length: int) -> bytes:
        fetched.append((offset, length))
        return data[offset : offset + length]

    ranged = HFileReader.from_ranges(len(data), read_range)
    assert ranged.file_info == whole.file_info and ranged.block_count == whole.block_count
    opened = len(fetched)
    assert opened == 2  # the trailer, then everything from the load-on-open offset
    rows = sorted(c[0] for c in rng.sample(cells, 3))
    assert list(ranged.get_many(rows)) == list(whole.get_many(rows))
    assert 1 <= len(fetched) - opened <= 3
    assert sum(n for _, n in fetched[opened:]) < len(data) // 10
    assert list(ranged.cells()) == cells


def test_write_hfile_duplicates_allowed_kept_in_order_one_block() -> None:
    cells = [(b"a", b"1" * 200), (b"b", b"x" * 600), (b"b", b"y" * 600), (b"b", b"z"), (b"c", b"3")]
    reader = HFileReader(write_hfile(cells, block_size=100, allow_duplicates=True))
    assert reader.get(b"b") == [b"x" * 600, b"y" * 600, b"z"]
    assert list(reader.cells()) == cells
    assert reader.block_count == 3  # "a" | "b" x3 (duplicates never cut) | "c"


def test_write_hfile_unsorted_or_duplicate_rows_value_error() -> None:
    with pytest.raises(ValueError, match="unsorted"):
        write_hfile([(b"b", b""), (b"a", b"")])
    with pytest.raises(ValueError, match="duplicate"):
        write_hfile([(b"a", b""), (b"a", b"")])
    with pytest.raises(ValueError, match="compression"):
        write_hfile([], compression="SNAPPY")


def test_write_hfile_empty_file_reads_back_empty() -> None:
    reader = HFileReader(write_hudi_base_hfile([], "{}"))
    assert reader.entry_count == 0 and list(reader.cells()) == [] and reader.get(b"x") == []
    assert reader.file_info["minRecordKey"] == b"" and "hfile.LASTKEY" not in reader.file_info


def test_midpoint_row_hbase_rules() -> None:
    assert midpoint_row(b"abc", b"abcde") == b"abcd"  # prefix: F[0..d]
    assert midpoint_row(b"abc", b"abx") == b"abd"  # L[d] + 1 < F[d]
    assert midpoint_row(b"abc", b"abd") == b"abd"  # L[d] + 1 == F[d]: F[0..d]
    assert midpoint_row(b"a\xff", b"b") == b"b"
    assert midpoint_row(b"a\x80", b"a\xf0") == b"a\x81"


def _data_block_payload_len(data: bytes, offset: int = 0) -> int:
    """33 + payload of the block at ``offset`` (its onDiskDataSizeWithHeader)."""
    return int(struct.unpack_from(">i", data, offset + 29)[0])


def test_gzip_boundary_block_in_hudi_rs_window_recompressed_outside() -> None:
    rng = random.Random(1)
    noise = rng.randbytes(40000)
    # A meta block of incompressible bytes: every zlib level gives the same size, so the
    # writer needs its last resort (flush points). Find a length whose level-6 member is bad.
    length = next(n for n in range(16000, 16400) if gzip_boundary_hazard(len(gzip_member(
        noise[:n]))))
    assert gzip_boundary_hazard(len(gzip_member(noise[:length])))
    data = write_hfile([(b"k", b"v")], meta_blocks=[("blob", noise[:length])])
    reader = HFileReader(data, verify_checksums=True)
    assert reader.meta_block("blob") == noise[:length]
    meta_offset = int.from_bytes(data[8:12], "big") + 33  # data block is first; meta follows
    assert data[meta_offset : meta_offset + 8] == b"METABLKc"
    assert not gzip_boundary_hazard(_data_block_payload_len(data, meta_offset) - 33)
    # A compressible data block that lands in the window at level 6 takes another level.
    text = random.Random(2).randbytes(20000).hex().encode()  # compresses to about 58 %

    def raw_block(value: bytes) -> bytes:
        return struct.pack(">ii", 15, len(value)) + key_value_key(b"row") + value + b"\x00"

    size = next(n for n in range(28000, 29000) if gzip_boundary_hazard(len(gzip_member(
        raw_block(text[:n])))))
    cells = [(b"row", text[:size])]
    data = write_hfile(cells)
    assert data[33:43] == bytes.fromhex("1f8b0800000000000000")
    assert not gzip_boundary_hazard(_data_block_payload_len(data) - 33)
    assert HFileReader(data).get(b"row") == [cells[0][1]]


def test_reader_malformed_files_raise_named_error() -> None:
    good = write_hfile(_cells(50), block_size=512)
    assert issubclass(HFileError, CorruptTableError)
    with pytest.raises(HFileError, match="shorter than the 4096-byte trailer"):
        HFileReader(good[:100])
    with pytest.raises(HFileError, match="trailer magic"):
        HFileReader(good[:-4096] + b"X" + good[-4095:])
    with pytest.raises(HFileError, match="HFile major version"):
        HFileReader(good[:-1] + b"\x02")
    broken = bytearray(good)
    broken[0:8] = b"DATABLKX"
    with pytest.raises(HFileError, match="magic"):
        list(HFileReader(bytes(broken)).cells())
    broken = bytearray(good)
    broken[50] ^= 0xFF  # inside the first gzip member
    with pytest.raises(HFileError):
        list(HFileReader(bytes(broken)).cells())
    with pytest.raises(HFileError, match="checksum"):
        list(HFileReader(bytes(broken), verify_checksums=True).cells())
    with pytest.raises(HFileError):
        HFileReader(good[:1000] + good[-4096:])  # index blocks missing


def test_write_hfile_many_blocks_arrays_and_threads_same_bytes_as_pairs_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells given as Arrow arrays, and compressed in two threads (hundreds of blocks), make
    the same bytes as (row, value) pairs compressed one block after another; duplicates are
    kept in order and never split across blocks."""
    import pyarrow as pa

    from engine.format import hfile

    cells = _cells(20_000, value_size=30)
    dup = sorted([(f"r{i % 700:04d}".encode(), str(i).encode() * 9) for i in range(6000)],
                 key=lambda c: c[0])
    for given, duplicates in ((cells, False), (dup, True)):
        arrays = hfile.Cells(pa.array([r for r, _ in given], pa.binary()),
                             pa.chunked_array([[v for _, v in given]], pa.binary()))
        threaded = write_hfile(arrays, block_size=256, allow_duplicates=duplicates)
        monkeypatch.setattr(hfile, "PARALLEL_BLOCKS", 10**9)
        serial = write_hfile(given, block_size=256, allow_duplicates=duplicates)
        monkeypatch.undo()
        assert threaded == serial
        reader = HFileReader(threaded, verify_checksums=True)
        assert reader.block_count > hfile.PARALLEL_BLOCKS
        assert list(reader.cells()) == given
        assert list(reader.get_many([given[5][0]])) == [c for c in given if c[0] == given[5][0]]


def test_hfile_array_lookup_many_blocks_equals_brute_force_rows_of_any_shape() -> None:
    """Lookups touching many blocks find cells by arrays (and a file's key index, kept by a
    process, answers alike): rows of mixed lengths, prefixes of each other, duplicates in a
    log-block HFile, values holding another row's bytes, and rows with NUL bytes (not held
    as arrays: walked in Python) all give what a filter over the cells gives."""
    rng = random.Random(5)
    rows = sorted({bytes(rng.choice(b"abk-0123456789") for _ in range(rng.randint(1, 24)))
                   for _ in range(3000)})
    cells = [(row, rng.randbytes(rng.randint(0, 30)) + (rows[0] if rng.random() < 0.1 else b""))
             for row in rows]
    dups = sorted([*cells, *[(row, b"again-" + row) for row, _ in rng.sample(cells, 300)]],
                  key=lambda c: c[0])
    nul = sorted([*cells, (b"k\x00", b"nul"), (b"k\x00\x00", b"nuls")], key=lambda c: c[0])
    for all_cells, dup in ((cells, False), (dups, True), (nul, False)):
        reader = HFileReader(write_hfile(all_cells, block_size=512, allow_duplicates=dup))
        present = [c[0] for c in rng.sample(all_cells, 900)]
        absent = [b"zz" + r for r in present[:50]] + [r[:-1] + b"~" for r in present[:50]]
        wanted = [*present, *absent, b"", b"k\x00", b"k"]
        expected = [c for c in all_cells if c[0] in set(wanted)]
        assert len(reader._route(sorted(set(wanted)))) >= HFileReader.SCAN_BLOCKS
        assert list(reader.get_many(wanted)) == expected
        index = reader.key_index()
        if all_cells is nul:
            assert index is None
        else:
            assert index is not None
            assert list(index.get_many(sorted(set(wanted)))) == expected


def test_row_order_random_rows_equals_stable_sort_indices() -> None:
    """:func:`row_order` orders rows as Arrow's stable sort by bytes does: rows sharing a long
    prefix, rows tied on the compared window (equal, or apart only past it, or by trailing
    zero bytes and length), empty rows, one length (the matrix view) or mixed lengths."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = random.Random(36)
    pieces = [b"", b"\x00", b"a", b"ab", b"ab\x00", b"abcdefgh", b"abcdefghi", b"\xff", b"zz",
              b"\x00\x00\x00\x00\x00\x00\x00\x00\x01"]
    cases = [[b"".join(rng.choice(pieces) for _ in range(rng.randrange(5)))
              for _ in range(rng.randrange(80))] for _ in range(300)]
    cases.append([b"key-" + f"{rng.randrange(10**6):012d}".encode() for _ in range(5000)])
    cases.append([b"k" + rng.randbytes(8) for _ in range(5000)])  # one length, a few ties
    cases.append([b"same-prefix-" + bytes([rng.randrange(3)]) * rng.randrange(12)
                  for _ in range(2000)])
    for rows in cases:
        array = pa.array(rows, pa.large_binary())
        expected = np.asarray(pc.sort_indices(array))
        assert row_order(array).tolist() == expected.tolist(), rows[:20]
        assert row_order(array.slice(1)).tolist() == np.asarray(
            pc.sort_indices(array.slice(1))).tolist()
