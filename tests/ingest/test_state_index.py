"""The GLOBAL_STATE index's shard layout and image (``ingest/state_index.py``), without Spark:
blobs, the meta value, and an image fed random changes against a plain dict."""

from __future__ import annotations

import hashlib
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.global_index_processor import _missing_deltas
from ingest.state_index import (
    Meta,
    ShardImage,
    decode_blob,
    encode_blob,
    entries_table,
    entry_schema,
    key_digests,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_key_digests_are_md5_of_utf8() -> None:
    assert key_digests(["a", "ключ"]) == [hashlib.md5(b"a").digest(),
                                          hashlib.md5("ключ".encode()).digest()]


def test_blob_round_trip_keeps_every_column() -> None:
    schema = entry_schema(pa.int64())
    table = entries_table(schema, key_digests(["k1", "k2", "k3"]),
                          [("p=1", "f-1", 5), (None, None, 7), None])
    back = decode_blob(encode_blob(table))
    assert back.equals(table)
    assert back.column("present").to_pylist() == [True, True, False]


def test_meta_round_trip_and_fold_rule() -> None:
    meta = Meta("b0", 2, 1000, 3, [(1, "t1", 100), (2, "t2", 200)])
    assert Meta.from_row(meta.to_row()) == meta
    assert Meta.from_row(None) == Meta()
    assert meta.token == "t2" and meta.delta_rows == 300
    assert not meta.due_for_fold(min_rows=4096)        # too few rows changed
    assert meta.due_for_fold(min_rows=100)              # 300 * 4 >= 1000
    assert not Meta("b0", 2, 2000, 3, meta.deltas).due_for_fold(min_rows=100)
    assert meta.due_for_fold(max_deltas=2)              # too many deltas, however small
    assert not Meta("b0").due_for_fold(min_rows=0)      # nothing to fold


def test_missing_deltas_finds_where_an_image_stands() -> None:
    meta = Meta("b", 1, 10, 5, [(3, "t3", 1), (4, "t4", 1)])
    assert _missing_deltas("t4", meta) == []
    assert _missing_deltas("b", meta) == [(3, "t3", 1), (4, "t4", 1)]
    assert _missing_deltas("t3", meta) == [(4, "t4", 1)]
    # a discarded version's token, a folded delta, another query: rebuild
    assert _missing_deltas("t5", meta) is None
    assert _missing_deltas(None, meta) is None
    assert _missing_deltas(None, Meta()) == []


@pytest.mark.parametrize("seed", range(6))
def test_image_equals_a_dict_through_random_changes_and_merges(seed: int) -> None:
    """Base chunks, then deltas of random sizes (some large enough to merge into the sorted
    arrays, some kept in the dict), removals and re-inserts; a snapshot re-read as a base
    gives the same image."""
    rng = random.Random(seed)
    schema = entry_schema(pa.string())
    image, oracle = ShardImage(pa.string()), {}
    keys = [f"key-{i}" for i in range(rng.choice([50, 3_000, 70_000]))]

    def change(batch: list[str]) -> None:
        entries = []
        for k in batch:
            roll = rng.random()
            entry = None if roll < 0.2 else (
                (None, None, f"o{rng.randrange(9)}") if roll < 0.3
                else (f"p={rng.randrange(3)}", f"f-{rng.randrange(5)}", f"o{rng.randrange(9)}"))
            entries.append(entry)
            if entry is None:
                oracle.pop(k, None)
            else:
                oracle[k] = entry
        image.add(entries_table(schema, key_digests(batch), entries))

    change(keys[: len(keys) // 2])  # a base
    for _ in range(12):
        size = rng.choice([1, 10, len(keys) // 3])
        change(rng.sample(keys, min(size, len(keys))))
        probe = rng.sample(keys, min(200, len(keys)))
        assert image.lookup(key_digests(probe)) == [oracle.get(k) for k in probe]
    assert len(image) == len(oracle)
    rebuilt = ShardImage(pa.string())
    rebuilt.add(decode_blob(encode_blob(image.snapshot())))
    assert rebuilt.lookup(key_digests(keys)) == [oracle.get(k) for k in keys]
    assert image.lookup([]) == []


def test_later_rows_of_one_table_win() -> None:
    """A base with a key twice (a table that stores it twice): the last row read wins."""
    image = ShardImage(pa.int64())
    d = key_digests(["k", "k", "j"])
    image.add(entries_table(entry_schema(pa.int64()), d,
                            [("p=1", "f1", 1), ("p=2", "f2", 2), ("p=1", "f1", 3)]))
    assert image.lookup(key_digests(["k", "j", "x"])) == [("p=2", "f2", 2), ("p=1", "f1", 3),
                                                          None]
    assert len(image) == 2


def test_a_checkpoint_of_the_per_key_layout_is_refused(tmp_path: Path) -> None:
    """The state schema file Spark wrote for the per-key operator of earlier versions (copied
    from a real checkpoint): the job refuses the checkpoint, naming what to do."""
    from engine.errors import TerminalError
    from ingest.global_index import check_state_layout

    schema_dir = tmp_path / "ck" / "state" / "0" / "_stateSchema" / "default"
    schema_dir.mkdir(parents=True)
    check_state_layout(str(tmp_path / "ck"))  # no state yet: fine
    shutil.copy(FIXTURES / "global_state_v1_state_schema", schema_dir / "0_x")
    with pytest.raises(TerminalError, match="new checkpoint location"):
        check_state_layout(str(tmp_path / "ck"))
    check_state_layout(str(tmp_path / "missing"))
