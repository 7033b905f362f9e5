"""The cells of inflated HFile data blocks as numpy arrays, and lookups of many rows in them
by binary search: what :class:`engine.format.hfile.HFileReader` uses when a lookup touches
many blocks, instead of a Python step per cell.

A data block is a run of cells ``keyLen: i32 | valueLen: i32 | rowLen: i16 | row | ... |
value | mvcc vint`` (``engine.format.hfile``). Where each cell starts depends on the lengths
of the cells before it, so the walk is done in lock step over all blocks at once: step ``s``
reads the ``s``-th cell of every block that has one (a few dozen numpy steps for a 4 KB
block, whatever the number of blocks). The rows are then gathered into one fixed-width
numpy bytes array, sorted as the file sorts them, and searched with ``searchsorted``.

numpy compares fixed-width bytes with trailing NULs stripped, so rows holding a NUL byte
cannot be represented: :func:`scan` returns None for them and the caller walks the blocks
in Python. Pure arrays in, arrays out; no I/O; safe on executors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CorruptTableError


class CellFramingError(CorruptTableError, ValueError):
    """A cell's lengths run past its block (the caller names the file)."""


def _window(buf: np.ndarray, dtype: str) -> np.ndarray:
    """Every position of ``buf`` read as one ``dtype`` value (overlapping, unaligned): a
    gather at cell positions then reads big-endian lengths or fixed-width rows directly."""
    size = np.dtype(dtype).itemsize
    count = max(len(buf) - size + 1, 0)
    return np.ndarray((count,), dtype=dtype, buffer=buf, offset=0, strides=(1,))


