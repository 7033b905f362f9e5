"""Arrival order (:mod:`ingest.resolve`): (topic, Kafka partition, offset), nulls last, ties in
input order — the order a micro-batch's versions of a key are resolved in, whatever order the
shuffle hands the rows over in. Checked against a plain Python sort on seeded random rows."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from ingest.resolve import arrival_order, arrival_positions
from ingest.rows import KAFKA_PARTITION, OFFSET, TOPIC


def _rows(rng: random.Random, n: int) -> pa.Table:
    return pa.table({
        TOPIC: pa.array([rng.choice(["b", "a", "ab", "a.b", None]) for _ in range(n)],
                        pa.string()),
        KAFKA_PARTITION: pa.array([rng.choice([0, 1, 2, 10, None]) for _ in range(n)],
                                  pa.int32()),
        OFFSET: pa.array([rng.choice([0, 1, 3, 5, 2**40, None]) for _ in range(n)], pa.int64()),
        "row": pa.array(range(n), pa.int64()),
    })


def _oracle(rows: pa.Table, groups: list[int] | None = None) -> list[int]:
    """Row numbers in arrival order by Python's stable sort (None sorts after any value)."""
    def last(v: object) -> tuple[bool, object]:
        return (v is None, v if v is not None else 0)

    t, p, o = (rows.column(c).to_pylist() for c in (TOPIC, KAFKA_PARTITION, OFFSET))
    g = groups if groups is not None else [0] * rows.num_rows
    return sorted(range(rows.num_rows),
                  key=lambda i: (g[i], last(t[i]), last(p[i]), last(o[i])))


def test_arrival_positions_random_rows_match_python_sort() -> None:
    rng = random.Random(36)
    for _ in range(300):
        rows = _rows(rng, rng.randint(0, 60))
        assert arrival_positions(rows).tolist() == _oracle(rows)
        assert arrival_order(rows).column("row").to_pylist() == _oracle(rows)


def test_arrival_positions_within_groups_orders_each_group() -> None:
    rng = random.Random(7)
    for _ in range(200):
        rows = _rows(rng, rng.randint(0, 60))
        groups = [rng.randint(0, 3) for _ in range(rows.num_rows)]
        got = arrival_positions(rows, np.array(groups, np.int64)).tolist()
        assert got == _oracle(rows, groups)


def test_arrival_positions_chunked_columns_without_topics() -> None:
    rows = pa.concat_tables([
        pa.table({TOPIC: pa.array([None, None], pa.string()),
                  KAFKA_PARTITION: pa.array([1, 0], pa.int32()),
                  OFFSET: pa.array([4, 9], pa.int64())}),
        pa.table({TOPIC: pa.array([None], pa.string()),
                  KAFKA_PARTITION: pa.array([0], pa.int32()),
                  OFFSET: pa.array([2], pa.int64())}),
    ])
    assert arrival_positions(rows).tolist() == [2, 1, 0]
