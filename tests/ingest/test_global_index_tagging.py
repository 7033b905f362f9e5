"""The GLOBAL_STATE operator's tagging of a shard's rows (``ingest/global_index_processor.py``)
without Spark: keys tagged column-wise must come out as the key-by-key rule
(:func:`engine.merge.policy.resolve_key` through ``_tag``) tags them, row for row and entry for
entry, on hostile batches (several versions of a key, ties of the ordering field, deletes
with and without ordering values, null and NaN ordering values, -0.0 beside 0.0, keys moving
partitions).

Which version decides a key column-wise is the engine's
(:func:`engine.merge.policy.deciding_rows`, checked against ``resolve_key`` in
``tests/engine/test_merge_policy.py``); this checks that the operator applies it (the versions
that do not decide write nothing, the deciding one is placed) as ``_tag`` does."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from engine.schema import PARTITION_PATH, RECORD_KEY
from ingest.global_index import GlobalIndexSpec
from ingest.global_index_processor import GlobalIndexProcessor
from ingest.rows import (
    DELETE,
    FILE_ID,
    KAFKA_PARTITION,
    OFFSET,
    OP,
    ORDERING,
    ORDERING_NULL,
    TOPIC,
    UPSERT,
    VALUE,
)
from ingest.state_index import Entry, ShardImage, entries_table, key_digests

PARTITIONS = ["p0", "p1", "p2"]


class KeyByKey(GlobalIndexProcessor):
    """The operator as it tagged before keys with several versions went column-wise: only
    keys with one version take the column-wise path; the others go through ``_tag``."""

    def _deciding_versions(self, rows: pa.Table, starts: np.ndarray, ends: np.ndarray,
                           cols: dict[str, np.ndarray]) -> np.ndarray:
        return np.where(ends - starts == 1, starts, -1)


def _processor(cls: type[GlobalIndexProcessor], spec: GlobalIndexSpec) -> GlobalIndexProcessor:
    processor = cls(spec)
    processor._moves, processor._groups = None, {}  # what init() sets, without a state handle
    return processor


def _batch(rng: random.Random, ordering_type: pa.DataType, keys: int, rows: int) -> pa.Table:
    def ordering() -> Any:
        if rng.random() < 0.05:
            return None
        if pa.types.is_floating(ordering_type) and rng.random() < 0.05:
            return float("nan")
        value = rng.randint(0, 4)  # few values: many ties
        return _float(rng, value) if pa.types.is_floating(ordering_type) else value

    ops = [DELETE if rng.random() < 0.15 else UPSERT for _ in range(rows)]
    orderings = [ordering() for _ in range(rows)]
    return pa.table({
        RECORD_KEY: pa.array([f"k{rng.randrange(keys)}" for _ in range(rows)], pa.string()),
        OP: pa.array(ops, pa.int8()),
        PARTITION_PATH: pa.array([None if op == DELETE else rng.choice(PARTITIONS)
                                  for op in ops], pa.string()),
        FILE_ID: pa.nulls(rows, pa.string()),
        ORDERING: pa.array(orderings, ordering_type),
        ORDERING_NULL: pa.array([o is None for o in orderings], pa.bool_()),
        TOPIC: pa.array([rng.choice(["a", "b"]) for _ in range(rows)], pa.string()),
        KAFKA_PARTITION: pa.array([rng.randrange(2) for _ in range(rows)], pa.int32()),
        OFFSET: pa.array(rng.sample(range(10 * rows), rows), pa.int64()),
        VALUE: pa.array([f"v{i}".encode() for i in range(rows)], pa.binary()),
    })


def _float(rng: random.Random, value: int) -> float:
    """``value`` as a float; zero as -0.0 half the time (Java orders it below 0.0)."""
    return -0.0 if value == 0 and rng.random() < 0.5 else float(value)


def _image(rng: random.Random, spec: GlobalIndexSpec, keys: int) -> ShardImage:
    image = ShardImage(spec.state_ordering_type)
    stored: list[str] = []
    entries: list[Entry | None] = []
    for k in range(keys):
        roll = rng.random()
        if roll < 0.3:
            continue  # absent
        ordering = rng.randint(0, 4)
        value = (_float(rng, ordering) if pa.types.is_floating(spec.state_ordering_type)
                 else ordering)
        stored.append(f"k{k}")
        entries.append((None, None, value) if roll < 0.4 else
                       (rng.choice(PARTITIONS), f"stored-{k}", value))
    image.add(entries_table(image.schema, key_digests(stored), entries))
    return image


def _nan(value: Any) -> Any:
    """NaN and -0.0 as strings, so that equal results compare equal and -0.0 differs from
    0.0."""
    if isinstance(value, tuple):
        return tuple(_nan(v) for v in value)
    if isinstance(value, float) and (value != value or str(value) == "-0.0"):
        return str(value)
    return value


def _sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    rows = [{k: _nan(v) for k, v in row.items()} for row in table.to_pylist()]
    return sorted(rows, key=lambda r: (r[RECORD_KEY], r[TOPIC], r[KAFKA_PARTITION], r[OFFSET],
                                       r[OP], str(r[PARTITION_PATH])))


@pytest.mark.parametrize("ordering_type", [pa.int64(), pa.float64()])
@pytest.mark.parametrize("update_partition_path", [True, False])
@pytest.mark.parametrize("event_time", [True, False])
def test_tag_rows_column_wise_equals_key_by_key_on_hostile_batches(
        event_time: bool, update_partition_path: bool, ordering_type: pa.DataType) -> None:
    spec = GlobalIndexSpec(table_name="t", num_buckets=4, bucket_groups={},
                           event_time=event_time, ordering_type=ordering_type,
                           update_partition_path=update_partition_path)
    rng = random.Random(f"{event_time}-{update_partition_path}-{ordering_type}")
    several = 0
    for _ in range(20):
        keys = rng.choice([3, 20, 200])
        batch = _batch(rng, ordering_type, keys, rng.choice([1, 10, 300]))
        if event_time:  # an upsert must carry an ordering value under event time (prepare)
            batch = batch.filter(pa.compute.or_(pa.compute.equal(batch.column(OP), DELETE),
                                                pa.compute.invert(batch.column(ORDERING_NULL))))
        image_seed = rng.random()
        got = _processor(GlobalIndexProcessor, spec)._tag_rows(
            batch, _image(random.Random(image_seed), spec, keys))
        want = _processor(KeyByKey, spec)._tag_rows(
            batch, _image(random.Random(image_seed), spec, keys))
        assert _sorted_rows(got[0]) == _sorted_rows(want[0])
        assert {d: _nan(e) for d, e in zip(got[1], got[2], strict=True)} == \
            {d: _nan(e) for d, e in zip(want[1], want[2], strict=True)}
        assert len(got[1]) == len(want[1])
        counts = np.unique(batch.column(RECORD_KEY).to_numpy(zero_copy_only=False),
                           return_counts=True)[1]
        several += int((counts > 1).sum())
    assert several > 50  # the batches had keys with several versions