@dataclass(frozen=True)
class CellScan:
    """The cells of some inflated data blocks, in file order: where each starts in
    ``data`` (the blocks back to back), its row and its value."""

    data: bytes
    row_start: np.ndarray
    row_len: np.ndarray
    value_start: np.ndarray
    value_len: np.ndarray
    rows: np.ndarray
    """Every row as fixed-width numpy bytes (``S<longest row>``), ascending."""

    def find(self, wanted: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """(index into ``wanted``, cell index) of every cell whose row is one of ``wanted``
        (distinct), in file order."""
        width = self.rows.dtype.itemsize
        if not len(wanted) or not len(self.rows):
            return _EMPTY, _EMPTY
        lengths = np.fromiter(map(len, wanted), np.int64, len(wanted))
        fits = lengths <= width  # a longer row is in no cell; numpy would cut it to fit
        if b"\x00" in b"".join(wanted):  # nor is one with a NUL byte (no row has one)
            fits &= np.fromiter((b"\x00" not in row for row in wanted), bool, len(wanted))
        keep = np.flatnonzero(fits)
        if not len(keep):
            return _EMPTY, _EMPTY
        probe = np.array(wanted, dtype=f"S{max(int(lengths.max()), 1)}")[keep]
        probe = probe.astype(self.rows.dtype)
        lo = np.searchsorted(self.rows, probe, "left")
        hi = np.searchsorted(self.rows, probe, "right")
        counts = hi - lo
        total = int(counts.sum())
        which = np.repeat(keep.astype(np.int64), counts)
        firsts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
        cells = firsts + np.arange(total, dtype=np.int64)
        order = np.argsort(cells, kind="stable")
        return which[order], cells[order]

    def values(self, cells: np.ndarray) -> list[bytes]:
        """The value bytes of ``cells``."""
        data = self.data
        return [data[s : s + n] for s, n in zip(self.value_start[cells].tolist(),
                                                self.value_len[cells].tolist(), strict=True)]

    def key_index(self) -> KeyIndex:
        """Every cell's row and value, kept compact: rows as they are, values deduplicated
        (a record-index file holds one value per data file for a million keys)."""
        n = len(self.rows)
        values = _binary_views(self.data, self.value_start, self.value_len)
        encoded = pc.dictionary_encode(values) if n else pa.DictionaryArray.from_arrays(
            pa.array([], pa.int32()), pa.array([], pa.binary()))
        dictionary = encoded.dictionary.cast(pa.binary())
        ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        return KeyIndex(self.rows.copy(), ids, dictionary)


def _binary_views(data: bytes, start: np.ndarray, length: np.ndarray) -> pa.Array:
    """A ``binary_view`` array of the slices ``data[start:start + length]`` (no copy of the
    bytes: each view names its offset and holds the first 4 bytes; slices up to 12 bytes are
    inlined whole, as Arrow requires)."""
    n = len(start)
    views = np.zeros((n, 4), np.uint32)
    views[:, 0] = length
    buf = np.frombuffer(data + b"\x00" * 12, np.uint8)
    views[:, 1] = _window(buf, "<u4")[start] if n else 0
    views[:, 3] = start
    short = np.flatnonzero(length <= 12)
    if len(short):
        inline = _window(buf, "S12")[start[short]].view(np.uint8).reshape(len(short), 12)
        inline = np.where(np.arange(12)[None, :] < length[short][:, None], inline, 0)
        views[short, 1:4] = inline.astype(np.uint8).view("<u4").reshape(len(short), 3)
    return pa.Array.from_buffers(pa.binary_view(), n,
                                 [None, pa.py_buffer(views), pa.py_buffer(data)])


@dataclass(frozen=True)
class KeyIndex:
    """Every (row, value) of one HFile, compact: rows ascending as fixed-width bytes, each
    cell's value an index into ``values``. What a process keeps of a record-index file it
    looks many keys up in, batch after batch (``engine.metadata.reader``)."""

    rows: np.ndarray
    value_ids: np.ndarray
    values: pa.Array

    @property
    def nbytes(self) -> int:
        """Bytes held (the arrays; a few hundred bytes of Python objects besides)."""
        return int(self.rows.nbytes + self.value_ids.nbytes + self.values.nbytes)

    def get_many(self, wanted: Sequence[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """(row, value) of every cell whose row is one of ``wanted`` (distinct), in file
        order."""
        scan = CellScan(b"", _EMPTY, _EMPTY, _EMPTY, _EMPTY, self.rows)
        which, cells = scan.find(wanted)
        if not len(cells):
            return
        values = self.values.take(pa.array(self.value_ids[cells])).to_pylist()
        for i, value in zip(which.tolist(), values, strict=True):
            yield wanted[i], value


_EMPTY = np.zeros(0, np.int64)


def scan(raws: Sequence[bytes]) -> CellScan | None:
    """The cells of the inflated data blocks ``raws`` (in file order). None when a row holds
    a NUL byte or the rows do not ascend (the caller walks the blocks itself). Raises
    :class:`CellFramingError` when a cell's lengths run past its block."""
    data = b"".join(raws)
    buf = np.frombuffer(data, np.uint8)
    sizes = np.fromiter((len(raw) for raw in raws), np.int64, len(raws))
    ends = np.cumsum(sizes)
    begins = ends - sizes
    i32 = _window(buf, ">i4")
    pos = begins.copy()
    active = np.flatnonzero(pos < ends)
    at_steps: list[np.ndarray] = []
    block_steps: list[np.ndarray] = []
    step_numbers: list[np.ndarray] = []
    step = 0
    while len(active):
        p = pos[active]
        end = ends[active]
        if np.any(p + 10 > end):
            raise CellFramingError("a cell header runs past its block")
        key_len = i32[p].astype(np.int64)
        value_len = i32[p + 4].astype(np.int64)
        after = p + 8 + key_len + value_len
        if np.any(key_len < 12) or np.any(value_len < 0) or np.any(after >= end):
            raise CellFramingError("a cell runs past its block")
        first = buf[after].view(np.int8).astype(np.int64)  # the mvcc vint's first byte
        vint = np.where(first >= -112, 1, np.where(first < -120, -119 - first, -111 - first))
        pos[active] = after + vint
        at_steps.append(p)
        block_steps.append(active)
        step_numbers.append(np.full(len(active), step, np.int64))
        step += 1
        active = active[pos[active] < end]
    if np.any(pos != ends):
        raise CellFramingError("a cell's mvcc field runs past its block")
    if not at_steps:
        return _scan_of(data, _EMPTY, _EMPTY, _EMPTY, _EMPTY)
    blocks = np.concatenate(block_steps)
    counts = np.bincount(blocks, minlength=len(raws))
    firsts = np.cumsum(counts) - counts
    order = np.empty(len(blocks), np.int64)
    order[firsts[blocks] + np.concatenate(step_numbers)] = np.arange(len(blocks))
    starts = np.concatenate(at_steps)[order]
    key_len = i32[starts].astype(np.int64)
    value_len = i32[starts + 4].astype(np.int64)
    row_len = _window(buf, ">i2")[starts + 8].astype(np.int64)
    if np.any(key_len < row_len + 12):
        raise CellFramingError("a cell's row runs past its key")
    return _scan_of(data, starts + 10, row_len, starts + 8 + key_len, value_len)


def _scan_of(data: bytes, row_start: np.ndarray, row_len: np.ndarray, value_start: np.ndarray,
             value_len: np.ndarray) -> CellScan | None:
    """The :class:`CellScan`, its rows gathered; None when they cannot be represented."""
    if np.any(row_len < 0):
        raise CellFramingError("a cell has a negative row length")
    width = max(int(row_len.max()) if len(row_len) else 0, 1)
    buf = np.frombuffer(data + b"\x00" * width, np.uint8)
    rows = _window(buf, f"S{width}")[row_start] if len(row_start) else np.zeros(0, f"S{width}")
    matrix = rows.view(np.uint8).reshape(len(rows), width)
    if np.any(row_len != width):
        short = np.arange(width)[None, :] >= row_len[:, None]
        matrix[short] = 0  # bytes past a row belong to its key: blank them
        nul = int(np.count_nonzero(matrix == 0)) != int(np.count_nonzero(short))
    else:
        nul = bool(np.any(matrix == 0))
    if nul:
        return None
    if len(rows) > 1 and not bool(np.all(rows[:-1] <= rows[1:])):
        return None
    return CellScan(data, row_start, row_len, value_start, value_len, rows)
