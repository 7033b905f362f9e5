"""HFile v3, the subset Hudi 1.0 writes: metadata-table base files and log-block payloads.

Layout (``docs`` ``hudi-metadata-table.md`` §1; HBase 2.4 ``HFileWriterImpl``)::

    [DATA block]* [META block]* [ROOT_INDEX data] [ROOT_INDEX meta] [FILE_INFO] [trailer 4096]

Every block has a 33-byte header (magic, on-disk size without header, uncompressed size,
previous block of the same type, checksum type 2 = CRC32C, 16384 bytes per checksum, on-disk
data size with header), then its payload (one gzip member for ``GZ``, raw for ``NONE``), then
one big-endian CRC32C per 16384 bytes of header + payload. A data block is a run of cells
``keyLen: i32 | valueLen: i32 | key | value | mvcc vint (00)`` whose key is an HBase KeyValue key
(``rowLen: i16 | row | 00 | timestamp LATEST | type 04``). Blocks are cut the HBase way (a new
block starts before a cell with a new row once the current one holds ``block_size`` raw bytes),
and the single-level root index uses HBase's ``getMidpoint`` fake keys, so that the output is
byte-identical to what Spark writes for the same cells.

The writer also works around the hudi-rs 0.5.0 gzip bug (pitfall 7: it mis-sizes the checksum
area when ``33 + len(payload)`` falls in ``(16384·n - 4·n, 16384·n]``): such a block is
recompressed (another level, then extra DEFLATE flush points) until it falls outside.

Pure bytes in, bytes out; no I/O; safe on executors.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from isal import isal_zlib

from engine.errors import CorruptTableError
from engine.format import hfile_cells
from engine.format.bloom import DEFAULT_FPP, DEFAULT_MAX_ENTRIES, DEFAULT_NUM_ENTRIES, BloomFilter
from engine.format.hfile_cells import CellFramingError, CellScan, KeyIndex

__all__ = [
    "COMPARATOR",
    "DEFAULT_BLOCK_SIZE",
    "Cells",
    "HFileError",
    "HFileReader",
    "cell_arrays",
    "gzip_boundary_hazard",
    "gzip_member",
    "key_value_key",
    "row_order",
    "write_hfile",
    "write_hudi_base_hfile",
]

DEFAULT_BLOCK_SIZE = 1 << 20
"""``hoodie.hfile.block.size`` default and the log-block HFile block size."""
COMPARATOR = b"org.apache.hudi.io.storage.HoodieHBaseKVComparator"
"""Trailer ``comparatorClassName`` of every HFile Hudi 1.0 writes."""

RANGE_GAP = 16 * 1024
"""Bytes between two data blocks a lookup wants that it reads rather than start a new read."""
RANGE_LIMIT = 4 << 20
"""The most bytes one read of several data blocks fetches."""

_HEADER = struct.Struct(">8siiqbii")
_HEADER_SIZE = 33
_BYTES_PER_CHECKSUM = 16384
_CRC32C = 2
_TRAILER_SIZE = 4096
_TRAILER_MAGIC = b'TRABLK"$'
_VERSION = bytes.fromhex("03000003")  # minor 3 << 24 | major 3
_DATA, _META, _ROOT, _INFO = b"DATABLK*", b"METABLKc", b"IDXROOT2", b"FILEINF2"
_CODECS = {"GZ": 1, "NONE": 2}
_GZIP_HEADER = bytes.fromhex("1f8b0800000000000000")
_LATEST_TS = b"\x7f\xff\xff\xff\xff\xff\xff\xff"
_PUT, _FIRST_ON_ROW = 4, 0xFF
_I32, _I64, _U32 = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">I")
_CELL_HEAD = struct.Struct(">ii")
_ROW_LENGTH = struct.Struct(">H")
_INDEX_HEAD = struct.Struct(">qi")
_MAX_ROW = 32767
FAST_LEVELS = (1, 2, 3)
"""DEFLATE levels :func:`gzip_member` runs through ISA-L rather than zlib (zlib's bytes are
Java's only at level 6; ISA-L has levels 0-3, and its 0 is not zlib's stored 0)."""


class HFileError(CorruptTableError, ValueError):
    """An HFile cannot be parsed; the message names the block, offset or field at fault."""


# --------------------------------------------------------------------------------------------
# Small codecs: KeyValue keys, Hadoop vints, protobuf varints, gzip members, blocks
# --------------------------------------------------------------------------------------------


def key_value_key(row: bytes, key_type: int = _PUT) -> bytes:
    """The HBase KeyValue key Hudi writes for ``row``: empty family/qualifier, LATEST, Put."""
    if len(row) > _MAX_ROW:
        raise ValueError(f"row key of {len(row)} bytes exceeds HFile's limit of {_MAX_ROW}")
    return struct.pack(">h", len(row)) + row + b"\x00" + _LATEST_TS + bytes([key_type])


def _row_of(key: bytes) -> bytes:
    (length,) = struct.unpack_from(">h", key, 0)
    if length < 0 or 2 + length > len(key):
        raise HFileError(f"cell key of {len(key)} bytes has a bad row length {length}")
    return key[2 : 2 + length]


def _vint(value: int) -> bytes:
    """Hadoop ``WritableUtils.writeVLong``."""
    if -112 <= value <= 127:
        return struct.pack(">b", value)
    marker = -112
    if value < 0:
        value = ~value
        marker = -120
    size = (value.bit_length() + 7) // 8
    return struct.pack(">b", marker - size) + value.to_bytes(size, "big")


def _read_vint(data: bytes, pos: int) -> tuple[int, int]:
    first = struct.unpack_from(">b", data, pos)[0]
    if first >= -112:
        return first, pos + 1
    negative = first < -120
    size = (-120 - first) if negative else (-112 - first)
    if pos + 1 + size > len(data):
        raise HFileError(f"vint at {pos} runs past its block")
    value = int.from_bytes(data[pos + 1 : pos + 1 + size], "big")
    return (~value if negative else value), pos + 1 + size


def _pb_varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # negative uint64 -> two's complement, 10 bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_pb_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise HFileError("malformed protobuf varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _pb_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, varint or bytes) of a protobuf message (wire types 0 and 2 only)."""
    pos = 0
    while pos < len(data):
        tag, pos = _read_pb_varint(data, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = _read_pb_varint(data, pos)
            yield tag >> 3, value
        elif wire == 2:
            length, pos = _read_pb_varint(data, pos)
            if pos + length > len(data):
                raise HFileError("protobuf field runs past its message")
            yield tag >> 3, data[pos : pos + length]
            pos += length
        else:
            raise HFileError(f"unexpected protobuf wire type {wire}")


def _pb_bytes(field: int, value: bytes) -> bytes:
    return _pb_varint(field << 3 | 2) + _pb_varint(len(value)) + value


def gzip_member(data: bytes, level: int = 6, flush_points: int = 0) -> bytes:
    """One gzip member as HBase's GZ codec writes it (10-byte header, raw DEFLATE, CRC, size).

    Level 6 reproduces Java's output. Levels 1-3 (:data:`FAST_LEVELS`) deflate through
    ISA-L (``isal``), at its levels of the same numbers: ~2.5x zlib's level 1 speed on
    record-index blocks, for about as many bytes (the same format: any inflater reads it).
    ``flush_points`` > 0 inserts that many ``Z_SYNC_FLUSH`` points spread over the input
    (still one valid member, a few bytes longer): the last resort of the gzip-boundary
    mitigation.
    """
    if level in FAST_LEVELS and not flush_points:
        return _GZIP_HEADER + isal_zlib.compress(data, level, 31)[10:]
    if not flush_points:
        # zlib's own gzip framing in one call (the same DEFLATE stream, CRC and size), its
        # header's XFL and OS bytes set to HBase's zeros
        return _GZIP_HEADER + zlib.compress(data, level, 31)[10:]
    comp = zlib.compressobj(level, zlib.DEFLATED, -15)
    parts = [_GZIP_HEADER]
    step = max(1, len(data) // (flush_points + 1))
    pos = 0
    for _ in range(flush_points):
        parts.append(comp.compress(data[pos : pos + step]))
        parts.append(comp.flush(zlib.Z_SYNC_FLUSH))
        pos += step
    parts.append(comp.compress(data[pos:]))
    parts.append(comp.flush())
    parts.append(struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF))
    return b"".join(parts)


def gzip_boundary_hazard(payload_len: int) -> bool:
    """Whether a GZ block with this payload length trips hudi-rs 0.5.0 (pitfall 7).

    hudi-rs sizes the checksum area from ``33 + payload + checksums``; it reads 4 bytes too
    few of the gzip member when ``33 + payload`` is in ``(16384·n - 4·n, 16384·n]``.
    """
    size = _HEADER_SIZE + payload_len
    n = -(-size // _BYTES_PER_CHECKSUM)
    return _BYTES_PER_CHECKSUM * n - 4 * n < size <= _BYTES_PER_CHECKSUM * n


def _safe_gzip(raw: bytes, level: int = 6) -> bytes:
    """``gzip_member(raw, level)``, or if that lands in the hudi-rs window, a variant that
    does not."""
    payload = gzip_member(raw, level)
    if not gzip_boundary_hazard(len(payload)):
        return payload
    for other in (5, 7, 4, 8, 3, 9, 2, 1):
        payload = gzip_member(raw, other)
        if not gzip_boundary_hazard(len(payload)):
            return payload
    # Incompressible data comes out the same size at every level; each flush point adds bytes.
    flushes = 1
    while gzip_boundary_hazard(len(payload := gzip_member(raw, 6, flushes))):
        flushes += 1
    return payload


def _block(magic: bytes, raw: bytes, prev: int, codec: int,
           payload: bytes | None = None) -> bytes:
    """One complete on-disk block: header, payload, CRC32C checksums (``payload``: ``raw``
    compressed already)."""
    if payload is None:
        payload = _safe_gzip(raw) if codec == _CODECS["GZ"] else raw
    with_header = _HEADER_SIZE + len(payload)
    n_sums = -(-with_header // _BYTES_PER_CHECKSUM)
    body = _HEADER.pack(magic, len(payload) + 4 * n_sums, len(raw), prev, _CRC32C,
                        _BYTES_PER_CHECKSUM, with_header) + payload
    if n_sums == 1:  # a small block: one checksum
        return body + _U32.pack(crc32c.crc32c(body))
    sums = b"".join(
        struct.pack(">I", crc32c.crc32c(body[i : i + _BYTES_PER_CHECKSUM]))
        for i in range(0, with_header, _BYTES_PER_CHECKSUM)
    )
    return body + sums


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


def _midpoint_row(left: bytes, right: bytes) -> bytes:
    """HBase ``getMinimumMidpointArray``: a short row in ``(left, right]``."""
    limit = min(len(left), len(right))
    d = 0
    while d < limit and left[d] == right[d]:
        d += 1
    if d >= limit:
        return right[: d + 1]
    if left[d] < 0xFF and left[d] + 1 < right[d]:
        return left[:d] + bytes([left[d] + 1])
    return right[: d + 1]


class Cells(NamedTuple):
    """Cells as two Arrow arrays of equal length: row keys (sorted by bytes) and values.
    What :func:`write_hfile` takes besides (row, value) tuples: a writer with many cells
    (a record index of a million keys) builds them without a Python object per cell."""

    rows: pa.Array
    values: pa.Array


def cell_arrays(cells: Sequence[tuple[bytes, bytes]] | Cells) -> Cells:
    """``cells`` as :class:`Cells` of two ``large_binary`` arrays (one chunk each)."""
    if isinstance(cells, Cells):
        arrays = [cells.rows, cells.values]
    else:
        arrays = [pa.array([row for row, _ in cells], pa.large_binary()),
                  pa.array([value for _, value in cells], pa.large_binary())]
    out: list[pa.Array] = []
    for array in arrays:
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if not array.type.equals(pa.large_binary()):
            array = array.cast(pa.large_binary())
        out.append(array)
    if len(out[0]) != len(out[1]):
        raise ValueError(f"{len(out[0])} rows but {len(out[1])} values")
    if out[0].null_count or out[1].null_count:
        raise ValueError("cells hold a null row or value")
    return Cells(out[0], out[1])


def _offsets(array: pa.Array) -> np.ndarray:
    """The ``n + 1`` value offsets of a ``large_binary`` array (int64)."""
    raw = np.frombuffer(array.buffers()[1], dtype=np.int64)
    return raw[array.offset : array.offset + len(array) + 1]


_WINDOW = 8
"""Bytes of each row compared as one unsigned 64-bit number by :func:`row_order`."""


def row_order(rows: pa.Array) -> np.ndarray:
    """The stable ascending order of ``rows`` (``large_binary``, no nulls) by unsigned bytes:
    ``pc.sort_indices(rows)``, in about half its time. The 8 bytes of each row that follow
    the prefix every row shares (that of the least and the greatest row; zero-padded) are
    sorted as numbers, and only rows tied on those bytes are compared whole. Equal windows
    order rows as their bytes do (a shorter row pads with zeros and is a prefix of the other,
    so it sorts first either way), so the tied rows, sorted together, stay in their place."""
    n = len(rows)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    least, greatest = (s.as_py() for s in pc.min_max(rows).values())
    shared = 0
    limit = min(len(least), len(greatest))
    while shared < limit and least[shared] == greatest[shared]:
        shared += 1
    offsets = _offsets(rows)
    lengths = np.diff(offsets)
    data = np.frombuffer(rows.buffers()[2] or b"\x00", np.uint8)
    if lengths.min() == lengths.max() >= shared + _WINDOW:  # one length: a matrix view
        width = int(lengths[0])
        window = data[offsets[0] : offsets[-1]].reshape(n, width)[:, shared : shared + _WINDOW]
    else:
        span = np.arange(_WINDOW)
        at = np.minimum((offsets[:-1] + shared)[:, None] + span, len(data) - 1)
        window = np.where(span < (lengths - shared)[:, None], data[at], 0).astype(np.uint8)
    numbers = np.ascontiguousarray(window).view(">u8").reshape(n).astype(np.uint64)
    order = np.argsort(numbers)
    ranked = numbers[order]
    tie = ranked[1:] == ranked[:-1]
    if tie.any():  # whole rows decide, in input order among equal ones (stable)
        tied = np.zeros(n, dtype=bool)
        tied[1:] |= tie
        tied[:-1] |= tie
        at = np.flatnonzero(tied)
        which = np.sort(order[at])
        order[at] = which[np.asarray(pc.sort_indices(rows.take(pa.array(which))))]
    return order


def _check_order(rows: pa.Array, allow_duplicates: bool) -> None:
    """Raise ``ValueError`` unless ``rows`` ascend by bytes (strictly unless
    ``allow_duplicates``), or when a row is longer than HFile allows."""
    n = len(rows)
    if n and pc.max(pc.binary_length(rows)).as_py() > _MAX_ROW:
        i = int(np.argmax(np.diff(_offsets(rows))))
        raise ValueError(f"row key of {len(rows[i].as_py())} bytes exceeds HFile's limit of "
                         f"{_MAX_ROW}")
    if n < 2:
        return
    before, after = rows.slice(0, n - 1), rows.slice(1)
    bad = pc.less(after, before) if allow_duplicates else pc.less_equal(after, before)
    if pc.any(bad).as_py():
        i = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0]) + 1
        prev, row = rows[i - 1].as_py(), rows[i].as_py()
        what = "duplicate" if row == prev else "unsorted"
        raise ValueError(f"{what} row key at cell {i}: {row!r} after {prev!r}")


_CELL_MIDDLE = b"\x00" + _LATEST_TS + bytes([_PUT])


def _cell_bytes(cells: Cells) -> tuple[pa.Buffer, np.ndarray]:
    """Every cell encoded (``keyLen | valueLen | key | value | mvcc 00``, the key a Put at
    LATEST), back to back, and the ``n + 1`` cell offsets into those bytes: one Arrow
    element-wise join over the whole file instead of a Python step per cell."""
    rows, values = cells
    n = len(rows)
    row_len = np.diff(_offsets(rows))
    head = np.empty((n, 10), dtype=np.uint8)
    head[:, 0:4] = (row_len + 12).astype(">i4").view(np.uint8).reshape(n, 4)
    head[:, 4:8] = np.diff(_offsets(values)).astype(">i4").view(np.uint8).reshape(n, 4)
    head[:, 8:10] = row_len.astype(">i2").view(np.uint8).reshape(n, 2)
    heads = pa.Array.from_buffers(pa.large_binary(), n, [
        None, pa.py_buffer(np.arange(0, 10 * n + 1, 10, dtype=np.int64)),
        pa.py_buffer(head)])
    joined = pc.binary_join_element_wise(
        heads, rows, pa.scalar(_CELL_MIDDLE, pa.large_binary()), values,
        pa.scalar(b"\x00", pa.large_binary()), pa.scalar(b"", pa.large_binary()))
    offsets = _offsets(joined)
    return joined.buffers()[2], offsets - offsets[0] if n else np.zeros(1, np.int64)


def _cut_blocks(
    offsets: np.ndarray, rows: pa.Array, block_size: int, allow_duplicates: bool
) -> list[tuple[int, int]]:
    """[start, end) cell ranges of the data blocks (HBase ``checkBlockBoundary``: a block
    ends before the first cell with a new row once it holds ``block_size`` bytes of cells);
    ``offsets``: the ``n + 1`` cell offsets."""
    n = len(offsets) - 1
    if n <= 0:
        return []
    if allow_duplicates and n > 1:  # a block never starts inside a run of equal rows
        starts_row = np.concatenate([[True], pc.not_equal(
            rows.slice(1), rows.slice(0, n - 1)).to_numpy(zero_copy_only=False)])
        row_starts = np.flatnonzero(starts_row)
    else:
        row_starts = None
    ranges: list[tuple[int, int]] = []
    start = 0
    at_list = offsets.tolist()  # bisect over a list: no numpy call per block
    row_list = row_starts.tolist() if row_starts is not None else None
    search = bisect.bisect_left
    while True:
        cut = max(start + 1, search(at_list, at_list[start] + block_size))
        if row_list is not None and cut < n:
            at = search(row_list, cut)
            cut = row_list[at] if at < len(row_list) else n
        if cut >= n:
            ranges.append((start, n))
            return ranges
        ranges.append((start, cut))
        start = cut


GZ_LEVEL = 6
"""DEFLATE level of GZ blocks: Java's (Hadoop's zlib default), so the bytes are Java's."""
PARALLEL_BLOCKS = 256
"""Data blocks from which :func:`write_hfile` compresses in two threads (zlib releases the
GIL while it deflates: a record index of a million keys is ~21,000 blocks of 4 KB)."""


def _compressed(raws: list[bytes], level: int) -> list[bytes]:
    """``_safe_gzip`` of each raw block, in order; two threads for many blocks."""
    if len(raws) < PARALLEL_BLOCKS:
        return [_safe_gzip(raw, level) for raw in raws]
    half = (len(raws) + 1) // 2
    with ThreadPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(lambda part: [_safe_gzip(raw, level) for raw in part],
                              [raws[:half], raws[half:]]))
    return parts[0] + parts[1]


