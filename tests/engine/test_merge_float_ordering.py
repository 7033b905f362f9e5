"""Floating ordering values merge in Java's order: -0.0 below 0.0, NaN above every number.

Hudi compares ordering (precombine) values with Java's ``compareTo``
(``DefaultHoodieRecordPayload``, ``BufferedRecordMergerFactory.shouldKeepNewerRecord``), and
``Double.compareTo`` / ``Float.compareTo`` are a total order: -inf < ... < -0.0 < 0.0 < ...
< +inf < NaN, every NaN equal. hudi-rs 0.5.0 sorts the versions of a key by (key, ordering,
commit seqno) in arrow-rs's row format, which orders floats by ``total_cmp``: -0.0 below 0.0
too. So a version at -0.0 written after one at 0.0 loses to it, and a whole other row (its
other columns) is read. Each table here is judged by the shared oracle
(:class:`tests.helpers.Oracle`, which compares as Java's ``Double.compare`` does) and by
hudi-rs.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from tests.helpers import Oracle, hudi_rs_read, java_compare

NAN = math.nan

# Steps: each a list of batches; a batch is a list of ("up", key, ts, v) and ("del", key, ts)
# (ts None: a delete without ordering value). A batch's upserts commit, then its deletes.
# "v" names each version, so that a read tells which version won (ts alone cannot: -0.0 ==
# 0.0 and NaN != NaN in Python).
TWO_WRITES = [  # a base file and one log block (MOR): the merge's one-block shortcut
    [("up", "zero_then_negzero", 0.0, "a"), ("up", "negzero_then_zero", -0.0, "a"),
     ("up", "nan_then_negzero", NAN, "a"), ("up", "negzero_then_nan", -0.0, "a"),
     ("up", "negzero_tie", -0.0, "a"), ("up", "zero_tie", 0.0, "a"), ("up", "nan_tie", NAN, "a"),
     ("up", "batch_negzero_zero", -0.0, "a"), ("up", "batch_negzero_zero", 0.0, "b"),
     ("up", "batch_zero_negzero", 0.0, "a"), ("up", "batch_zero_negzero", -0.0, "b"),
     ("up", "batch_nan_negzero", NAN, "a"), ("up", "batch_nan_negzero", -0.0, "b"),
     ("up", "negzero_then_batch", -0.0, "a"), ("up", "nulls_beside", 1.0, "a")],
    [("up", "zero_then_negzero", -0.0, "b"), ("up", "negzero_then_zero", 0.0, "b"),
     ("up", "nan_then_negzero", -0.0, "b"), ("up", "negzero_then_nan", NAN, "b"),
     ("up", "negzero_tie", -0.0, "b"), ("up", "zero_tie", 0.0, "b"), ("up", "nan_tie", NAN, "b"),
     ("up", "negzero_then_batch", 0.0, "b"), ("up", "negzero_then_batch", -0.0, "c"),
     ("up", "nulls_beside", 2.0, "b")],
]
SEVERAL_WRITES = [  # several log blocks, delete blocks among them: the merge's general rule
    [("up", "zero_negzero_negzero", 0.0, "a"), ("up", "negzero_zero_negzero", -0.0, "a"),
     ("up", "nan_negzero_zero", NAN, "a"), ("up", "zero_nan_negzero", 0.0, "a"),
     ("up", "delete_negzero_at_zero", 0.0, "a"), ("up", "delete_zero_at_negzero", -0.0, "a"),
     ("up", "delete_nan_at_negzero", NAN, "a"), ("up", "delete_negzero_at_nan", -0.0, "a"),
     ("up", "natural_delete", -0.0, "a"), ("up", "nulls_beside", 1.0, "a")],
    [("up", "zero_negzero_negzero", -0.0, "b"), ("up", "negzero_zero_negzero", 0.0, "b"),
     ("up", "nan_negzero_zero", -0.0, "b"), ("up", "zero_nan_negzero", NAN, "b"),
     ("del", "delete_negzero_at_zero", -0.0), ("del", "delete_zero_at_negzero", 0.0),
     ("del", "delete_nan_at_negzero", -0.0), ("del", "delete_negzero_at_nan", NAN),
     ("del", "natural_delete", None), ("up", "nulls_beside", 2.0, "b")],
    [("up", "zero_negzero_negzero", -0.0, "c"), ("up", "negzero_zero_negzero", -0.0, "c"),
     ("up", "nan_negzero_zero", 0.0, "c"), ("up", "zero_nan_negzero", -0.0, "c")],
]
STEPS = {"two_writes": TWO_WRITES, "several_writes": SEVERAL_WRITES}
TYPES = {"double": pa.float64(), "float": pa.float32()}


def _table(path: Path, table_type: str, index: str) -> Table:
    options = {"hoodie.index.type": index,
               # the first write makes a base file (non-blocking writers would start the
               # group with a log file)
               "hoodie.write.concurrency.mode": "OPTIMISTIC_CONCURRENCY_CONTROL"}
    if index == "BUCKET":
        options["hoodie.bucket.index.num.buckets"] = "1"
    return Table.create(str(path), name="t", record_key="key", precombine="ts",
                        table_type=table_type, options=options)


def _write(table: Table, oracle: Oracle, steps: list[list[tuple[Any, ...]]],
           ordering: pa.DataType) -> None:
    for batch in steps:
        ups = [s for s in batch if s[0] == "up"]
        dels = [s for s in batch if s[0] == "del"]
        if ups:
            rows = [{"key": s[1], "ts": s[2], "v": s[3], "w": None if s[1] == "nulls_beside"
                     else f"{s[1]}-{s[3]}"} for s in ups]
            table.upsert(pa.table({"key": [r["key"] for r in rows],
                                   "ts": pa.array([r["ts"] for r in rows], ordering),
                                   "v": [r["v"] for r in rows],
                                   "w": pa.array([r["w"] for r in rows], pa.string())}))
            oracle.upsert(rows)
        if dels:
            table.delete(pa.table({"key": [s[1] for s in dels],
                                   "ts": pa.array([s[2] for s in dels], ordering)}))
            for s in dels:
                oracle.delete([s[1]], s[2])


def _versions(rows: list[dict[str, Any]]) -> dict[str, tuple[str, bytes, str | None]]:
    """key → (version, ordering value's bits, w): -0.0 and 0.0 told apart, NaN equal."""
    return {r["key"]: (r["v"], struct.pack(">d", r["ts"]) if r["ts"] == r["ts"] else b"nan",
                       r["w"]) for r in rows}


@pytest.mark.parametrize("ordering", sorted(TYPES))
@pytest.mark.parametrize("index", ["BUCKET", "SIMPLE"])
@pytest.mark.parametrize("table_type", ["MERGE_ON_READ", "COPY_ON_WRITE"])
@pytest.mark.parametrize("steps", sorted(STEPS))
def test_signed_zero_and_nan_orderings_merge_as_java_in_ours_and_hudi_rs(
        tmp_path: Path, steps: str, table_type: str, index: str, ordering: str) -> None:
    """0.0 then -0.0 keeps the 0.0 version (Java: ``0.0.compareTo(-0.0) > 0``); -0.0 then
    0.0 takes the later; NaN stays above -0.0; ties go to the later write — in one batch, a
    base file against one log block, several log blocks, ordered deletes at -0.0, 0.0 and
    NaN, with a natural delete and null values beside them."""
    table = _table(tmp_path / "t", table_type, index)
    oracle = Oracle(key="key", ordering="ts")
    _write(table, oracle, STEPS[steps], TYPES[ordering])
    expected = _versions(oracle.snapshot())
    assert expected["zero_then_negzero" if steps == "two_writes"
                    else "zero_negzero_negzero"][0] == "a"  # the oracle is Java's
    columns = ["key", "ts", "v", "w"]
    assert _versions(table.read(columns=columns).to_pylist()) == expected
    assert _versions(hudi_rs_read(table.path).select(columns).to_pylist()) == expected


def test_oracle_compares_as_java_double_compare() -> None:
    """The oracle's comparison is Java's ``Double.compare`` (-0.0 < 0.0, NaN the greatest
    and equal to NaN, whatever its sign), written without the engine's code."""
    order = [-math.inf, -1.0, -5e-324, -0.0, 0.0, 5e-324, 1.0, math.inf, NAN]
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            assert java_compare(a, b) == (i > j) - (i < j), (a, b)
    assert java_compare(-NAN, NAN) == 0 and java_compare(-NAN, math.inf) == 1


@pytest.mark.parametrize("ordering", sorted(TYPES))
def test_repeated_locations_keep_the_greatest_stored_ordering_in_java_order(
        ordering: str) -> None:
    """A key stored twice in one file group (two inserts) is tagged with its greatest stored
    ordering value, which the write-side rule compares with: NaN over 5.0 (Arrow's ``max``
    skips NaN), 0.0 over -0.0 in either order."""
    from engine.index.simple import tag

    stored = {"a": [5.0, NAN], "b": [-0.0, 0.0], "c": [0.0, -0.0], "d": [NAN, -0.0, None]}
    keys = [k for k, values in stored.items() for _ in values]
    locations = pa.table({"key": keys, "loc_partition": [""] * len(keys),
                          "loc_file_id": ["f"] * len(keys),
                          "loc_ordering": pa.array([v for values in stored.values()
                                                    for v in values], TYPES[ordering])})
    tagged = tag(pa.array(list(stored)), pa.array([""] * len(stored)), locations,
                 global_index=False)
    got = dict(zip(stored, tagged.column("loc_ordering").to_pylist(), strict=True))
    for key, values in stored.items():
        greatest = None
        for v in values:
            if v is not None and (greatest is None or java_compare(v, greatest) > 0):
                greatest = v
        assert greatest is not None
        assert java_compare(got[key], greatest) == 0, (key, got[key])


@pytest.mark.parametrize("table_type", ["MERGE_ON_READ", "COPY_ON_WRITE"])
def test_negative_nan_is_greatest_as_java_where_hudi_rs_orders_it_lowest(
        tmp_path: Path, table_type: str) -> None:
    """A NaN with the sign bit set (``-math.nan``; Python, Spark and Java's arithmetic make
    positive ones) is NaN to Java (``doubleToLongBits`` makes every NaN one: the greatest),
    and we follow Java; hudi-rs 0.5.0 orders it below -inf (arrow-rs ``total_cmp``), so it
    reads a merge-on-read slice holding it against a number otherwise (observed; a
    copy-on-write file holds only the winner, which it reads alike)."""
    negative_nan = -NAN
    assert math.copysign(1.0, negative_nan) == -1.0
    table = _table(tmp_path / "t", table_type, "BUCKET")
    oracle = Oracle(key="key", ordering="ts")
    steps = [[("up", "nan_then_one", negative_nan, "a"), ("up", "one_then_nan", 1.0, "a"),
              ("up", "nan_then_nan", NAN, "a")],
             [("up", "nan_then_one", 1.0, "b"), ("up", "one_then_nan", negative_nan, "b"),
              ("up", "nan_then_nan", negative_nan, "b")]]
    _write(table, oracle, steps, pa.float64())
    expected = _versions(oracle.snapshot())
    assert {k: v[0] for k, v in expected.items()} == {
        "nan_then_one": "a", "one_then_nan": "b", "nan_then_nan": "b"}
    assert _versions(table.read(columns=["key", "ts", "v", "w"]).to_pylist()) == expected
    theirs = _versions(hudi_rs_read(table.path).select(["key", "ts", "v", "w"]).to_pylist())
    if table_type == "COPY_ON_WRITE":
        assert theirs == expected
    else:
        assert {k: v[0] for k, v in theirs.items()} == {
            "nan_then_one": "b", "one_then_nan": "a", "nan_then_nan": "a"}
