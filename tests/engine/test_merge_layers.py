"""``merge_layers`` on the slice shapes a streaming table reads most: a base file and one data
block with distinct keys (the shortcut in ``engine/merge/record_merger.py``), and a base file with
several such blocks, judged against a dict oracle of the merge rule in the module docstring —
in random order, with every log key in the base or only some, keys repeated across blocks,
ties, and both merge modes."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine import Table
from engine.config import MergeMode
from engine.merge.record_merger import KEY, DataLayer, DeleteLayer, merge_layers

SCHEMA = pa.schema([pa.field(KEY, pa.string()), pa.field("ts", pa.int64()),
                    pa.field("v", pa.string())])


def _oracle(base: list[tuple[str, int, str]], log: list[tuple[str, int, str]],
            event_time: bool) -> set[tuple[str, int, str]]:
    rows = {k: (k, ts, v) for k, ts, v in base}
    for k, ts, v in log:
        if k in rows and event_time and rows[k][1] > ts:
            continue  # the base row's ordering value is greater: it stays
        rows[k] = (k, ts, v)
    return set(rows.values())


@pytest.mark.parametrize("mode", [MergeMode.EVENT_TIME_ORDERING, MergeMode.COMMIT_TIME_ORDERING])
@pytest.mark.parametrize("seed", range(25))
def test_base_and_one_block_match_the_rule(mode: MergeMode, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(1, 60)
    base = [(f"k{i:03d}", rng.randrange(5), f"b{i}") for i in range(n)]
    pool = [k for k, _, _ in base] + [f"n{i:03d}" for i in range(rng.randrange(0, 10))]
    chosen = rng.sample(pool, rng.randrange(1, len(pool) + 1))  # distinct, random order
    if seed % 5 == 0:  # every base key updated, in another order
        chosen = rng.sample([k for k, _, _ in base], n)
    log = [(k, rng.randrange(5), f"l{j}") for j, k in enumerate(chosen)]
    table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in base],
                                 schema=SCHEMA)
    layer = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in log],
                                 schema=SCHEMA)
    merged = merge_layers(table, [DataLayer(layer)], mode=mode, ordering_field="ts",
                          schema=SCHEMA)
    got = [tuple(r.values()) for r in merged.to_pylist()]
    assert len(got) == len(set(got))
    assert set(got) == _oracle(base, log, mode is MergeMode.EVENT_TIME_ORDERING)


def test_repeated_keys_take_the_general_rule() -> None:
    """A block holding a key twice is merged by the general rule (of two equal orderings
    the later row wins), not by the shortcut."""
    base = pa.Table.from_pylist([{KEY: "a", "ts": 5, "v": "base"}], schema=SCHEMA)
    twice = pa.Table.from_pylist([{KEY: "a", "ts": 7, "v": "first"},
                                  {KEY: "a", "ts": 7, "v": "second"}], schema=SCHEMA)
    merged = merge_layers(base, [DataLayer(twice)], mode=MergeMode.EVENT_TIME_ORDERING,
                          ordering_field="ts", schema=SCHEMA)
    assert merged.to_pylist() == [{KEY: "a", "ts": 7, "v": "second"}]


def _table(rows: list[tuple[str, int, str]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows],
                                schema=SCHEMA)


@pytest.mark.parametrize("mode", [MergeMode.EVENT_TIME_ORDERING, MergeMode.COMMIT_TIME_ORDERING])
@pytest.mark.parametrize("seed", range(25))
def test_base_and_several_blocks_match_the_rule(
        mode: MergeMode, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(0, 40)
    base = [(f"k{i:03d}", rng.randrange(5), f"b{i}") for i in range(n)]
    pool = [k for k, _, _ in base] + [f"n{i:03d}" for i in range(rng.randrange(1, 15))]
    blocks = []
    for b in range(rng.randrange(2, 6)):
        chosen = rng.sample(pool, rng.randrange(1, len(pool) + 1))  # distinct in the block
        blocks.append([(k, rng.randrange(5), f"l{b}.{j}") for j, k in enumerate(chosen)])
    event_time = mode is MergeMode.EVENT_TIME_ORDERING
    expected: set[tuple[str, int, str]] = set(base)
    for block in blocks:
        expected = _oracle(sorted(expected), block, event_time)
    layers = [DataLayer(_table(block)) for block in blocks]
    base_table = _table(base) if base else None
    merged = merge_layers(base_table, layers, mode=mode, ordering_field="ts", schema=SCHEMA)
    got = [tuple(r.values()) for r in merged.to_pylist()]
    assert len(got) == len(set(got))
    assert set(got) == expected
    with_delete = merge_layers(base_table, [*layers, DeleteLayer(pa.array(["absent"]))],
                               mode=mode, ordering_field="ts", schema=SCHEMA)
    assert {tuple(r.values()) for r in with_delete.to_pylist()} == expected


def test_merge_result_has_the_target_schema_metadata_not_the_base_file_s(
        tmp_path: Path) -> None:
    """A base file read with its footer's key-value metadata (its bloom filter) and merged:
    the result carries the target schema's metadata only, so a copy-on-write rewrite does
    not write the old file's bloom filter into the new file's Arrow schema."""
    base = pa.table({KEY: ["a", "b"], "ts": [1, 1], "v": ["x", "y"]}).replace_schema_metadata(
        {"org.apache.hudi.bloomfilter": "old filter"})
    log = pa.table({KEY: ["a"], "ts": [2], "v": ["z"]})
    merged = merge_layers(base, [DataLayer(log)], mode=MergeMode.EVENT_TIME_ORDERING,
                          ordering_field="ts", schema=SCHEMA)
    assert merged.schema.metadata is None
    assert sorted(merged.to_pylist(), key=lambda r: r[KEY]) == [
        {KEY: "a", "ts": 2, "v": "z"}, {KEY: "b", "ts": 1, "v": "y"}]
    table = Table.create(str(tmp_path / "t"), name="m", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "SIMPLE"})
    table.upsert(pa.table({"key": ["a", "b"], "ts": [1, 1], "part": ["x", "x"], "v": [1, 2]}))
    table.upsert(pa.table({"key": ["a"], "ts": [2], "part": ["x"], "v": [3]}))
    first, second = sorted((tmp_path / "t" / "x").glob("*.parquet"))
    sizes = [len(pq.ParquetFile(f).metadata.metadata[b"ARROW:schema"]) for f in (first, second)]
    assert sizes[1] == sizes[0]


@pytest.mark.parametrize("values", [
    pa.array([], pa.string()), pa.array(["a", None, "b", None, "a"]),
    pa.array(["k1", "k2", "k3"]), pa.array([None, None], pa.string()),
    pa.array(["x", "x"], pa.large_string()), pa.array([1, 2, 2, None]),
])
def test_distinct_counts_as_count_distinct(values: pa.Array) -> None:
    from engine.merge.record_merger import _distinct

    assert _distinct(values) == pc.count_distinct(values).as_py()


def test_nan_ordering_is_greatest_in_the_shortcut_and_the_general_rule() -> None:
    """A NaN ordering value is greater than every number and ties with NaN (Java's
    ``Double.compareTo``): the shortcut (one block of distinct keys) and the general rule
    (the same block and a delete of an absent key) merge alike."""
    schema = pa.schema([pa.field(KEY, pa.string()), pa.field("ts", pa.float64()),
                        pa.field("v", pa.string())])
    nan = float("nan")
    base = pa.table({KEY: ["a", "b", "c", "d"], "ts": [nan, 1.0, nan, 2.0],
                     "v": ["ba", "bb", "bc", "bd"]}, schema=schema)
    log = pa.table({KEY: ["a", "b", "c", "d"], "ts": [5.0, nan, nan, 1.0],
                    "v": ["la", "lb", "lc", "ld"]}, schema=schema)
    for layers in ([DataLayer(log)], [DataLayer(log), DeleteLayer(pa.array(["absent"]))]):
        merged = merge_layers(base, layers, mode=MergeMode.EVENT_TIME_ORDERING,
                              ordering_field="ts", schema=schema)
        assert sorted(merged.column("v").to_pylist()) == ["ba", "bd", "lb", "lc"]
