"""Vectorized Avro binary encoding of flat records (numpy + Arrow), for engine.format.avro_codec.

Each field becomes one or more *pieces* - (rows x width) byte matrices with each row's used
width: the union index, zigzag varints, little-endian floats, the varint length of a string.
Runs of pieces between string payloads are compacted with a boolean mask into one binary
array, and Arrow's ``binary_join_element_wise`` interleaves those with the string columns row
by row, giving every record's bytes contiguously plus their offsets. The output is byte for
byte what ``fastavro.schemaless_writer`` writes (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.format.avro_schema import FlatField, Kind

__all__ = ["encode_flat"]

_INT32_MAX = 2**31 - 1

_Piece = tuple[np.ndarray, np.ndarray | None]


def _zigzag(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def _varint_piece(z: np.ndarray, valid: np.ndarray | None) -> _Piece:
    """Avro varints of already-zigzagged ``z``; rows where ``valid`` is False get no bytes."""
    n = len(z)
    nbytes = np.ones(n, dtype=np.int64)
    rest = z >> np.uint64(7)
    while True:
        more = rest != 0
        if not more.any():
            break
        nbytes += more
        rest = rest >> np.uint64(7)
    width = int(nbytes.max()) if n else 1
    matrix = np.empty((n, width), dtype=np.uint8)
    shifted = z
    for k in range(width):
        byte = (shifted & np.uint64(0x7F)).astype(np.uint8)
        if k < width - 1:
            byte |= (nbytes > k + 1).view(np.uint8) << np.uint8(7)
            shifted = shifted >> np.uint64(7)
        matrix[:, k] = byte
    if valid is not None:
        return matrix, np.where(valid, nbytes, 0)
    return matrix, (None if width == 1 or bool((nbytes == width).all()) else nbytes)


def _fixed_piece(raw: np.ndarray, width: int, valid: np.ndarray | None) -> _Piece:
    matrix = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, width)
    return matrix, (None if valid is None else valid.astype(np.int64) * width)


def _compact(pieces: list[_Piece], n: int, large: bool) -> pa.Array:
    """Concatenate the used bytes of each row's pieces into one binary array."""
    matrices = [m for m, _ in pieces]
    widths = [m.shape[1] for m in matrices]
    big = np.concatenate(matrices, axis=1) if len(matrices) > 1 else matrices[0]
    row_len = np.zeros(n, dtype=np.int64)
    for (_, used), w in zip(pieces, widths, strict=True):
        row_len += w if used is None else used
    if all(used is None for _, used in pieces):
        data = np.ascontiguousarray(big).reshape(-1)
    else:
        masks = [
            np.ones((n, w), dtype=bool) if used is None else np.arange(w) < used[:, None]
            for (_, used), w in zip(pieces, widths, strict=True)
        ]
        mask = np.concatenate(masks, axis=1) if len(masks) > 1 else masks[0]
        data = big[mask]
    offsets = np.zeros(n + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(row_len, out=offsets[1:])
    arrow_type = pa.large_binary() if large else pa.binary()
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


@dataclass
class _EncCol:
    kind: Kind
    values: Any  # numpy array (numbers, bools) or a pa.BinaryArray (strings, bytes)
    lengths: np.ndarray | None  # byte lengths of strings / bytes
    valid: np.ndarray | None  # None: no nulls
    branch: int | np.ndarray | None  # union index written for valid rows
    null_branch: int | None


class _Layout:
    """Records under construction: runs of byte pieces separated by string payloads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.parts: list[list[_Piece] | pa.Array] = []
        self.current: list[_Piece] = []
        self.row_len = np.zeros(n, dtype=np.int64)

    def piece(self, piece: _Piece) -> None:
        """Append bytes taken from a (rows x width) matrix."""
        self.current.append(piece)
        matrix, used = piece
        self.row_len += matrix.shape[1] if used is None else used

    def payload(self, values: pa.Array, lengths: np.ndarray) -> None:
        """Append each row's string/bytes payload."""
        self.parts.append(self.current)
        self.parts.append(values)
        self.current = []
        self.row_len += lengths

    def finish(self, length_prefix: bool) -> tuple[pa.Buffer, np.ndarray]:
        """Join everything row by row: ``(records, offsets)``."""
        n = self.n
        parts = [*self.parts, self.current]
        if length_prefix:
            if n and int(self.row_len.max()) > _INT32_MAX:
                raise ValueError("an Avro record longer than 2 GiB cannot be length-prefixed")
            first = parts[0]
            assert isinstance(first, list)
            parts[0] = [_fixed_piece(self.row_len.astype(">i4"), 4, None), *first]
            self.row_len += 4
        large = int(self.row_len.sum()) > _INT32_MAX
        arrays: list[pa.Array] = []
        for part in parts:
            if isinstance(part, list):
                if part:
                    arrays.append(_compact(part, n, large))
            else:
                arrays.append(part.cast(pa.large_binary()) if large else part)
        if not arrays or n == 0:
            return pa.py_buffer(b""), np.zeros(n + 1, dtype=np.int64)
        if len(arrays) == 1:
            joined = arrays[0]
        else:
            sep = pa.scalar(b"", type=arrays[0].type)
            joined = pc.binary_join_element_wise(
                *arrays, sep, null_handling="replace", null_replacement=b""
            )
        offset_type = np.int64 if large else np.int32
        raw_offsets = np.frombuffer(joined.buffers()[1], dtype=offset_type)
        offsets = raw_offsets[joined.offset : joined.offset + n + 1].astype(np.int64)
        base = int(offsets[0])
        data = joined.buffers()[2].slice(base, int(offsets[-1]) - base)
        return data, offsets - base


def _encode_columns(
    n: int, cols: Sequence[_EncCol], length_prefix: bool
) -> tuple[pa.Buffer, np.ndarray]:
    """Interleave encoded columns row by row; see :func:`encode_records`."""
    layout = _Layout(n)
    for col in cols:
        valid = col.valid
        if col.branch is not None:
            branch: Any = col.branch
            if valid is not None and col.null_branch is not None:
                branch = np.where(valid, col.branch, col.null_branch)
            branches = np.broadcast_to(np.asarray(branch, dtype=np.int64), (n,))
            if n and int(branches.max()) < 64:  # the usual case: a one-byte union index
                layout.piece(((branches << 1).astype(np.uint8).reshape(n, 1), None))
            else:
                layout.piece(_varint_piece(_zigzag(branches), None))
        if col.kind is Kind.NULL:
            continue
        if col.kind in (Kind.STRING, Kind.BYTES):
            assert col.lengths is not None
            layout.piece(_varint_piece(_zigzag(col.lengths), valid))
            layout.payload(col.values, col.lengths)
        elif col.kind in (Kind.INT, Kind.LONG):
            layout.piece(_varint_piece(_zigzag(col.values), valid))
        elif col.kind is Kind.FLOAT:
            layout.piece(_fixed_piece(col.values.astype("<f4"), 4, valid))
        elif col.kind is Kind.DOUBLE:
            layout.piece(_fixed_piece(col.values.astype("<f8"), 8, valid))
        else:  # BOOLEAN
            layout.piece(_fixed_piece(col.values.astype(np.uint8), 1, valid))
    return layout.finish(length_prefix)


def _column_for(table: pa.Table, field: FlatField) -> _EncCol:
    n = table.num_rows
    if field.name in table.column_names:
        column = table.column(field.name)
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    else:
        arr = pa.nulls(n, field.arrow_type)
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    if field.kind is Kind.NULL:
        null_branch = field.null_branch if field.null_branch is not None else field.value_branch
        return _EncCol(Kind.NULL, None, None, None, null_branch, None)
    try:
        arr = arr.cast(field.arrow_type) if arr.type != field.arrow_type else arr
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(
            f"field {field.name!r}: cannot write {arr.type} as Avro {field.kind.value}: {exc}"
        ) from exc
    valid: np.ndarray | None = None
    if arr.null_count:
        if field.null_branch is None:
            raise ValueError(
                f"field {field.name!r} is not nullable in the Avro schema but has nulls"
            )
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
    branch = field.value_branch
    if field.kind in (Kind.STRING, Kind.BYTES):
        binary = arr.cast(pa.binary())
        lengths = pc.binary_length(binary).fill_null(0).to_numpy(zero_copy_only=False)
        return _EncCol(
            field.kind, binary, lengths.astype(np.int64), valid, branch, field.null_branch
        )
    if field.kind is Kind.BOOLEAN:
        values = arr.fill_null(False).to_numpy(zero_copy_only=False)
    else:
        storage = {
            Kind.INT: pa.int32(),
            Kind.LONG: pa.int64(),
            Kind.FLOAT: pa.float32(),
            Kind.DOUBLE: pa.float64(),
        }[field.kind]
        if arr.type != storage:
            arr = arr.view(storage)
        values = arr.fill_null(0).to_numpy(zero_copy_only=False)
    return _EncCol(field.kind, values, None, valid, branch, field.null_branch)


def encode_flat(
    table: pa.Table, fields: Sequence[FlatField], length_prefixed: bool
) -> tuple[pa.Buffer, np.ndarray]:
    """Encode every row of ``table`` as a record of the flat ``fields``: ``(data, offsets)``."""
    cols = [_column_for(table, field) for field in fields]
    return _encode_columns(table.num_rows, cols, length_prefixed)
