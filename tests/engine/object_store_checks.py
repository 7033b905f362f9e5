"""Checks every object store's suite runs the same way (S3: test_object_storage.py; GCS and
Azure: test_cloud_stores.py): the rows they write, a read judged by the oracle and hudi-rs, and
eight writers racing to create one timeline file."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from engine import Table
from engine.format.base_file import chunk_ranges
from engine.layout.file_group import FileSlice
from engine.storage import Storage
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("region", pa.string()),
                    ("fare", pa.float64())])
COLUMNS = ["key", "ts", "region", "fare"]


def region_rows(keys: range, ts: int) -> list[dict[str, object]]:
    """Rows of :data:`SCHEMA` for ``keys``, two regions, values depending on ``ts``."""
    return [{"key": f"k{i:03d}", "ts": ts, "region": ("eu", "us")[i % 2], "fare": i * 1.5 + ts}
            for i in keys]


def check_read(table: Table, oracle: Oracle, storage_options: Mapping[str, str]) -> None:
    """The table read by the engine and by hudi-rs (same storage options) = the oracle."""
    expected = sorted_rows(oracle.rows.values(), COLUMNS)
    assert sorted_rows(table.read(), COLUMNS) == expected
    assert sorted_rows(hudi_rs_read(table.path, storage_options=storage_options),
                       COLUMNS) == expected


def assert_exactly_one_create_wins(location: str, storage_options: Mapping[str, str]) -> None:
    """Eight writers (own storages) create the same completed-instant file at once: exactly
    one wins, the others get FileExistsError, and the file holds the winner's bytes."""
    storages = [Storage(location, dict(storage_options)) for _ in range(8)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(storages))

    def complete(i: int) -> None:
        barrier.wait()
        try:
            storages[i].write_new(".hoodie/timeline/20260101000000000_x.commit",
                                  f"writer {i}".encode())
            outcomes.append(f"won {i}")
        except FileExistsError:
            outcomes.append("lost")

    threads = [threading.Thread(target=complete, args=(i,)) for i in range(len(storages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("lost") == len(storages) - 1
    content = storages[0].read(".hoodie/timeline/20260101000000000_x.commit")
    assert content == f"writer {winners[0].split()[1]}".encode()


def parts_file(rows: int = 40_000) -> pa.Table:
    """A table for ranged reads: several row groups (at 8,192 rows), a dictionary-encoded
    column, a struct and a list column."""
    return pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "city": pa.array([("oslo", "lima", "pune")[i % 3] for i in range(rows)]),
        "v": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        "st": pa.array([{"x": i, "y": f"y{i}"} for i in range(rows)]),
        "tags": pa.array([[f"t{i % 7}"] * (i % 3) for i in range(rows)]),
        "pad": pa.array([f"padding-{i:012d}" for i in range(rows)]),
    })


def write_parts_file(storage: Storage, rel: str, table: pa.Table,
                     **kwargs: object) -> bytes:
    """``table`` written as one parquet file under ``rel`` (row groups of 8,192 rows,
    dictionary encoding for ``city`` only); its bytes."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=8192, use_dictionary=["city"], **kwargs)
    data = sink.getvalue().to_pybytes()
    storage.write_new(rel, data)
    return data


def check_ranged_reads(storage: Storage) -> None:
    """A parquet file read in parts (:class:`~engine.storage.RangedInput`) gives the rows a
    read of its whole bytes gives, for a column with a dictionary page, a struct, a nested
    field, a list, some row groups; a file read again is sent none of its footer; a file
    replaced between its footer and its chunks raises FileChangedError, and a new open reads
    the new file whole and right, not with the old version's footer."""
    import pyarrow.parquet as pq

    from engine.errors import FileChangedError
    from engine.format.base_file import chunk_ranges, parquet_file, read_base_file, read_row_groups
    from engine.storage import RangedInput
    from engine.storage.ranged import HOLE

    table = parts_file()
    data = write_parts_file(storage, "p/f.parquet", table)
    whole = pq.ParquetFile(pa.BufferReader(data))
    assert whole.metadata.num_row_groups == 5
    for columns in (["city"], ["v"], ["st"], ["st.x"], ["tags"], ["city", "pad"], None):
        with storage.open_input("p/f.parquet", whole=False) as source:
            assert isinstance(source, RangedInput)
            with parquet_file(source) as file:
                got = read_row_groups(file, source, None, columns, True)
        assert got.equals(whole.read(columns=columns)), columns
    # read again: the footer kept of this version serves, the store sends none of it
    # (If-None-Match answered "not modified"; on Azure the HEAD's ETag matched)
    with storage.open_input("p/f.parquet", whole=False) as source:
        assert (source.requests, source.fetched) == (1, 0)
        with parquet_file(source) as file:
            got = read_row_groups(file, source, None, ["v"], True)
    assert got.equals(whole.read(columns=["v"]))
    needed = sum(end - start for start, end in chunk_ranges(whole.metadata, None, ["v"]))
    assert needed <= source.fetched < needed + 5 * HOLE
    with storage.open_input("p/f.parquet", whole=False) as source, parquet_file(source) as file:
        got = read_row_groups(file, source, [1, 3], ["v", "st.y"], True)
    assert got.equals(whole.read_row_groups([1, 3], columns=["v", "st.y"]))
    with storage.open_input("p/f.parquet", whole=False) as source:
        assert read_base_file(source, columns=["v"], filters=pa.compute.field("id") < 5) \
            .column("v").to_pylist() == [0.0, 0.5, 1.0, 1.5, 2.0]

    # replaced after the footer was read: an error, never the old footer over new chunks
    other = parts_file(30_000).set_column(2, "v", pa.array([-1.0] * 30_000))
    with storage.open_input("p/f.parquet", whole=False) as source, parquet_file(source) as file:
        storage.delete("p/f.parquet")
        write_parts_file(storage, "p/f.parquet", other, compression="gzip")
        try:
            read_row_groups(file, source, None, ["v"], True)
        except FileChangedError as exc:
            assert "p/f.parquet" in str(exc) and "changed" in str(exc)
        else:
            raise AssertionError("a replaced file was read without an error")
    # the footer kept of the old version is not used for the new one
    with storage.open_input("p/f.parquet", whole=False) as source:
        assert source.fetched > 0
        assert read_base_file(source, columns=["v"]).column("v").to_pylist() == [-1.0] * 30_000


def base_file_bytes(storage: Storage, slices: Sequence[FileSlice],
                    columns_of: Callable[[FileSlice], Sequence[str]]) -> tuple[int, int]:
    """Of the base files of ``slices``: the bytes a read of ``columns_of(slice)`` needs (the
    chunks of those columns and the footer, from each file's own metadata) and the files'
    whole sizes."""
    needed = whole = 0
    for slc in slices:
        assert slc.base_file is not None
        data = storage.read(slc.base_file.path)
        metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
        needed += sum(e - s for s, e in chunk_ranges(metadata, None, list(columns_of(slc))))
        needed += int.from_bytes(data[-8:-4], "little") + 8  # the footer and its length
        whole += len(data)
    return needed, whole
