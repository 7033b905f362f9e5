"""Helpers shared by the engine's test modules: the random workload of the differential tests
(``test_differential``, ``test_services_differential``)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa

from tests.helpers import COMMIT_TIME, Oracle

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
