"""Metadata-table files as records: base HFiles and log files of ``MetadataRecord``s.

The byte formats are :mod:`engine.format.hfile` and :mod:`engine.format.log_format`; the
values are :mod:`engine.metadata.records`. Base files carry their own name in
``_hoodie_file_name``, a bloom filter of their keys and the schema with meta fields; log
files hold one HFile data block (headers SCHEMA, INSTANT_TIME), deletes as delete blocks.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from engine.format.hfile import (
    DEFAULT_BLOCK_SIZE,
    GZ_LEVEL,
    Cells,
    HFileReader,
    row_order,
    write_hudi_base_hfile,
)
from engine.format.log_block import BlockType, HeaderKey, iter_blocks
from engine.format.log_format import (
    decode_hfile_data_block,
    encode_hfile_data_block,
    encode_initial_log_block,
    encode_metadata_delete_block,
)
from engine.metadata.keys import RECORD_INDEX
from engine.metadata.records import (
    ColumnStats,
    MetadataRecord,
    RecordIndexInfo,
    decode_metadata_value,
    encode_metadata_value,
    with_value_type,
)
from engine.metadata.schema import metadata_schema_json
from engine.metadata.update import SharedUpserts

RECORD_INDEX_BLOCK_SIZE = 4 * 1024
"""HFile data block size of the ``record_index`` partition's files (base HFiles and log
blocks), where Hudi writes ``hoodie.hfile.block.size`` (1 MB; Hudi documents it as "lower
values ... faster lookup times"). A lookup reads, inflates and walks the one block that may
hold a key: ~15,000 entries in a 1 MB block, ~45 in 4 KB. A batch of 5,000 keys into a
group of 1M entries took 0.76 s at 4 KB, 1.3 s at 8 KB, 3.0 s at 64 KB (same run,
``docs/benchmarks.md``), so a batch's lookups stay near flat as the table grows; the files
are ~2.4x larger than at 64 KB. Every HFile reader takes block sizes from the block index.
Other partitions keep 1 MB: hudi-rs reads the ``files`` partition, whose bytes we keep as
Java writes them."""


RECORD_INDEX_GZ_LEVEL = 1
"""DEFLATE level of the ``record_index`` partition's HFile blocks. Java writes level 6
(Hadoop's zlib default); the record index is the MDT's bulk (a million entries are ~21,000
blocks of 4 KB, every one deflated at each write and MDT compaction), and level 1 deflates
them in ~0.6 of the CPU for ~2% more bytes (``docs/benchmarks.md``), and at level 1 the
blocks deflate through ISA-L (:data:`engine.format.hfile.FAST_LEVELS`), in ~0.4 of zlib's level
1 CPU for ~2% fewer bytes. The format is the same (one gzip member per block): every reader
inflates any level alike. Other partitions keep Java's level, and Java's bytes."""


def block_size(partition: str) -> int:
    """The HFile data block size of an MDT partition's files."""
    return RECORD_INDEX_BLOCK_SIZE if partition == RECORD_INDEX.name else DEFAULT_BLOCK_SIZE


def gz_level(partition: str) -> int:
    """The DEFLATE level of an MDT partition's HFile blocks."""
    return RECORD_INDEX_GZ_LEVEL if partition == RECORD_INDEX.name else GZ_LEVEL


def _in_layout(record: MetadataRecord, value_types: bool) -> MetadataRecord:
    """``record`` as a file of the layout ``value_types`` holds it: on table version 9
    every column / partition stats record in the V2 layout (never a V1 record in a v9
    file, which Java 1.1 would read with the table's index version), else as it is."""
    if value_types and isinstance(record.payload, ColumnStats):
        return record._replace(payload=with_value_type(record.payload))
    return record


def _cells(records: Sequence[MetadataRecord], file_name: str | None,
           value_types: bool = False, shared: Sequence[SharedUpserts] = ()) -> Cells:
    """(key, Avro value) per record, sorted by key bytes (stable: equal keys keep their
    order, ``records`` before ``shared``), as Arrow arrays. A value does not hold its key (it
    is written as ""), so records sharing one payload object — every record-index entry of a
    file group — share one encoding: it is computed once. The records are read by C-level
    iteration (a record is a tuple), no Python step per record; ``shared`` keys are
    never records at all (one encoding per chunk, its keys taken as they are). The values are
    taken once, in key order."""
    n = len(records)
    keys = list(map(operator.itemgetter(0), records))
    kinds = np.fromiter(map(operator.itemgetter(1), records), dtype=np.int64, count=n)
    if n and (kinds.min() < 0 or kinds.max() >= 16):
        raise ValueError(f"metadata record type outside 0..15: {kinds.min()}..{kinds.max()}")
    payloads = np.fromiter(map(id, map(operator.itemgetter(2), records)), dtype=np.int64,
                           count=n)
    _, first, inverse = np.unique(payloads * 16 + kinds, return_index=True,
                                  return_inverse=True)
    distinct = [records[int(i)] for i in first] + [chunk.record for chunk in shared]
    encoded = pa.array([encode_metadata_value(
        _in_layout(record, value_types)._replace(file_name=file_name), value_types)
        for record in distinct], pa.large_binary())
    which = [inverse.reshape(-1)] + [np.full(len(chunk.keys), len(first) + c, np.int64)
                                      for c, chunk in enumerate(shared)]
    rows = pa.concat_arrays([pa.array(keys, pa.large_string()).cast(pa.large_binary())]
                            + [chunk.keys.cast(pa.large_binary()) for chunk in shared])
    order = row_order(rows)
    return Cells(rows.take(pa.array(order)),
                 encoded.take(pa.array(np.concatenate(which)[order], pa.int64())))


def base_file_bytes(records: Sequence[MetadataRecord], name: str, partition: str = "", *,
                    value_types: bool = False) -> bytes:
    """A base HFile of MDT ``partition`` holding ``records`` (unique keys), named ``name``;
    ``value_types``: in Hudi 1.1's schema and stats layout (table version 9,
    :attr:`engine.timeline.version.TableVersion.column_stats_value_types`)."""
    return write_hudi_base_hfile(_cells(records, name, value_types),
                                 metadata_schema_json(value_types),
                                 block_size=block_size(partition), level=gz_level(partition))


def log_file_bytes(records: Sequence[MetadataRecord], instant_time: str, *,
                   deletes: Sequence[str] = (), partition: str = "",
                   value_types: bool = False,
                   shared: Sequence[SharedUpserts] = ()) -> bytes:
    """A log file written at ``instant_time``: one HFile data block with ``records`` and the
    ``shared`` upserts (if any), then one delete block removing ``deletes`` from MDT
    ``partition`` (if any); ``value_types`` as :func:`base_file_bytes`."""
    schema = metadata_schema_json(value_types)
    parts = []
    if records or shared or not deletes:
        parts.append(encode_hfile_data_block(_cells(records, None, value_types, shared), schema,
                                             instant_time, block_size=block_size(partition),
                                             level=gz_level(partition)))
    if deletes:
        parts.append(encode_metadata_delete_block(sorted(deletes), partition, instant_time,
                                                  schema))
    return b"".join(parts)


def init_log_file(instant_time: str) -> bytes:
    """The 80-byte initial log file every MDT file group starts with."""
    return encode_initial_log_block(instant_time)


class CellDecoder:
    """:func:`~engine.metadata.records.decode_metadata_value` that decodes each distinct
    record-index value once: every entry of a data file group carries the same value bytes,
    and a fastavro decode of the metadata union costs ~100 us (a batch looks up 50,000
    keys). Other payloads (mutable file listings, per-file statistics) decode every time.
    (Record-index values are the same bytes under Hudi 1.0's and 1.1's schemas, so the
    memo holds across files of either.)"""

    MEMO_SIZE = 4096

    def __init__(self) -> None:
        self._memo: dict[bytes, MetadataRecord] = {}

    def __call__(self, row: bytes, value: bytes, schema: str | None = None) -> MetadataRecord:
        """Decode one cell of a file whose writer schema is ``schema`` (None: Hudi 1.0's)."""
        known = self._memo.get(value)
        if known is not None:
            return MetadataRecord(row.decode("utf-8"), known.type, known.payload,
                                  known.file_name)
        record = decode_metadata_value(row, value, schema)
        if isinstance(record.payload, RecordIndexInfo) and len(self._memo) < self.MEMO_SIZE:
            self._memo[value] = record
        return record


def hfile_schema(reader: HFileReader) -> str | None:
    """The record schema an MDT HFile (a base file, or the HFile of a log block) was
    written with: its file info ``schema`` (None when absent: Hudi 1.0's is assumed)."""
    raw = reader.file_info.get("schema")
    return raw.decode("utf-8") if raw else None


def block_schema(header: Mapping[HeaderKey, str]) -> str | None:
    """The record schema of an MDT log block: its ``SCHEMA`` header (None when absent)."""
    return header.get(HeaderKey.SCHEMA) or None


def read_base_file(data: bytes) -> list[MetadataRecord]:
    """The records of a base HFile, in key order."""
    decode = CellDecoder()
    reader = HFileReader(data)
    schema = hfile_schema(reader)
    return [decode(row, value, schema) for row, value in reader.cells()]


def read_log_file(data: bytes) -> Iterator[tuple[str, MetadataRecord | None]]:
    """(key, record) in log order; a delete-block entry gives (key, None). (A lookup of some
    keys reads their cells only: :func:`engine.metadata.reader.slice_cells`.)"""
    from engine.format.delete_block import decode_delete_block

    decode = CellDecoder()
    for block in iter_blocks(data):
        if block.block_type is BlockType.HFILE_DATA:
            schema = block_schema(block.header)
            for row, value in decode_hfile_data_block(block):
                record = decode(row, value, schema)
                yield record.key, record
        elif block.block_type is BlockType.DELETE:
            for deleted in decode_delete_block(block):
                yield str(deleted.record_key), None
