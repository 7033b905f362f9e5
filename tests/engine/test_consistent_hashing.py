"""Consistent-hashing bucket index: hash, ring and metadata files
(``../shared/docs/hudi-table-services.md`` §9: its worked example and hash vectors)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import CorruptTableError
from engine.index.consistent_hashing import (
    INIT_INSTANT,
    HashingMetadata,
    Node,
    hash_record_keys,
    initial_nodes,
    load_metadata,
    metadata_folder,
    xxh32,
    xxh32_array,
)
from engine.timeline.active import Timeline

# The doc's §9.2 example: partition 2024/01/01, 4 buckets.
EXAMPLE = [(536870912, "1eb58b75-0259-331f-a0f0-4963fe7228fe"),
           (1073741824, "6aa8b131-52a2-33a2-ab0a-1845c7711cd2"),
           (1610612736, "c482fdfe-44fb-3a0d-a044-c18e37687356"),
           (2147483647, "fcb4ecfc-7736-3784-a0af-373dea232423")]


def test_xxh32_reference_values() -> None:
    assert xxh32(b"") == 0x02CC5D05  # the reference implementation's empty-input value
    assert xxh32(b"", 1) != xxh32(b"")
    # The doc's key hashes (masked to 31 bits).
    assert [xxh32(k.encode()) & 0x7FFFFFFF for k in ("1", "2", "abc")] == \
        [921487538, 205742900, 852579327]


def test_vectorized_xxh32_equals_scalar_for_every_length() -> None:
    rng = random.Random(7)
    alphabet = "abcXYZ019:,-_ éü€😀"
    values = ["".join(rng.choice(alphabet) for _ in range(n)) for n in range(0, 80)]
    values += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 200)))
               for _ in range(300)]
    got = xxh32_array(pa.array(values)).tolist()
    assert got == [xxh32(v.encode()) for v in values]
    sliced = pa.array(values).slice(5, 50)  # an offset into the buffers
    assert xxh32_array(sliced).tolist() == [xxh32(v.encode()) for v in values[5:55]]
    assert xxh32_array(pa.array([], pa.string())).tolist() == []


def test_initial_ring_and_routing_match_the_worked_example() -> None:
    nodes = initial_nodes("2024/01/01", 4)
    assert [(n.value, n.file_id_prefix) for n in nodes] == EXAMPLE
    meta = HashingMetadata.initial("2024/01/01", 4)
    assert meta.instant == INIT_INSTANT and meta.seq_no == 0
    ids = meta.file_ids(pa.array(["1", "2", "abc"]))
    assert ids == [f"{EXAMPLE[1][1]}-0", f"{EXAMPLE[0][1]}-0", f"{EXAMPLE[1][1]}-0"]
    # wrap-around: with the last node deleted, hashes above the new last value go first
    cut = HashingMetadata("p", "20240101000000000", 4, 1, tuple(nodes[:3]))
    assert cut.node_indices(pa.array([2147483647]).to_numpy()).tolist() == [0]


def test_complex_keys_hash_the_joined_values() -> None:
    keys = pa.array(["id:7,region:eu", "plain", "id:__null__,region:x"])
    got = hash_record_keys(keys, ["id", "region"]).tolist()
    assert got == [xxh32(b"7eu") & 0x7FFFFFFF, xxh32(b"plain") & 0x7FFFFFFF,
                   xxh32(b"nullx") & 0x7FFFFFFF]


def test_metadata_json_as_jackson_writes_it_and_back() -> None:
    meta = HashingMetadata.initial("2024/01/01", 2)
    text = meta.to_json().decode()
    assert text.startswith('{\n  "version" : 0,\n  "partitionPath" : "2024/01/01",\n'
                           '  "instant" : "00000000000000",\n  "numBuckets" : 2,\n'
                           '  "seqNo" : 0,\n  "nodes" : [ {\n    "value" : 1073741824,\n')
    assert text.endswith('"tag" : "NORMAL"\n  } ]\n}')
    assert json.loads(text)["nodes"][1]["value"] == 2147483647
    assert HashingMetadata.from_json(meta.to_json()) == meta
    legacy = json.dumps({"version": 0, "partitionPath": "", "instant": INIT_INSTANT,
                         "numBuckets": 1, "seqNo": 0,
                         "nodes": [{"value": 2147483647, "fileIdPfx": "abc"}]}).encode()
    assert HashingMetadata.from_json(legacy).nodes == (Node(2147483647, "abc"),)


def test_load_metadata_follows_the_commit_markers(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts")
    table.upsert(pa.table({"id": ["a"], "ts": [1]}))
    storage = table.storage
    timeline = Timeline.load(storage, table.config)
    done = timeline.completed_data_instants[-1].requested_time
    folder = metadata_folder("p")
    assert load_metadata(storage, timeline, "p") is None
    init = HashingMetadata.initial("p", 2)
    storage.write_new(f"{folder}/{init.file_name}", init.to_json())
    assert load_metadata(storage, timeline, "p") == init  # the init file commits itself
    assert storage.exists(f"{folder}/{INIT_INSTANT}.commit")
    # a resize's metadata: ignored while its instant is pending, committed once completed
    pending = HashingMetadata("p", "99990101000000000", 2, 1, init.nodes[:1])
    storage.write_new(f"{folder}/{pending.file_name}", pending.to_json())
    assert load_metadata(storage, timeline, "p") == init
    resized = HashingMetadata("p", done, 2, 1, (Node(5, "x"), *init.nodes))
    storage.write_new(f"{folder}/{resized.file_name}", resized.to_json())
    assert load_metadata(storage, timeline, "p") == resized
    assert storage.exists(f"{folder}/{done}.commit")
    storage.write_replace(f"{folder}/{done}.hashing_meta", b"{not json")
    with pytest.raises(CorruptTableError, match="hashing_meta"):
        load_metadata(storage, timeline, "p")