def write_hfile(
    cells: Sequence[tuple[bytes, bytes]] | Cells,
    *,
    file_info: Mapping[str, bytes] | None = None,
    meta_blocks: Sequence[tuple[str, bytes]] = (),
    compression: str = "GZ",
    block_size: int = DEFAULT_BLOCK_SIZE,
    allow_duplicates: bool = False,
    level: int = GZ_LEVEL,
) -> bytes:
    """A complete HFile v3 holding ``cells`` (row key, value), as Hudi 1.0 / HBase 2.4 writes it.

    ``cells`` ((row, value) pairs or :class:`Cells`) must be sorted by row bytes
    (unsigned); equal rows raise ``ValueError`` unless
    ``allow_duplicates`` (log-block HFiles keep them in arrival order). ``file_info`` entries
    are merged over the standard keys this function computes (``KEY_VALUE_VERSION``,
    ``MAX_MEMSTORE_TS_KEY``, ``hfile.AVG_KEY_LEN``, ``hfile.AVG_VALUE_LEN``,
    ``hfile.CREATE_TIME_TS``, ``hfile.LASTKEY``); entries are written sorted by key bytes.
    ``meta_blocks`` are (name, raw content), written sorted by name. ``compression`` is
    ``"GZ"`` (Hudi's default) or ``"NONE"``; ``level``: the data blocks' DEFLATE level
    (:data:`GZ_LEVEL`, Java's, gives Java's bytes; any level is read the same way).
    """
    codec = _CODECS.get(compression.upper())
    if codec is None:
        raise ValueError(f"compression must be one of {sorted(_CODECS)}, got {compression!r}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    cells = cell_arrays(cells)
    _check_order(cells.rows, allow_duplicates)
    data, starts = _cell_bytes(cells)
    whole = data.to_pybytes()
    out: list[bytes] = []
    offset = 0
    total_uncompressed = _TRAILER_SIZE
    index = bytearray()
    prev_data = -1
    ranges = _cut_blocks(starts, cells.rows, block_size, allow_duplicates)
    bounds = np.array(ranges, dtype=np.int64).reshape(-1, 2)
    cuts = starts[bounds].tolist()
    raws = [whole[begin:end] for begin, end in cuts]
    firsts = cells.rows.take(pa.array(bounds[:, 0])).to_pylist()
    lasts = cells.rows.take(pa.array(bounds[:, 1] - 1)).to_pylist()
    payloads = _compressed(raws, level) if codec == _CODECS["GZ"] else raws
    last_row = b""
    pack_entry = _INDEX_HEAD.pack
    for n, raw in enumerate(raws):
        block = _block(_DATA, raw, prev_data, codec, payloads[n])
        if n == 0:
            index_key = key_value_key(firsts[0])
        else:
            index_key = key_value_key(_midpoint_row(last_row, firsts[n]), _FIRST_ON_ROW)
        last_row = lasts[n]
        index += pack_entry(offset, len(block)) + _vint(len(index_key)) + index_key
        prev_data = offset
        out.append(block)
        offset += len(block)
        total_uncompressed += _HEADER_SIZE + len(raw)
    meta_index = bytearray()
    prev_meta = -1
    for name, content in sorted(meta_blocks, key=lambda m: m[0].encode()):
        block = _block(_META, content, prev_meta, codec)
        encoded = name.encode("utf-8")
        meta_index += _I64.pack(offset) + _I32.pack(len(block)) + _vint(len(encoded)) + encoded
        prev_meta = offset
        out.append(block)
        offset += len(block)
        total_uncompressed += _HEADER_SIZE + len(content)
    load_on_open = offset
    root = _block(_ROOT, bytes(index), -1, codec)
    meta_root = _block(_ROOT, bytes(meta_index), load_on_open, codec)
    total_uncompressed += _HEADER_SIZE + len(meta_index)
    info_raw = _file_info_bytes(cells, last_row, file_info)
    info = _block(_INFO, info_raw, -1, codec)
    total_uncompressed += _HEADER_SIZE + len(info_raw)
    out += [root, meta_root]
    info_offset = load_on_open + len(root) + len(meta_root)
    out.append(info)
    trailer = b"".join([
        _pb_varint(1 << 3) + _pb_varint(info_offset),
        _pb_varint(2 << 3) + _pb_varint(load_on_open),
        _pb_varint(3 << 3) + _pb_varint(len(index)),
        _pb_varint(4 << 3) + _pb_varint(total_uncompressed),
        _pb_varint(5 << 3) + _pb_varint(len(ranges)),
        _pb_varint(6 << 3) + _pb_varint(len(meta_blocks)),
        _pb_varint(7 << 3) + _pb_varint(len(cells.rows)),
        _pb_varint(8 << 3) + _pb_varint(1),
        _pb_varint(9 << 3) + _pb_varint(0 if len(cells.rows) else -1),
        _pb_varint(10 << 3) + _pb_varint(prev_data),
        _pb_bytes(11, COMPARATOR),
        _pb_varint(12 << 3) + _pb_varint(codec),
    ])
    head = _TRAILER_MAGIC + _pb_varint(len(trailer)) + trailer
    out.append(head + b"\x00" * (_TRAILER_SIZE - len(head) - len(_VERSION)) + _VERSION)
    return b"".join(out)


def write_hudi_base_hfile(
    cells: Sequence[tuple[bytes, bytes]] | Cells,
    schema: str,
    *,
    compression: str = "GZ",
    block_size: int = DEFAULT_BLOCK_SIZE,
    bloom_num_entries: int = DEFAULT_NUM_ENTRIES,
    bloom_fpp: float = DEFAULT_FPP,
    level: int = GZ_LEVEL,
) -> bytes:
    """A metadata-table base HFile as ``HoodieAvroHFileWriter`` writes it.

    ``cells`` (UTF-8 record key, Avro value) must be sorted with unique keys. Adds the meta
    block ``bloomFilter`` (Base64 text of a ``DYNAMIC_V0`` filter of the keys, in cell order)
    and the file info ``bloomFilterTypeCode``, ``minRecordKey``/``maxRecordKey`` (``""`` for
    an empty file) and ``schema`` (the MDT record schema JSON, with meta fields).
    """
    cells = cell_arrays(cells)
    rows = cells.rows
    bloom = BloomFilter.create(bloom_num_entries, bloom_fpp, DEFAULT_MAX_ENTRIES)
    bloom.add_many(rows)
    file_info = {
        "bloomFilterTypeCode": bloom.type_code.value.encode(),
        "minRecordKey": rows[0].as_py() if len(rows) else b"",
        "maxRecordKey": rows[-1].as_py() if len(rows) else b"",
        "schema": schema.encode("utf-8"),
    }
    return write_hfile(cells, file_info=file_info,
                       meta_blocks=[("bloomFilter", bloom.serialize().encode("ascii"))],
                       compression=compression, block_size=block_size, level=level)


def _file_info_bytes(cells: Cells, last_row: bytes, extra: Mapping[str, bytes] | None) -> bytes:
    n = len(cells.rows)
    key_total = int(_offsets(cells.rows)[-1] - _offsets(cells.rows)[0]) + 12 * n
    value_total = int(_offsets(cells.values)[-1] - _offsets(cells.values)[0])
    info: dict[bytes, bytes] = {
        b"KEY_VALUE_VERSION": _I32.pack(1),
        b"MAX_MEMSTORE_TS_KEY": _I64.pack(0),
        b"hfile.AVG_KEY_LEN": _I32.pack(key_total // n if n else 0),
        b"hfile.AVG_VALUE_LEN": _I32.pack(value_total // n if n else 0),
        b"hfile.CREATE_TIME_TS": _I64.pack(0),
    }
    if n:
        info[b"hfile.LASTKEY"] = key_value_key(last_row)
    for name, value in (extra or {}).items():
        info[name.encode("utf-8")] = bytes(value)
    proto = b"".join(
        _pb_bytes(1, _pb_bytes(1, k) + _pb_bytes(2, info[k])) for k in sorted(info)
    )
    return b"PBUF" + _pb_varint(len(proto)) + proto


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------


class _IndexEntry(NamedTuple):
    offset: int
    size: int  # on disk, header and checksums included
    key: bytes  # block index key (data) or name (meta)


class HFileReader:
    """Reads an HFile v3 (single- or multi-block, GZ or NONE, single-level index) from bytes.

    The trailer, both root indexes and the file info are parsed on construction; data blocks
    are decompressed when asked for. Malformed input raises :class:`HFileError`.
    Checksums are not verified (neither Hudi reader does) unless ``verify_checksums``.
    """

    def __init__(self, data: bytes, *, verify_checksums: bool = False) -> None:
        """Parse ``data`` (a whole HFile, offsets relative to its first byte)."""
        whole = bytes(data)
        self._init(len(whole), lambda offset, length: whole[offset : offset + length],
                   verify_checksums)

    @classmethod
    def from_ranges(cls, size: int, read_range: Callable[[int, int], bytes], *,
                    verify_checksums: bool = False) -> HFileReader:
        """A reader of a file of ``size`` bytes that fetches only what it needs through
        ``read_range(offset, length)``: the trailer and load-on-open section (root indexes
        and file info) at once, then each data or meta block when asked for (one range
        read each, its size from the block index)."""
        reader = cls.__new__(cls)
        reader._init(size, read_range, verify_checksums)
        return reader

    def _init(self, size: int, read_range: Callable[[int, int], bytes],
              verify_checksums: bool) -> None:
        self._size = size
        self._fetch = read_range
        self._tail_start = size
        self._tail = b""
        self._verify = verify_checksums
        try:
            self._open()
        except HFileError:
            raise
        except (struct.error, IndexError, ValueError, zlib.error) as exc:
            raise HFileError(f"malformed HFile: {exc}") from None

    def _read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer at the end of the file)."""
        if self._tail_start <= offset:
            start = offset - self._tail_start
            return self._tail[start : start + length]
        return self._fetch(offset, min(length, self._size - offset))

    def _open(self) -> None:
        if self._size < _TRAILER_SIZE:
            raise HFileError(f"file of {self._size} bytes is shorter than the 4096-byte trailer")
        trailer = self._fetch(self._size - _TRAILER_SIZE, _TRAILER_SIZE)
        if len(trailer) != _TRAILER_SIZE:
            raise HFileError(f"read {len(trailer)} trailer bytes of {_TRAILER_SIZE}")
        if trailer[:8] != _TRAILER_MAGIC:
            raise HFileError(f"bad trailer magic {trailer[:8]!r}")
        if trailer[-1] != 3:
            raise HFileError(f"HFile major version {trailer[-1]} is not 3")
        length, pos = _read_pb_varint(trailer, 8)
        fields = dict(_pb_fields(trailer[pos : pos + length]))

        def number(field: int, default: int) -> int:
            value = fields.get(field, default)
            if not isinstance(value, int):
                raise HFileError(f"trailer field {field} is not a varint")
            return value

        self.compression_codec = number(12, 1)
        if self.compression_codec not in _CODECS.values():
            raise HFileError(f"compression codec {self.compression_codec} is not GZ or NONE")
        levels = number(8, 1)
        if levels != 1:
            raise HFileError(f"{levels}-level data index is not supported")
        self.entry_count: int = number(7, 0)
        load_on_open = number(2, 0)
        data_count = number(5, 0)
        meta_count = number(6, 0)
        info_offset = number(1, 0)
        if not 0 <= load_on_open <= self._size - _TRAILER_SIZE:
            raise HFileError(f"load-on-open offset {load_on_open} is outside the file")
        # The root indexes and the file info sit between the blocks and the trailer: one read.
        self._tail = self._fetch(load_on_open, self._size - _TRAILER_SIZE - load_on_open) \
            + trailer
        self._tail_start = load_on_open
        root, end = self._read_block(load_on_open, _ROOT)
        self._offsets, self._sizes, self._rows = self._parse_data_index(root, data_count)
        meta_root, _ = self._read_block(end, _ROOT)
        self._meta = {e.key.decode("utf-8"): e for e in self._parse_index(
            meta_root, meta_count, "meta")}
        info, _ = self._read_block(info_offset, _INFO)
        self.file_info: dict[str, bytes] = self._parse_file_info(info)

    def _read_block(self, offset: int, magic: bytes, size_hint: int = _HEADER_SIZE,
                    data: bytes | None = None) -> tuple[bytes, int]:
        """Uncompressed data of the block at ``offset`` and the offset just past it
        (``size_hint``: its size on disk, header included, when an index gives it; ``data``:
        those bytes, when read already)."""
        if offset < 0 or offset + _HEADER_SIZE > self._size:
            raise HFileError(f"{magic.decode()} block offset {offset} is outside the file")
        if data is None or len(data) < _HEADER_SIZE:
            data = self._read(offset, max(size_hint, _HEADER_SIZE))
        got, on_disk, size, _, ctype, per_sum, with_header = _HEADER.unpack_from(data, 0)
        if got != magic:
            raise HFileError(f"block at {offset} has magic {got!r}, expected {magic!r}")
        end = offset + _HEADER_SIZE + on_disk
        if with_header < _HEADER_SIZE or offset + with_header > end or end > self._size:
            raise HFileError(f"{magic.decode()} block at {offset} has bad sizes")
        if len(data) < end - offset:
            data = self._read(offset, end - offset)
        payload = data[_HEADER_SIZE:with_header]
        if self._verify and ctype == _CRC32C:
            sums = data[with_header : end - offset]
            body = data[:with_header]
            for i, at in enumerate(range(0, with_header, per_sum)):
                expected = struct.pack(">I", crc32c.crc32c(body[at : at + per_sum]))
                if sums[4 * i : 4 * i + 4] != expected:
                    raise HFileError(f"checksum {i} of the block at {offset} does not match")
        if self.compression_codec == _CODECS["GZ"]:
            try:
                raw = zlib.decompress(payload, 31)
            except zlib.error as exc:
                raise HFileError(f"gzip payload of the block at {offset}: {exc}") from None
        else:
            raw = payload
        if len(raw) != size:
            raise HFileError(f"block at {offset} holds {len(raw)} bytes, header says {size}")
        return raw, end

    @staticmethod
    def _parse_data_index(raw: bytes, count: int) -> tuple[list[int], list[int], list[bytes]]:
        """Offsets, on-disk sizes and first rows of the data blocks (the root data index: a
        large file has a hundred thousand entries, so one tight pass, no object per entry)."""
        offsets: list[int] = []
        sizes: list[int] = []
        rows: list[bytes] = []
        head = _INDEX_HEAD.unpack_from
        pos = 0
        end = len(raw)
        for _ in range(count):
            offset, size = head(raw, pos)
            length = raw[pos + 12]
            if length < 0x80:  # a key length below 128: a one-byte vint
                pos += 13
            else:
                length, pos = _read_vint(raw, pos + 12)
            key_end = pos + length
            row_end = pos + 2 + (raw[pos] << 8 | raw[pos + 1]) if length >= 2 else end + 1
            if key_end > end or row_end > key_end:
                raise HFileError(f"data index entry {len(rows)} runs past its block")
            offsets.append(offset)
            sizes.append(size)
            rows.append(raw[pos + 2 : row_end])
            pos = key_end
        if pos != end:
            raise HFileError(f"data index holds {end - pos} bytes past its {count} entries")
        return offsets, sizes, rows

    @staticmethod
    def _parse_index(raw: bytes, count: int, what: str) -> list[_IndexEntry]:
        entries = []
        pos = 0
        end = len(raw)
        head = _INDEX_HEAD.unpack_from
        for _ in range(count):
            offset, size = head(raw, pos)
            if raw[pos + 12] < 0x80:  # a key length below 128: a one-byte vint
                length, pos = raw[pos + 12], pos + 13
            else:
                length, pos = _read_vint(raw, pos + 12)
            if length < 0 or pos + length > end:
                raise HFileError(f"{what} index entry runs past its block")
            entries.append(_IndexEntry(offset, size, raw[pos : pos + length]))
            pos += length
        if pos != len(raw):
            raise HFileError(f"{what} index holds {len(raw) - pos} bytes past its {count} entries")
        return entries

    @staticmethod
    def _parse_file_info(raw: bytes) -> dict[str, bytes]:
        if raw[:4] != b"PBUF":
            raise HFileError("file info block does not start with PBUF")
        length, pos = _read_pb_varint(raw, 4)
        info: dict[str, bytes] = {}
        for field, entry in _pb_fields(raw[pos : pos + length]):
            if field != 1 or not isinstance(entry, bytes):
                continue
            pair = dict(_pb_fields(entry))
            key, value = pair.get(1, b""), pair.get(2, b"")
            if not isinstance(key, bytes) or not isinstance(value, bytes):
                raise HFileError("file info entry is not a bytes pair")
            info[key.decode("utf-8")] = value
        return info

    @property
    def block_count(self) -> int:
        """Number of data blocks."""
        return len(self._offsets)

    def _block_cells(self, n: int) -> Iterator[tuple[bytes, bytes]]:
        try:
            raw, _ = self._read_block(self._offsets[n], _DATA, self._sizes[n])
            pos = 0
            while pos < len(raw):
                key_len, value_len = _CELL_HEAD.unpack_from(raw, pos)
                key_end = pos + 8 + key_len
                if key_len < 12 or value_len < 0 or key_end + value_len > len(raw):
                    raise HFileError(f"cell at {pos} of data block {n} runs past the block")
                row = _row_of(raw[pos + 8 : key_end])
                value = raw[key_end : key_end + value_len]
                _, pos = _read_vint(raw, key_end + value_len)
                yield row, value
        except (struct.error, IndexError) as exc:
            raise HFileError(f"data block {n} at {self._offsets[n]}: {exc}") from None

    def cells(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (row key, value) in file order."""
        for n in range(len(self._offsets)):
            yield from self._block_cells(n)

    def _first_block(self, row: bytes) -> int:
        return max(0, bisect.bisect_right(self._rows, row) - 1)

    def get(self, row: bytes) -> list[bytes]:
        """All values stored for ``row`` (several only in log-block HFiles); [] if none.

        Reads only the data block the root index points at (equal rows never span blocks).
        """
        if not self._offsets:
            return []
        return [value for r, value in self._block_cells(self._first_block(row)) if r == row]

    def get_many(self, rows: Iterable[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """(row, value) of every cell whose row is one of ``rows``, in file order. Only the
        data blocks the root index points the rows at are decompressed, each once; from
        :data:`SCAN_BLOCKS` blocks on their cells are found by binary search over arrays
        (:mod:`engine.format.hfile_cells`) rather than walked in Python."""
        if not self._offsets:
            return
        by_block = self._route(sorted(set(rows)))
        if len(by_block) >= self.SCAN_BLOCKS:
            blocks = sorted(by_block)
            raws = [self._inflated(n, data) for n, data in self._fetch_blocks(blocks)]
            scan = self._scan(raws, blocks)
            if scan is not None:
                wanted = [row for n in blocks for row in by_block[n]]
                which, cells = scan.find(wanted)
                yield from zip([wanted[i] for i in which.tolist()], scan.values(cells),
                               strict=True)
                return
            for n, raw in zip(blocks, raws, strict=True):
                yield from self._find_cells(n, by_block[n], raw=raw)
            return
        for n, data in self._fetch_blocks(sorted(by_block)):
            yield from self._find_cells(n, by_block[n], data)

    SCAN_BLOCKS = 16
    """Data blocks a lookup touches from which :meth:`get_many` finds its cells by arrays."""

    def blocks_touched(self, rows: Sequence[bytes]) -> int:
        """How many data blocks a lookup of ``rows`` (sorted, distinct) decompresses."""
        return len(self._route(list(rows))) if self._offsets else 0

    def key_index(self) -> KeyIndex | None:
        """Every cell of the file as a :class:`~engine.format.hfile_cells.KeyIndex` (every
        data block read and decompressed once); None when its rows cannot be held as arrays
        (:func:`~engine.format.hfile_cells.scan`)."""
        blocks = list(range(len(self._offsets)))
        raws = [self._inflated(n, data) for n, data in self._fetch_blocks(blocks)]
        scan = self._scan(raws, blocks)
        return scan.key_index() if scan is not None else None

    def _inflated(self, n: int, data: bytes) -> bytes:
        """The uncompressed cells of data block ``n`` (``data``: its bytes on disk, as the
        block index sizes it)."""
        return self._read_block(self._offsets[n], _DATA, self._sizes[n], data)[0]

    def _scan(self, raws: list[bytes], blocks: list[int]) -> CellScan | None:
        try:
            return hfile_cells.scan(raws)
        except CellFramingError as exc:
            first = self._offsets[blocks[0]] if blocks else 0
            raise HFileError(f"data blocks from offset {first}: {exc}") from None

    def _route(self, wanted: list[bytes]) -> dict[int, list[bytes]]:
        """The sorted ``wanted`` rows by the data block the root index points each at: two
        bisections per block touched, none per row (a batch looks thousands of keys up in a
        log of a few dozen blocks)."""
        firsts = self._rows
        blocks = len(firsts)
        out: dict[int, list[bytes]] = {}
        pos, count = 0, len(wanted)
        while pos < count:
            n = max(0, bisect.bisect_right(firsts, wanted[pos]) - 1)
            end = bisect.bisect_left(wanted, firsts[n + 1], pos) if n + 1 < blocks else count
            out[n] = wanted[pos:end]
            pos = end
        return out

    def _fetch_blocks(self, blocks: list[int]) -> Iterator[tuple[int, bytes]]:
        """The on-disk bytes of the data blocks ``blocks`` (ascending), read in as few
        ranges as the file allows: blocks closer than :data:`RANGE_GAP` bytes share one read
        of at most :data:`RANGE_LIMIT` bytes (a lookup of many keys touches many blocks; one
        read each costs a system call, or a request on an object store)."""
        offsets, sizes = self._offsets, self._sizes
        i = 0
        while i < len(blocks):
            start = offsets[blocks[i]]
            j = i + 1
            end = start + sizes[blocks[i]]
            while j < len(blocks):
                offset = offsets[blocks[j]]
                if offset - end > RANGE_GAP or offset + sizes[blocks[j]] - start > RANGE_LIMIT:
                    break
                end = offset + sizes[blocks[j]]
                j += 1
            data = self._read(start, end - start)
            for n in blocks[i:j]:
                at = offsets[n] - start
                yield n, data[at : at + sizes[n]]
            i = j

    DENSE_LOOKUP = 8
    """Wanted rows in one data block from which :meth:`_find_cells` walks every cell of the
    block and checks each row, rather than search the block once per wanted row."""

    def _find_cells(self, n: int, wanted: Sequence[bytes], data: bytes | None = None, *,
                    raw: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """The cells of data block ``n`` (``data``: its bytes on disk, when read already)
        whose row is in ``wanted``, in block order.

        A few wanted rows are searched for by their bytes (the 2-byte length and the row, as
        a cell key starts): a candidate is a cell only if the walk over the block's cell
        lengths lands on it, so bytes that merely look like a cell inside a value are never
        taken for one. The walk reads two lengths per cell and stops at the last candidate
        (a lookup touches a block for a few rows among dozens of cells). Many wanted rows
        (:data:`DENSE_LOOKUP`) are checked against every cell of one walk instead. ``raw``:
        the block already decompressed."""
        try:
            if raw is None:
                raw, _ = self._read_block(self._offsets[n], _DATA, self._sizes[n], data)
            size = len(raw)
            unpack = _CELL_HEAD.unpack_from
            if len(wanted) >= self.DENSE_LOOKUP:
                rows = set(wanted)
                pos = 0
                while pos < size:
                    key_len, value_len = unpack(raw, pos)
                    key_end = pos + 8 + key_len
                    length = raw[pos + 8] << 8 | raw[pos + 9]
                    if key_len < length + 12 or value_len < 0 or key_end + value_len > size:
                        raise HFileError(f"cell at {pos} of data block {n} runs past the block")
                    row = raw[pos + 10 : pos + 10 + length]
                    if row in rows:
                        yield row, raw[key_end : key_end + value_len]
                    pos = key_end + value_len
                    pos = pos + 1 if raw[pos] < 0x80 else _read_vint(raw, pos)[1]
                return
            candidates = []
            find = raw.find
            for row in wanted:
                needle = _ROW_LENGTH.pack(len(row)) + row
                at = find(needle, 8)
                while at >= 0:
                    candidates.append((at - 8, row))
                    at = find(needle, at + 1)
            if not candidates:
                return
            candidates.sort()
            pos = 0
            for start, row in candidates:
                while pos < start:
                    key_len, value_len = unpack(raw, pos)
                    if key_len < 12 or value_len < 0:
                        raise HFileError(f"cell at {pos} of data block {n} has bad lengths")
                    pos += 8 + key_len + value_len
                    # the memstore timestamp vint: one byte when >= 0
                    pos = pos + 1 if raw[pos] < 0x80 else _read_vint(raw, pos)[1]
                if pos != start:
                    continue  # the row's bytes inside another cell: not a cell
                key_len, value_len = unpack(raw, pos)
                key_end = pos + 8 + key_len
                if key_len < len(row) + 12 or value_len < 0 or key_end + value_len > size:
                    raise HFileError(f"cell at {pos} of data block {n} runs past the block")
                yield row, raw[key_end : key_end + value_len]
        except (struct.error, IndexError) as exc:
            raise HFileError(f"data block {n} at {self._offsets[n]}: {exc}") from None

    def scan(self, start: bytes = b"", stop: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Cells with ``start <= row < stop`` (``stop`` None: to the end), in order."""
        if not self._offsets:
            return
        for n in range(self._first_block(start), len(self._offsets)):
            for row, value in self._block_cells(n):
                if stop is not None and row >= stop:
                    return
                if row >= start:
                    yield row, value

    def rows_with_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Cells whose row starts with ``prefix``, in order."""
        for row, value in self.scan(prefix):
            if not row.startswith(prefix):
                return
            yield row, value

    def meta_block(self, name: str) -> bytes | None:
        """Raw (uncompressed) content of the meta block ``name``, None if absent."""
        entry = self._meta.get(name)
        if entry is None:
            return None
        try:
            return self._read_block(entry.offset, _META, entry.size)[0]
        except struct.error as exc:
            raise HFileError(f"meta block {name!r}: {exc}") from None
