"""The streaming sink with ``index="RECORD_INDEX"`` (``ingest/record_index.py``): keys looked
up in the metadata table's record_index in executor tasks, only in the file groups they hash to.

Checked against the event oracle (``tests/ingest/helpers.py``) after every micro-batch, read
by tidelake and by hudi-rs; the record_index, decoded with our MDT reader, must point every
live key at the file group hudi-rs reads it from, and hold no other key.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import InvalidOptionError
from engine.metadata.keys import file_group_index
from engine.metadata.record_index import group_slices
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import WriteTotals
from ingest.sink import RECORD_INDEX, HudiStreamingSink, SinkConfig
from tests.engine.helpers import hudi_rs_locations, record_index_entries
from tests.ingest.helpers import (
    Event,
    EventOracle,
    data_frame,
    decoder,
    hudi_rs_rows,
    kafka_rows,
    random_batches,
    table_rows,
)
from tests.soak import SOAK, soak
from tests.spark_session import spark  # noqa: F401

GROUPS = 4
OPTIONS = {
    # several record_index file groups, so a batch can hash to a few of them only
    "hoodie.metadata.record.index.min.filegroup.count": str(GROUPS),
    "hoodie.metadata.record.index.max.filegroup.count": str(GROUPS),
    # several data file groups per partition: inserts fill small groups, then new ones
    "hoodie.parquet.max.file.size": "12000",
    "hoodie.parquet.small.file.limit": "8000",
    "hoodie.copyonwrite.record.size.estimate": "400",
}


def _sink(path: str, table_type: str = "MERGE_ON_READ") -> HudiStreamingSink:
    return HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id",
                                        precombine="ts", partition_by=["city"],
                                        table_type=table_type, index=RECORD_INDEX,
                                        options=OPTIONS, write_parallelism=3))


def _index_entries(path: str) -> dict[str, tuple[str, str]]:
    """key → (partition, file id) of the merged record_index, decoded group by group."""
    return record_index_entries(Table.open(path))


@pytest.mark.spark
@pytest.mark.slow
# CI size: MERGE_ON_READ (logs, moves across file groups); soak size adds COPY_ON_WRITE.
@pytest.mark.parametrize(("table_type", "seed"), soak([("MERGE_ON_READ", 31)],
                                                      [("MERGE_ON_READ", 31),
                                                       ("COPY_ON_WRITE", 32)]))
def test_record_index_sink_moves_deletes_late_versions_equal_oracle_and_hudi_rs(
        spark: Any, tmp_path: Path, table_type: str, seed: int) -> None:  # noqa: F811
    rng = random.Random(seed)
    path = str(tmp_path / "t")
    sink = _sink(path, table_type)
    oracle = EventOracle()
    offsets: dict[int, int] = {}
    clock = [1_000]
    for batch_id, events in enumerate(random_batches(rng, 3, 60, moves=True, tombstones=True,
                                                     clock=clock)):
        sink.process_batch(data_frame(spark, kafka_rows(events, "ev", offsets)), batch_id)
        oracle.apply(events)
        result = sink.last_result
        assert result is not None and result.errors == 0 and result.instant_time
        assert table_rows(path) == oracle.rows, f"batch {batch_id}"
        assert hudi_rs_rows(path) == oracle.rows, f"batch {batch_id} (hudi-rs)"
        if batch_id:
            # The batch that creates the table writes no metadata table (there is none yet);
            # the next one's start builds it from the table, then every commit keeps it.
            assert result.index_groups_read
            assert _index_entries(path) == hudi_rs_locations(path), f"batch {batch_id} (index)"
    # The write tasks know which keys the lookup located in their group (the engine's
    # located_keys): they count those as updates and the others as inserts, as the engine's
    # own upsert does, and keep the record_index right (a MERGE_ON_READ append of upserts
    # alone without reading the slice). Updates in place (one key twice), a key moving to
    # the partition of the updates, a tombstone, new keys:
    by_city: dict[str, list[str]] = {}
    for key, (city, _, _) in sorted(oracle.rows.items()):
        by_city.setdefault(city, []).append(key)
    here, there = sorted(by_city, key=lambda c: -len(by_city[c]))[:2]
    ts = clock[0] + 1_000
    events = [Event(k, ts, here, 2.0) for k in by_city[here][:5]]
    events += [Event(by_city[here][0], ts + 1, here, 2.5), Event(by_city[there][0], ts, here, 3.0),
               Event(by_city[there][1], tombstone=True)]
    events += [Event(f"new{i}", ts, (here, there)[i % 2], 4.0) for i in range(4)]
    engine_copy = tmp_path / "engine"
    shutil.copytree(path, engine_copy)
    sink.process_batch(data_frame(spark, kafka_rows(events, "ev", offsets)), 3)
    oracle.apply(events)
    result = sink.last_result
    assert result is not None and result.errors == 0 and result.instant_time
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
    assert _index_entries(path) == hudi_rs_locations(path)
    # 5 in place; 4 new and the moved key; the moved key's old copy and the tombstoned key
    assert _totals(path, result.instant_time) == (5, 5, 2)
    # The engine's upsert of the same winners (the tombstone aside) counts the same.
    winners = {e.id: e for e in events if not e.tombstone}  # arrival order: the last wins
    upserted = Table.open(str(engine_copy), OPTIONS).upsert(pa.table({
        "id": list(winners), "ts": [e.ts for e in winners.values()],
        "city": [e.city for e in winners.values()],
        "fare": [e.fare for e in winners.values()]}))
    assert _totals(str(engine_copy), upserted) == (5, 5, 1)
    # A replayed batch writes nothing.
    sink.process_batch(data_frame(spark, kafka_rows([Event("zz", 1, "oslo", 1.0)], "ev", {})),
                       3)
    assert sink.last_result is not None and sink.last_result.skipped


def _totals(path: str, instant_time: str) -> tuple[int, int, int]:
    """Updates, inserts and deletes a data commit of the table counts."""
    table = Table.open(path)
    timeline = Timeline.load(table.storage, table.config)
    instant, = (i for i in timeline.completed_data_instants
                if i.requested_time == instant_time)
    totals = WriteTotals.of(timeline.commit_metadata(instant).write_stats)
    return (totals.update_records_written, totals.insert_records_written,
            totals.records_deleted)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.skipif(not SOAK, reason="soak size only (TIDELAKE_SOAK=1): the engine's "
                    "test_record_index_lookup_reads_only_the_groups_its_keys_hash_to checks "
                    "the same lookup at the CI size")
def test_record_index_sink_reads_only_the_groups_the_batch_keys_hash_to(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    sink = _sink(path)
    keys = [f"k{i:04d}" for i in range(200)]
    offsets: dict[int, int] = {}
    first = [Event(k, 100, "oslo", 1.0) for k in keys]
    sink.process_batch(data_frame(spark, kafka_rows(first, "ev", offsets)), 0)
    # Updates (one moving partition) and a tombstone, all of keys hashing to groups 0 and 2.
    chosen = [k for k in keys if file_group_index(k, GROUPS) in (0, 2)][:12]
    events = [Event(k, 200, "oslo", 2.0) for k in chosen[:10]]
    events += [Event(chosen[10], 200, "rome", 3.0), Event(chosen[11], tombstone=True)]
    sink.process_batch(data_frame(spark, kafka_rows(events, "ev", offsets)), 1)
    result = sink.last_result
    assert result is not None and result.instant_time
    table = Table.open(path)  # the record_index was built when batch 1 started
    pieces = group_slices(table.storage, Timeline.load(table.storage, table.config))
    assert len(pieces) == GROUPS
    assert set(result.index_groups_read) == {pieces[0].file_id, pieces[2].file_id}
    expected = {k: ("oslo", 100, 1.0) for k in keys}
    expected.update({k: ("oslo", 200, 2.0) for k in chosen[:10]})
    expected[chosen[10]] = ("rome", 200, 3.0)
    del expected[chosen[11]]
    assert table_rows(path) == expected
    assert hudi_rs_rows(path) == expected
    assert _index_entries(path) == hudi_rs_locations(path)


def test_record_index_sink_without_metadata_table_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"hoodie\.metadata\.enable"):
        HudiStreamingSink(SinkConfig(str(tmp_path / "t"), decoder=decoder(), record_key="id",
                                     precombine="ts", partition_by=["city"],
                                     index=RECORD_INDEX,
                                     options={"hoodie.metadata.enable": "false"}))


UPDATE_PARTITION_PATH = "hoodie.record.index.update.partition.path"


def test_record_index_sink_update_partition_path_is_the_engine_option(tmp_path: Path) -> None:
    """The sink's ``update_partition_path`` and the table option say the same thing: the field
    sets the option, a contradiction names both, a bad option value names the option."""
    def config(**kwargs: Any) -> SinkConfig:
        return SinkConfig(str(tmp_path / "t"), decoder=decoder(), index=RECORD_INDEX, **kwargs)

    kept = config(update_partition_path=False)
    assert kept.options == {UPDATE_PARTITION_PATH: "false"}
    assert config(options={UPDATE_PARTITION_PATH: "false"}).update_partition_path is False
    assert config().update_partition_path is True
    with pytest.raises(ValueError, match=rf"update_partition_path: True contradicts "
                                         rf"options\['{UPDATE_PARTITION_PATH}'\]"):
        config(update_partition_path=True, options={UPDATE_PARTITION_PATH: "false"})
    with pytest.raises(InvalidOptionError, match=UPDATE_PARTITION_PATH.replace(".", r"\.")):
        config(options={UPDATE_PARTITION_PATH: "perhaps"})


@pytest.mark.spark
@pytest.mark.slow
def test_record_index_sink_update_partition_path_false_updates_keys_where_stored(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """``update_partition_path=False``: a key whose partition value changed is updated in the
    partition the table stores it in (its row is the new version's), through the first batch's
    lookup (no record_index yet: the table is read) and the record_index's; a tombstone of such
    a key deletes it there, and the key written again is a new key in its own partition."""
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id",
                                        precombine="ts", partition_by=["city"],
                                        index=RECORD_INDEX, options=OPTIONS,
                                        update_partition_path=False, write_parallelism=2))
    oracle = EventOracle()
    offsets: dict[int, int] = {}
    batches = [
        [Event("a", 1, "oslo", 1.0), Event("b", 1, "oslo", 1.0), Event("c", 1, "rome", 1.0)],
        # a re-partitioned, b re-partitioned by a late version (loses), c in place, d new
        [Event("a", 2, "rome", 2.0), Event("b", 0, "lima", 9.0), Event("c", 2, "rome", 2.0),
         Event("d", 1, "lima", 1.0)],
        # a re-partitioned again, then tombstoned; b re-partitioned (wins)
        [Event("a", 3, "lima", 3.0), Event("a", tombstone=True), Event("b", 3, "lima", 3.0)],
        # a written again: a new key, in its own partition
        [Event("a", 4, "lima", 4.0), Event("d", 2, "oslo", 2.0)],
    ]
    where = [{"a": "oslo", "b": "oslo", "c": "rome"},
             {"a": "oslo", "b": "oslo", "c": "rome", "d": "lima"},
             {"b": "oslo", "c": "rome", "d": "lima"},
             {"a": "lima", "b": "oslo", "c": "rome", "d": "lima"}]
    for batch_id, events in enumerate(batches):
        sink.process_batch(data_frame(spark, kafka_rows(events, "ev", offsets)), batch_id)
        oracle.apply(events)
        result = sink.last_result
        assert result is not None and result.errors == 0 and result.instant_time
        assert table_rows(path) == oracle.rows, f"batch {batch_id}"
        assert hudi_rs_rows(path) == oracle.rows, f"batch {batch_id} (hudi-rs)"
        locations = hudi_rs_locations(path)
        assert {k: part for k, (part, _) in locations.items()} == where[batch_id], \
            f"batch {batch_id}"
        if batch_id:
            assert _index_entries(path) == locations, f"batch {batch_id} (index)"
