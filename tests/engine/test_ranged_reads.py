"""Object-store reads fetch what they need: a base file opened in parts
(:class:`engine.storage.RangedInput`) costs its tail (the footer) and the chunks of the
columns read, counted at the S3 test server (tests/s3.py: each object ``GET`` it answers and its
bytes)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine import Table
from engine.format.base_file import chunk_ranges, parquet_file, read_base_file, read_row_groups
from engine.storage import RangedInput, Storage
from engine.storage.ranged import HOLE, TAIL_GUESS, coalesce, tail_guess
from tests.engine.object_store_checks import check_ranged_reads, parts_file, write_parts_file
from tests.s3 import S3Location


def _footer_size(data: bytes) -> int:
    return int.from_bytes(data[-8:-4], "little") + 8


def test_coalesce_merges_close_and_overlapping_ranges_only() -> None:
    assert coalesce([(100, 200), (0, 50), (210, 300), (150, 160), (400, 400)], hole=20) == \
        [(0, 50), (100, 300)]
    assert coalesce([(0, 10), (10 + HOLE, 20 + HOLE)]) == [(0, 10), (10 + HOLE, 20 + HOLE)]


def test_s3_ranged_reads_match_whole_reads_and_replaced_file_is_an_error(
        s3: S3Location) -> None:
    check_ranged_reads(Storage(s3.uri(), s3.storage_options))


def test_s3_one_column_read_fetches_footer_and_that_columns_chunks_counted_at_server(
        s3: S3Location) -> None:
    storage = Storage(s3.uri(), s3.storage_options)
    data = write_parts_file(storage, "p/f.parquet", parts_file())
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    needed = sum(end - start for start, end in chunk_ranges(metadata, None, ["v"]))
    footer = _footer_size(data)
    assert footer < TAIL_GUESS < len(data) // 4
    with s3.server.fetched(s3.bucket) as sent, \
            storage.open_input("p/f.parquet", whole=False) as source:
        got = read_base_file(source, columns=["v"])
    assert got.column("v").to_pylist() == [i * 0.5 for i in range(40_000)]
    fetched = sum(size for _, size in sent)
    # the tail (a cold guess: 64 KiB) and one request per row group's chunk of v
    assert len(sent) == 1 + metadata.num_row_groups
    assert fetched <= 2 * needed + TAIL_GUESS
    # the next file of the table opens with the footer size seen, not 64 KiB
    assert footer < tail_guess(storage.base_path) < 2 * footer
    with s3.server.fetched(s3.bucket) as sent, \
            storage.open_input("p/f.parquet", whole=False) as source:
        assert read_base_file(source, columns=["v"]).equals(got)
    assert sum(size for _, size in sent) <= 2 * (needed + footer)


def test_s3_footer_larger_than_tail_guess_takes_one_more_request(s3: S3Location) -> None:
    storage = Storage(s3.uri(), s3.storage_options)
    big = {"big": "x" * (3 * TAIL_GUESS)}
    table = parts_file(2_000).replace_schema_metadata(big)
    data = write_parts_file(storage, "p/f.parquet", table)
    assert _footer_size(data) > TAIL_GUESS
    with s3.server.fetched(s3.bucket) as sent, \
            storage.open_input("p/f.parquet", whole=False) as source, \
            parquet_file(source) as file:
        assert file.schema_arrow.metadata[b"big"] == big["big"].encode()
        requests_for_footer = len(sent)
        got = read_row_groups(file, source, None, ["id"], True)
    assert requests_for_footer == 2  # the tail guessed, then the rest of the footer
    assert got.column("id").to_pylist() == list(range(2_000))
    needed = sum(e - s for s, e in chunk_ranges(file.metadata, None, ["id"]))
    assert sum(size for _, size in sent) <= 2 * needed + _footer_size(data) + TAIL_GUESS


def test_s3_file_shorter_than_tail_guess_is_one_request(s3: S3Location) -> None:
    storage = Storage(s3.uri(), s3.storage_options)
    data = write_parts_file(storage, "p/small.parquet", parts_file(300))
    assert len(data) < tail_guess(storage.base_path)
    with s3.server.fetched(s3.bucket) as sent, \
            storage.open_input("p/small.parquet", whole=False) as source:
        assert isinstance(source, RangedInput)
        got = read_base_file(source, columns=["st", "city"])
        assert read_base_file(source, columns=None).num_rows == 300
    assert got.equals(pq.read_table(pa.BufferReader(data), columns=["st", "city"]))
    assert len(sent) == 1 and sum(size for _, size in sent) == len(data)


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_s3_table_one_column_one_partition_read_fetches_at_most_twice_its_chunks_and_footers(
        s3: S3Location, table_type: str) -> None:
    """``Table.read(["v"], part = p1)`` fetches the footers and the chunks of ``v`` (and of
    the filter's ``part``) of that partition's base files — not their meta columns, not the
    files; a read of every column fetches each file whole, in one request."""
    rows = 60_000
    batch = pa.table({"key": [f"k{i:06d}" for i in range(rows)], "ts": [1] * rows,
                      "part": [f"p{i % 2}" for i in range(rows)],
                      "v": pc.multiply(pa.array(range(rows), pa.float64()), 0.25),
                      "note": [f"note-{i:09d}" for i in range(rows)]})
    table = Table.create(s3.uri(), name="trips", table_type=table_type, record_key="key",
                         precombine="ts", partition_by="part",
                         storage_options=s3.storage_options)
    table.bulk_insert(batch)
    storage = Storage(s3.uri(), s3.storage_options)
    scan = table.scan(["v"], [("part", "=", "p1")])
    needed = 0
    for slc in scan.slices:
        assert slc.base_file is not None and not slc.log_files
        data = storage.read(slc.base_file.path)
        metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
        needed += sum(e - s for s, e in chunk_ranges(metadata, None, ["v", "part"]))
        needed += _footer_size(data)
    for _ in range(2):  # cold (64 KiB tails), then with the table's footer size known
        with s3.server.fetched(s3.bucket) as sent:
            got = table.read(["v"], [("part", "=", "p1")])
        fetched = sum(size for key, size in sent if key.endswith(".parquet"))
        assert fetched <= 2 * needed + len(scan.slices) * TAIL_GUESS
    assert fetched <= 2 * needed
    assert sorted(got.column("v").to_pylist()) == [i * 0.25 for i in range(1, rows, 2)]
    with s3.server.fetched(s3.bucket) as sent:
        everything = table.read()
    files = [key for key, _ in sent if key.endswith(".parquet")]
    assert everything.num_rows == rows and len(files) == len(set(files))
