"""Sort keys of clustering: every vector of hudi-table-services.md §6.2/§6.3.

The hilbert vectors are davidmoten/hilbert-curve's own tests (the library Hudi calls); the
4x4 grid orders are the classic Morton order and the Hilbert curve of order 2.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
import struct

import numpy as np
import pyarrow as pa
import pytest

from engine.services.curves import (
    dimension_order,
    hilbert_index,
    hilbert_key_bytes,
    hilbert_values,
    normalize_strategy,
    sort_indices,
    zorder_key_bytes,
    zorder_values,
)


def _z8(arr: pa.Array) -> list[str]:
    return [f"{int(v):016x}" for v in zorder_values(arr)]


def test_zorder_int_vectors_match_doc() -> None:
    assert _z8(pa.array([1, -1], pa.int32())) == ["0000000080000001", "000000007fffffff"]
    assert _z8(pa.array([None], pa.int32())) == ["00000000ffffffff"]  # Integer.MAX_VALUE
    assert _z8(pa.array([None], pa.int16())) == ["0000000080007fff"]  # Short.MAX_VALUE


def test_zorder_long_byte_bool_vectors() -> None:
    assert _z8(pa.array([0, -1, None], pa.int64())) == [
        "8000000000000000", "7fffffffffffffff", "ffffffffffffffff"]
    # byte: the raw byte, no sign flip (negative bytes sort after positive ones)
    assert _z8(pa.array([1, -1, None], pa.int8())) == [
        "0000000000000001", "00000000000000ff", "000000000000007f"]
    assert _z8(pa.array([True, False, None])) == [
        "0000000080000001", "0000000080000000", "0000000080000000"]


def test_zorder_string_vectors_match_doc() -> None:
    assert _z8(pa.array(["ab", "abcdefghij", None, ""])) == [
        "0000000000006162", "6162636465666768", "0000000000000000", "0000000000000000"]
    assert _z8(pa.array([b"\x01\x02"], pa.binary())) == ["0000000000000102"]
    # dictionary columns (how base files are read) map like their values
    assert _z8(pa.array(["ab", "ab"]).dictionary_encode()) == ["0000000000006162"] * 2
    # sliced arrays use the right offsets
    assert _z8(pa.array(["zz", "ab", "c"]).slice(1)) == ["0000000000006162", "0000000000000063"]


def test_zorder_double_quirks() -> None:
    values = [1.5, -1.5, 0.0, -0.0, None]
    got = _z8(pa.array(values, pa.float64()))
    bits = [struct.unpack(">Q", struct.pack(">d", v))[0] for v in (1.5, -1.5, 0.0, -0.0)]
    assert got[0] == f"{bits[0] ^ (1 << 63):016x}"
    assert got[1] == f"{bits[1] ^ ((1 << 64) - 1):016x}"
    assert got[2] == "0000000000000000"  # 0.0 below every negative number
    assert got[3] == f"{bits[3]:016x}"  # -0.0 unchanged (top bit set)
    max_bits = struct.unpack(">Q", struct.pack(">d", np.finfo(np.float64).max))[0]
    assert got[4] == f"{max_bits ^ (1 << 63):016x}"
    assert got[2] < got[1] < got[0]


def test_zorder_dates_timestamps_decimals_as_longs() -> None:
    day = dt.date(2024, 1, 2)
    millis = (day - dt.date(1970, 1, 1)).days * 86_400_000
    assert _z8(pa.array([day], pa.date32())) == [f"{millis ^ (1 << 63):016x}"]
    ts = pa.array([1_700_000_000_123_456, -1], pa.timestamp("us"))
    assert _z8(ts) == [f"{1_700_000_000_123 ^ (1 << 63):016x}",
                       f"{((-1) & ((1 << 64) - 1)) ^ (1 << 63):016x}"]  # floor to -1 ms
    dec = pa.array([decimal.Decimal("-12.75"), decimal.Decimal("3.9")], pa.decimal128(10, 2))
    assert _z8(dec) == [f"{((-12) & ((1 << 64) - 1)) ^ (1 << 63):016x}",
                        f"{3 ^ (1 << 63):016x}"]


def test_zorder_two_ints_interleave_to_doc_key() -> None:
    key = zorder_key_bytes([pa.array([1], pa.int32()), pa.array([2], pa.int32())])
    assert key[0].hex() == "0000000000000000" "c000000000000006"


def _grid() -> tuple[pa.Table, list[tuple[int, int]]]:
    points = [(x, y) for x in range(4) for y in range(4)]
    random.Random(7).shuffle(points)
    table = pa.table({"x": pa.array([p[0] for p in points], pa.int32()),
                      "y": pa.array([p[1] for p in points], pa.int32())})
    return table, points


def test_zorder_4x4_grid_is_morton_order() -> None:
    table, points = _grid()
    order = [points[i] for i in sort_indices(table, ["x", "y"], "z-order")]
    assert order == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3),
                     (2, 0), (2, 1), (3, 0), (3, 1), (2, 2), (2, 3), (3, 2), (3, 3)]


def test_hilbert_library_vectors() -> None:
    assert hilbert_index([1, 2], bits=2) == 7
    assert hilbert_index([0, 16], bits=5) == 256
    assert hilbert_index([0, 1], bits=1) == 1
    assert hilbert_index([1, 1], bits=1) == 2
    assert hilbert_index([0, 0], bits=1) == 0


def test_hilbert_4x4_grid_matches_doc() -> None:
    table, points = _grid()
    order = [points[i] for i in sort_indices(table, ["x", "y"], "hilbert")]
    assert order == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1),
                     (2, 2), (3, 2), (3, 3), (2, 3), (1, 3), (1, 2), (0, 2), (0, 3)]


def test_hilbert_keys_are_63_bytes_in_index_order() -> None:
    xs = pa.array([0, 1, 3, 2], pa.int64())
    ys = pa.array([1, 1, 3, 0], pa.int64())
    keys = hilbert_key_bytes([xs, ys])
    assert all(len(k) == 63 for k in keys)
    indexes = [hilbert_index([x, y], bits=63) for x, y in zip(xs.to_pylist(), ys.to_pylist(),
                                                              strict=True)]
    assert [int.from_bytes(k, "big") for k in keys] == indexes


def test_hilbert_values_follow_doc_types() -> None:
    long_max = (1 << 63) - 1
    assert hilbert_values(pa.array([5, None], pa.int32())).tolist() == [5, long_max]
    assert hilbert_values(pa.array([-2.0], pa.float64())).tolist() == [
        struct.unpack(">q", struct.pack(">d", -2.0))[0]]  # raw bits: negative long
    assert hilbert_values(pa.array([True, False, None])).tolist() == [long_max, 0, 0]
    assert hilbert_values(pa.array(["ab", None])).tolist() == [0x6162, long_max]
    assert hilbert_values(pa.array([-1], pa.int8())).tolist() == [255]


def test_hilbert_drops_sign_bit_negative_sorts_high() -> None:
    table = pa.table({"x": pa.array([-1, 0, 5], pa.int64()), "y": pa.array([0, 0, 0],
                                                                           pa.int64())})
    order = sort_indices(table, ["x", "y"], "hilbert").tolist()
    assert order[-1] == 0  # -1 acts as 2^63 - 1


def test_dimension_order_is_schema_position_mod_16() -> None:
    meta = ["_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key",
            "_hoodie_partition_path", "_hoodie_file_name"]
    names = [*meta, "a", "b", "c"]
    assert dimension_order(names, ["c", "a"]) == ["a", "c"]
    # position 16 + 5 = 21 lands in bucket 5, before position 6 ("a")
    wide = [*meta, *(f"c{i}" for i in range(20))]
    assert dimension_order(wide, ["c1", "c16"]) == ["c16", "c1"]
    with pytest.raises(ValueError, match="not a column"):
        dimension_order(names, ["nope"])


def test_linear_sort_nulls_first_declared_order() -> None:
    table = pa.table({"a": [2, None, 1, 1], "b": ["x", "y", "z", "a"]})
    assert sort_indices(table, ["a", "b"], "linear").tolist() == [1, 3, 2, 0]


def test_one_column_curve_is_plain_ascending_sort() -> None:
    table = pa.table({"a": pa.array([3, -1, 2], pa.int32())})
    for strategy in ("z-order", "hilbert", "linear"):
        assert sort_indices(table, ["a"], strategy).tolist() == [1, 2, 0]


def test_strategy_names() -> None:
    assert normalize_strategy("ZORDER") == "z-order"
    assert normalize_strategy(" Hilbert ") == "hilbert"
    with pytest.raises(ValueError, match="layout strategy"):
        normalize_strategy("spiral")


def test_vectorised_zorder_equals_per_row_port() -> None:
    rng = random.Random(3)
    xs = [rng.randint(-2**31, 2**31 - 1) for _ in range(200)]
    ss = ["".join(rng.choice("abcé") for _ in range(rng.randint(0, 10))) for _ in range(200)]
    keys = zorder_key_bytes([pa.array(xs, pa.int32()), pa.array(ss)])

    def port(x: int, s: str) -> bytes:
        a = ((x & 0xFFFFFFFF) ^ 0x80000000).to_bytes(8, "big")
        raw = s.encode()[:8]
        b = raw.rjust(8, b"\0")
        bits = []
        for k in range(64):
            for col in (a, b):
                bits.append((col[k // 8] >> (7 - k % 8)) & 1)
        return int("".join(map(str, bits)), 2).to_bytes(16, "big")

    assert keys == [port(x, s) for x, s in zip(xs, ss, strict=True)]


def _hilbert_port(point: list[int], bits: int) -> int:
    """davidmoten's transposedIndex + toIndex, one point, plain Python ints."""
    mask = (1 << 64) - 1
    x = [v & mask for v in point]
    n = len(x)
    q = 1 << (bits - 1)
    while q > 1:
        p = q - 1
        for i in range(n):
            if x[i] & q:
                x[0] ^= p
            else:
                t = (x[0] ^ x[i]) & p
                x[0] ^= t
                x[i] ^= t
        q >>= 1
    for i in range(1, n):
        x[i] ^= x[i - 1]
    t = 0
    q = 1 << (bits - 1)
    while q > 1:
        if x[n - 1] & q:
            t ^= q - 1
        q >>= 1
    x = [v ^ t for v in x]
    index = 0
    for b in range(bits - 1, -1, -1):
        for v in x:
            index = (index << 1) | ((v >> b) & 1)
    return index


@pytest.mark.parametrize("dims", [2, 3])
def test_vectorised_hilbert_equals_per_point_port(dims: int) -> None:
    rng = random.Random(dims)
    points = [[rng.choice([rng.randint(-2**63, 2**63 - 1), rng.randint(-5, 5)])
               for _ in range(dims)] for _ in range(100)]
    columns = [pa.array([p[d] for p in points], pa.int64()) for d in range(dims)]
    keys = hilbert_key_bytes(columns)
    assert [int.from_bytes(k, "big") for k in keys] == [_hilbert_port(p, 63) for p in points]
