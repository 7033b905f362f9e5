"""Seeded random sequences over RECORD_INDEX tables (issue 34, "How it is judged").

Upserts with partition moves and late versions, deletes with and without ordering values,
compaction, clustering, clean and a rebuild of the metadata table, on COPY_ON_WRITE and
MERGE_ON_READ. After every step:

* our snapshot read and hudi-rs's equal the oracle (:class:`tests.helpers.Oracle`);
* ``metadata validate`` is clean and checked every live key;
* the decoded ``record_index`` maps every key to the file group hudi-rs reads it from;
* a key-filtered read (``read(filters=[("key", "=", k)])``, pruned by the record index)
  equals the full read filtered, for live keys, deleted keys and a key never written.

The workload never writes a version older than a delete of its key (deleted keys are never
written again): what such a version reads depends on whether compaction folded the delete
(docs/engine.md, "Delete policies"). CI size: one seed per table type; ``TIDELAKE_SOAK=1``
runs more seeds and longer sequences.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from tests.engine.helpers import (
    COLUMNS,
    PARTITIONS,
    SCHEMA,
    hudi_rs_locations,
    random_batch,
    record_index_entries,
)
from tests.helpers import Oracle, hudi_rs_read, sorted_rows
from tests.soak import soak

OPTIONS = {
    "hoodie.index.type": "RECORD_INDEX",
    "hoodie.clean.automatic": "false",
    "hoodie.archive.automatic": "false",
    "hoodie.cleaner.commits.retained": "2",
    "hoodie.compact.inline": "false",
    # several file groups per partition, so keys move between groups
    "hoodie.parquet.max.file.size": "12000",
    "hoodie.parquet.small.file.limit": "8000",
    "hoodie.copyonwrite.record.size.estimate": "400",
    "hoodie.metadata.record.index.min.filegroup.count": "4",
}

STEPS = soak(14, 40)
SEEDS = soak([1], [1, 2, 3, 4])


def _schedule(rng: random.Random, table_type: str) -> list[str]:
    """The step kinds of one sequence: two upserts first, then every kind at least once
    (compaction on MERGE_ON_READ only) among random ones, upserts and deletes the most."""
    services = ["compact"] if table_type == "MERGE_ON_READ" else []
    services += ["cluster", "clean", "rebuild"]
    required = ["delete", "ordered delete", "ordered delete", *services]
    pool = ["upsert"] * 5 + ["delete", "ordered delete", "ordered delete"] + services
    rest = required + [rng.choice(pool) for _ in range(STEPS - 2 - len(required))]
    rng.shuffle(rest)
    return ["upsert", "upsert", *rest]


def _moves(rng: random.Random, oracle: Oracle) -> list[dict[str, Any]]:
    """Versions of up to two held keys in another partition (late ones lose: nothing moves)."""
    held = sorted(oracle.rows)
    out = []
    for key in rng.sample(held, k=min(len(held), rng.randint(0, 2))):
        region = rng.choice([p for p in PARTITIONS if p != oracle.rows[key]["region"]])
        out.append({"key": key, "ts": rng.randint(0, 50), "region": region,
                    "amount": rng.random(), "note": "moved"})
    return out


def _delete(table: Table, oracle: Oracle, rng: random.Random, gone: list[str], *,
            ordered: bool) -> str:
    """Delete a few held keys: without an ordering value (natural order) or with one that
    may lose, tie or win against the held versions. Returns the step's name."""
    victims = rng.sample(sorted(oracle.rows), k=min(len(oracle.rows), rng.randint(1, 5)))
    columns: dict[str, Any] = {"key": victims,
                               "region": [oracle.rows[k]["region"] for k in victims]}
    ordering = rng.randint(0, 50) if ordered else None
    if ordering is not None:
        columns["ts"] = pa.array([ordering] * len(victims), pa.int64())
    instant = table.delete(pa.table(columns))
    oracle.delete(victims, ordering=ordering, instant=instant)
    gone.extend(k for k in victims if k not in oracle.rows)
    return "delete" if ordering is None else "ordered delete"


def _check(table: Table, oracle: Oracle, rng: random.Random, gone: list[str],
           where: str) -> None:
    """Every property the module docstring lists, after one step."""
    expected = oracle.snapshot()
    ours = table.read()
    assert sorted_rows(ours, COLUMNS) == expected, where
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == expected, where
    result = table.validate_metadata()
    assert result.ok, (where, [str(d) for d in result.differences])
    assert result.keys_checked == len(oracle.rows), where
    assert record_index_entries(table) == hudi_rs_locations(table.path), where
    held = sorted(oracle.rows)
    keys = rng.sample(held, k=min(3, len(held)))
    keys += [*rng.sample(gone, k=min(2, len(gone))), "never-written"]
    full = sorted_rows(ours, COLUMNS)
    for key in keys:
        filtered = sorted_rows(table.read(filters=[("key", "=", key)]), COLUMNS)
        assert filtered == [r for r in full if r["key"] == key], (where, key)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_record_index_random_steps_readers_validate_and_key_reads_agree(
        tmp_path: Path, table_type: str, seed: int) -> None:
    rng = random.Random(f"record-index-random-{table_type}-{seed}")
    table = Table.create(str(tmp_path / "t"), name="t", table_type=table_type,
                         record_key="key", precombine="ts", partition_by=["region"],
                         options=OPTIONS)
    oracle, counter, gone = Oracle(), [0], []
    done: dict[str, int] = {}
    for step, kind in enumerate(_schedule(rng, table_type)):
        if kind == "upsert" or not oracle.rows:
            batch = random_batch(rng, oracle, counter, rng.randint(1, 30))
            batch += _moves(rng, oracle)
            done["moves"] = done.get("moves", 0) + sum(
                1 for r in batch if r["key"] in oracle.rows
                and oracle.rows[r["key"]]["region"] != r["region"])
            oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
            name = "upsert"
        elif kind in ("delete", "ordered delete"):
            name = _delete(table, oracle, rng, gone, ordered=kind == "ordered delete")
        elif kind == "compact":
            name = "compact" if table.compact().completed else "compact (nothing)"
        elif kind == "cluster":
            name = "cluster" if table.cluster().completed else "cluster (nothing)"
        elif kind == "clean":
            table.clean()
            name = "clean"
        else:
            table.rebuild_metadata()
            name = "rebuild"
        done[name] = done.get(name, 0) + 1
        _check(table, oracle, rng, gone, f"seed {seed} step {step} ({name}): {done}")
    assert done.get("moves", 0) and done.get("delete") and done.get("ordered delete"), done
    assert done.get("cluster") and (table_type != "MERGE_ON_READ" or done.get("compact")), done
