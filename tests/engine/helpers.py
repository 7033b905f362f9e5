"""Helpers shared by the engine's test modules: the random workload of the differential tests
(``test_differential``, ``test_services_differential``), Java's hash definitions written out
(``test_bucket``, ``test_keygen``), a Parquet footer check (``test_base_file``,
``test_log_format``), where a key lives per the decoded ``record_index`` and per hudi-rs
(the record index's tests), and a writer that dies between its MDT deltacommit and its data
commit (``test_metadata``, ``test_record_index``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import COMMIT_TIME, Oracle, hudi_rs_read

PARTITIONS = ["north", "south", "east/west", ".."]
DATA_COLUMNS = ["key", "ts", "region", "amount", "note"]
COLUMNS = [*DATA_COLUMNS, COMMIT_TIME]
"""What a differential test compares: the data columns and the commit time."""
SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("region", pa.string()),
                    ("amount", pa.float64()), ("note", pa.string())])


def random_batch(rng: random.Random, oracle: Oracle, counter: list[int],
                 size: int, *, new_only: bool = False) -> list[dict[str, Any]]:
    """``size`` rows: about half updates of keys the oracle holds (most in their partition),
    the rest new keys (``counter`` numbers them); ts in 0..50, so some updates lose."""
    batch = []
    for _ in range(size):
        existing = list(oracle.rows)
        if existing and not new_only and rng.random() < 0.5:
            key = rng.choice(existing)
            region = oracle.rows[key]["region"] if rng.random() < 0.9 else \
                rng.choice(PARTITIONS)
        else:
            counter[0] += 1
            key = f"k{counter[0]:05d}-é"
            region = rng.choice(PARTITIONS)
        batch.append({"key": key, "ts": rng.randint(0, 50), "region": region,
                      "amount": rng.random() * 100 if rng.random() > 0.1 else None,
                      "note": rng.choice(["", "x", "ünï", None, "a,b:c"])})
    return batch


def ref_string_hash(s: str) -> int:
    """Java String.hashCode from the definition: s[0]*31^(n-1) + ... over UTF-16 units."""
    units: list[int] = []
    for ch in s:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    h = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


def ref_bucket(values: list[str | None], num_buckets: int) -> int:
    """(Arrays.asList(values).hashCode() & Integer.MAX_VALUE) % numBuckets."""
    h = 1
    for v in values:
        h = (31 * h + (0 if v is None else ref_string_hash(v))) % 2**32
    return (h & 0x7FFFFFFF) % num_buckets


def dictionary_encoded(path: Path | str | pa.NativeFile) -> dict[str, bool]:
    """Whether each column chunk of a Parquet file is dictionary encoded, from its footer."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    return {meta.column(i).path_in_schema: "RLE_DICTIONARY" in meta.column(i).encodings
            for i in range(meta.num_columns)}


def record_index_entries(table: Any) -> dict[str, tuple[str, str]]:
    """key → (partition, file id) of the merged ``record_index`` of ``table`` (an
    ``engine.Table``), decoded from the latest slice of every MDT file group; a key found
    twice fails the test."""
    from engine.metadata.reader import read_slice
    from engine.metadata.record_index import group_slices
    from engine.metadata.records import RecordIndexInfo
    from engine.metadata.table import MetadataTable
    from engine.timeline.active import Timeline

    timeline = Timeline.load(table.storage, table.config)
    mdt = MetadataTable(table.storage, table.config)
    out: dict[str, tuple[str, str]] = {}
    for piece in group_slices(table.storage, timeline):
        for key, record in read_slice(mdt.storage, piece).items():
            info = record.payload
            assert isinstance(info, RecordIndexInfo)
            assert key not in out, f"key {key} in two record_index groups"
            out[key] = (info.partition_name or "", info.location_file_id)
    return out


def hudi_rs_locations(path: str) -> dict[str, tuple[str, str]]:
    """key → (partition, file id) as hudi-rs reads the table's data files: a base file's
    name starts with its file id and an ``_``; a log record carries the file id itself. A key
    read twice fails the test."""
    rows = hudi_rs_read(path)
    if not rows.num_rows:
        return {}
    out: dict[str, tuple[str, str]] = {}
    for key, part, name in zip(rows.column("_hoodie_record_key").to_pylist(),
                               rows.column("_hoodie_partition_path").to_pylist(),
                               rows.column("_hoodie_file_name").to_pylist(), strict=True):
        assert key not in out, f"key {key} stored twice"
        out[key] = (part, name.split("_", 1)[0] if name.endswith(".parquet") else name)
    return out


class WriterDied(Exception):
    """Raised where :func:`writer_dies_at_the_data_commit`'s writer dies."""


@contextmanager
def writer_dies_at_the_data_commit() -> Iterator[None]:
    """The write inside the ``with`` dies between its MDT deltacommit and its data commit:
    the completed data instant is never written, and, as a dead process would, it rolls
    nothing back (its abort only stops its heartbeat). Raises unless it died; every patch is
    undone on leaving, whatever else the test patched."""
    from engine.metadata.table import METADATA_FOLDER
    from engine.timeline.active import Timeline
    from engine.write.write_client import WriteClient

    original = Timeline._write

    def dies_at_the_data_commit(self: Timeline, instant, content, *, exclusive):  # type: ignore[no-untyped-def]
        if instant.is_completed and not self.storage.base_path.endswith(METADATA_FOLDER):
            raise WriterDied()
        return original(self, instant, content, exclusive=exclusive)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(WriterDied):
        patch.setattr(Timeline, "_write", dies_at_the_data_commit)
        patch.setattr(WriteClient, "abort",
                      lambda self, instant: self._stop_heartbeat(instant.requested_time))
        yield
