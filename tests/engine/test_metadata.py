"""The metadata table's ``files`` partition: kept in step by every action, used by our
views and by hudi-rs, repaired when out of step, validated against storage."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.format.log_block import BlockType, HeaderKey, iter_blocks
from engine.format.log_format import decode_hfile_data_block, encode_hfile_data_block
from engine.layout.file_group import list_table_files
from engine.layout.view import TableView
from engine.metadata.codec import RECORD_INDEX_BLOCK_SIZE
from engine.metadata.listing import metadata_listing
from engine.metadata.schema import metadata_schema_json
from engine.metadata.table import METADATA_FOLDER, MetadataTable, declared_partitions
from engine.metadata.validate import committed_files
from engine.metadata.writer import RETAINED_SLICES
from engine.timeline.active import Timeline
from tests.engine.helpers import COLUMNS, SCHEMA, random_batch, writer_dies_at_the_data_commit
from tests.helpers import Oracle, assert_hudi_rs_uses_metadata, hudi_rs_read, sorted_rows


def _create(path: Path, table_type: str = "MERGE_ON_READ", **options: str) -> Table:
    return Table.create(str(path), name="mdt", table_type=table_type, record_key="key",
                        precombine="ts", partition_by=["region"], options=options)


def _write_some(table: Table, oracle: Oracle, rng: random.Random, counter: list[int],
                batches: int) -> None:
    for _ in range(batches):
        batch = random_batch(rng, oracle, counter, rng.randint(5, 30))
        for row in batch:
            if row["key"] in oracle.rows:
                row["region"] = oracle.rows[row["key"]]["region"]
        instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        oracle.upsert(batch, instant)


def _same_files(table: Table) -> None:
    """The MDT's listing equals storage's committed files, and validate agrees."""
    timeline = Timeline.load(table.storage, table.config)
    from_mdt = metadata_listing(table.storage, timeline)
    assert from_mdt is not None, "the view would list storage: the MDT is not used"
    on_storage = committed_files(table.storage, timeline)
    assert sorted(f.path for f in from_mdt.base_files) == \
        sorted(f.path for f in on_storage.base_files)
    assert sorted((f.path, f.size) for f in from_mdt.log_files) == \
        sorted((f.path, f.size) for f in on_storage.log_files)
    result = table.validate_metadata()
    assert result.ok, [str(d) for d in result.differences]


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_metadata_new_table_is_kept_by_every_write_and_used_by_hudi_rs(
        tmp_path: Path, table_type: str) -> None:
    table = _create(tmp_path / "t", table_type)
    oracle, rng, counter = Oracle(), random.Random(7), [0]
    _write_some(table, oracle, rng, counter, 4)
    assert declared_partitions(table.storage) == ("files",)
    _same_files(table)
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()
    assert_hudi_rs_uses_metadata(table.path, tmp_path / "decoy")


def test_metadata_hfile_blocks_deflated_by_isal_are_read_by_hudi_rs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every MDT partition written at level 1, whose blocks ISA-L deflates (the record index's
    level): hudi-rs, which reads the ``files`` partition, lists the table through it."""
    import zlib

    from engine.format.hfile import FAST_LEVELS, gzip_member
    from engine.metadata import codec

    monkeypatch.setattr(codec, "gz_level", lambda partition: FAST_LEVELS[0])
    raw = b"files partition cell " * 200
    assert gzip_member(raw, FAST_LEVELS[0]) != gzip_member(raw, 6)
    assert zlib.decompress(gzip_member(raw, FAST_LEVELS[0]), 31) == raw
    table = _create(tmp_path / "t", "MERGE_ON_READ")
    oracle, rng, counter = Oracle(), random.Random(5), [0]
    _write_some(table, oracle, rng, counter, 3)
    _same_files(table)
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()
    assert_hudi_rs_uses_metadata(table.path, tmp_path / "decoy")


def test_metadata_services_keep_it_in_step_and_it_compacts_and_cleans(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "MERGE_ON_READ",
                    **{"hoodie.compact.inline": "true",
                       "hoodie.compact.inline.max.delta.commits": "3",
                       "hoodie.cleaner.commits.retained": "2",
                       "hoodie.keep.min.commits": "3", "hoodie.keep.max.commits": "4"})
    oracle, rng, counter = Oracle(), random.Random(11), [0]
    for _ in range(8):
        _write_some(table, oracle, rng, counter, 2)
        table.clean()
        table.archive()
        _same_files(table)
    victims = sorted(oracle.rows)[:5]
    table.delete(pa.table({"key": victims,
                           "region": [oracle.rows[k]["region"] for k in victims]}))
    oracle.delete(victims)
    _same_files(table)
    mdt = MetadataTable(table.storage, table.config)
    actions = {i.action.value for i in mdt.timeline().instants}
    assert actions & {"compaction", "commit"}  # > 10 deltacommits: compacted at least once
    bases = [f for f in list_table_files(mdt.storage).base_files]
    assert len(bases) <= RETAINED_SLICES  # older slices cleaned
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()
    assert_hudi_rs_uses_metadata(table.path, tmp_path / "decoy")


def test_metadata_deltacommit_without_its_data_commit_is_ignored_then_rolled_back(
        tmp_path: Path) -> None:
    table = _create(tmp_path / "t")
    oracle, rng, counter = Oracle(), random.Random(3), [0]
    _write_some(table, oracle, rng, counter, 2)
    # A writer that dies between the MDT deltacommit and its data commit.
    with writer_dies_at_the_data_commit():
        table.upsert(pa.Table.from_pylist(random_batch(rng, oracle, counter, 10, new_only=True),
                                          schema=SCHEMA))
    pending = Timeline.load(table.storage, table.config).pending()
    assert len(pending) == 1
    failed = pending[0].requested_time
    mdt = MetadataTable(table.storage, table.config)
    assert any(i.requested_time == failed and i.is_completed for i in mdt.timeline().instants)
    # Readers ignore it (its data instant is not completed)...
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()
    _same_files(table)
    # ...and the next writer's rollback takes it back with the files.
    reopened = Table.open(table.path, {"hoodie.write.concurrency.mode": "SINGLE_WRITER"})
    assert reopened.rollback_failed_writes() == [failed]
    assert all(i.requested_time != failed for i in mdt.timeline().instants)
    _write_some(reopened, oracle, rng, counter, 1)
    _same_files(reopened)
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()


def test_metadata_missing_a_data_commit_is_not_trusted_and_is_repaired(tmp_path: Path) -> None:
    table = _create(tmp_path / "t")
    oracle, rng, counter = Oracle(), random.Random(5), [0]
    _write_some(table, oracle, rng, counter, 3)
    mdt = MetadataTable(table.storage, table.config)
    last = max((i for i in mdt.timeline().instants if i.is_completed),
               key=lambda i: i.completion_time or "")
    mdt.remove_instant(mdt.timeline(), last.requested_time)  # a commit the MDT never saw
    result = table.validate_metadata()
    assert not result.ok
    assert any(d.kind == "deltacommit" for d in result.differences)
    timeline = Timeline.load(table.storage, table.config)
    assert metadata_listing(table.storage, timeline) is None  # our reader lists storage
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    _write_some(table, oracle, rng, counter, 1)  # the writer rebuilds it first
    _same_files(table)
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()


def test_metadata_disable_deletes_it_and_enable_bootstraps_an_existing_table(
        tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.metadata.enable": "false"})
    oracle, rng, counter = Oracle(), random.Random(9), [0]
    _write_some(table, oracle, rng, counter, 3)
    assert declared_partitions(table.storage) == ()
    assert not (Path(table.path) / METADATA_FOLDER).exists()
    enabled = Table.open(table.path)
    _write_some(enabled, oracle, rng, counter, 2)
    assert declared_partitions(table.storage) == ("files",)
    _same_files(enabled)
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()
    disabled = Table.open(table.path, {"hoodie.metadata.enable": "false"})
    _write_some(disabled, oracle, rng, counter, 1)
    assert declared_partitions(table.storage) == ()
    assert not (Path(table.path) / METADATA_FOLDER).exists()
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()


@pytest.mark.parametrize("version", ["8", "9"])
def test_metadata_rebuild_and_validate_report_differences(tmp_path: Path, version: str) -> None:
    table = _create(tmp_path / "t", **{"hoodie.write.table.version": version,
                                       "hoodie.metadata.index.column.stats.enable": "true"})
    assert table.config.version == int(version)
    oracle, rng, counter = Oracle(), random.Random(13), [0]
    _write_some(table, oracle, rng, counter, 3)
    base = next(f for f in list_table_files(table.storage).base_files)
    copy = Path(table.path) / base.partition_path / base.name.replace(
        base.file_id, "00000000-0000-0000-0000-000000000000-0")
    shutil.copy(Path(table.path) / base.path, copy)  # a committed-looking file the MDT lacks
    result = table.validate_metadata()
    assert [d.kind for d in result.differences] == ["missing from the MDT"]
    copy.unlink()
    assert table.validate_metadata().ok
    table.rebuild_metadata()
    _same_files(table)
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()


def test_metadata_validate_checks_every_live_key_against_the_record_index(
        tmp_path: Path) -> None:
    """``validate`` reads every live key of the snapshot and the record_index: an entry for a
    key no slice holds, a live key without an entry and entries pointing at the wrong group
    are all reported (a wrong record index makes writers duplicate or lose records); a
    rebuild clears them."""
    table = _create(tmp_path / "t", **{"hoodie.index.type": "RECORD_INDEX"})
    oracle, rng, counter = Oracle(), random.Random(29), [0]
    _write_some(table, oracle, rng, counter, 3)
    result = table.validate_metadata()
    assert result.ok and result.keys_checked == len(oracle.snapshot())
    # Rename one entry's key in a record_index log: its real key loses its entry, the new
    # key names no record.
    folder = Path(table.path) / METADATA_FOLDER / "record_index"
    logs = [p for p in sorted(folder.iterdir()) if ".log." in p.name]
    for log in logs:
        blocks = list(iter_blocks(log.read_bytes()))
        if len(blocks) == 1 and blocks[0].block_type is BlockType.HFILE_DATA:
            cells = decode_hfile_data_block(blocks[0])
            if len(cells) > 2 and len({value for _, value in cells[1:]}) > 1:
                break
    else:
        pytest.fail("no record_index log holds one HFile block of entries for two groups")
    renamed = cells[0][0].decode()
    # and swap the locations of two entries pointing at different groups
    other = next(i for i in range(2, len(cells)) if cells[i][1] != cells[1][1])
    swapped = sorted([cells[1][0].decode(), cells[other][0].decode()])
    cells[1], cells[other] = (cells[1][0], cells[other][1]), (cells[other][0], cells[1][1])
    cells = sorted([(b"no-such-record-key", cells[0][1]), *cells[1:]])
    log.write_bytes(encode_hfile_data_block(
        cells, metadata_schema_json(), blocks[0].header[HeaderKey.INSTANT_TIME],
        block_size=RECORD_INDEX_BLOCK_SIZE))
    result = table.validate_metadata()
    found = {(d.kind, d.name, d.detail.split(",")[-1].strip()) for d in result.differences}
    assert ("record index", "no-such-record-key", "held by no slice") in found
    assert ("record index", renamed, "a live key the index lacks") in found
    pointing = sorted(d.name for d in result.differences if d.detail.startswith("indexed at")
                      and "held by no slice" not in d.detail)
    assert pointing == swapped
    assert not result.ok
    table.rebuild_metadata()
    result = table.validate_metadata()
    assert result.ok and result.keys_checked == len(oracle.snapshot())


def test_metadata_view_lists_nothing_in_the_table_folder(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    table = _create(tmp_path / "t")
    oracle, rng, counter = Oracle(), random.Random(17), [0]
    _write_some(table, oracle, rng, counter, 3)
    walked: list[str] = []
    original = type(table.storage).walk_files

    def counting(self, rel="", **kwargs):  # type: ignore[no-untyped-def]
        walked.append(f"{self.base_path}:{rel}")
        return original(self, rel, **kwargs)

    monkeypatch.setattr(type(table.storage), "walk_files", counting)
    view = TableView.load(table.storage, table.config)
    assert view.latest_file_slices()
    _write_some(table, oracle, rng, counter, 1)
    data_walks = [w for w in walked if not w.split(":")[0].endswith(METADATA_FOLDER)]
    assert data_walks == []


def test_metadata_out_of_step_is_rebuilt_with_its_record_index_before_tagging(
        tmp_path: Path) -> None:
    """An MDT that misses a data commit is rebuilt at the next writer's start — its record
    index too — so RECORD_INDEX tags against the keys that commit wrote, not a stale index
    (which would write a second copy of each)."""
    # No small-file packing: a key the index does not find goes to a new file group.
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.index.type": "RECORD_INDEX",
                                                          "hoodie.parquet.small.file.limit": "1"})
    oracle, rng, counter = Oracle(), random.Random(21), [0]
    _write_some(table, oracle, rng, counter, 2)
    batch = random_batch(rng, oracle, counter, 20, new_only=True)
    instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch, instant)
    mdt = MetadataTable(table.storage, table.config)
    mdt.remove_instant(mdt.timeline(), instant)  # the MDT never saw those keys
    assert "record_index" in declared_partitions(table.storage)
    updates = [dict(row, ts=99) for row in batch[:10]]
    oracle.upsert(updates, table.upsert(pa.Table.from_pylist(updates, schema=SCHEMA)))
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    assert "record_index" in declared_partitions(table.storage)
    _same_files(table)
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()


def test_metadata_index_is_not_built_while_another_write_is_in_flight(tmp_path: Path) -> None:
    """An index partition is built only when no other writer's instant is in flight: that
    instant planned without it, so its files would complete without entries (a record index
    missing their keys would make the next upsert write them twice)."""
    table = _create(tmp_path / "t", "COPY_ON_WRITE")
    oracle, rng, counter = Oracle(), random.Random(23), [0]
    _write_some(table, oracle, rng, counter, 2)
    other = table._client()
    _timeline, inflight = other.begin()  # another writer, alive, mid-write
    enabled = Table.open(table.path, {"hoodie.metadata.record.index.enable": "true"})
    _write_some(enabled, oracle, rng, counter, 1)
    assert "record_index" not in declared_partitions(table.storage)
    other.abort(inflight)
    _write_some(enabled, oracle, rng, counter, 1)
    assert "record_index" in declared_partitions(table.storage)
    _same_files(enabled)
    assert sorted_rows(enabled.read(), COLUMNS) == oracle.snapshot()


def test_file_group_indexes_any_keys_equal_the_per_key_java_hash_route():
    """The array routing equals the per-key one (itself checked against Java's vectors) on
    keys of every length, with characters beyond the BMP, and on the key whose Java hash is
    Integer.MIN_VALUE."""
    import random

    from engine.metadata.keys import file_group_index, file_group_indexes, java_string_hash

    assert java_string_hash("polygenelubricants") == -(2 ** 31)
    rng = random.Random(3)
    alphabet = "abcXYZ019-_/\u00e9\u6f22\U0001F600\uFFFF\u0000"
    keys = ["polygenelubricants", ""] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(5000)]
    # ASCII keys (hashed over their bytes), long ones too, mixed with the others
    ascii_keys = ["".join(rng.choice("az09-_/~\x7f\x01") for _ in range(rng.randrange(0, 300)))
                  for _ in range(3000)]
    keys = [k for pair in zip(keys[:3000], ascii_keys, strict=True) for k in pair] + keys[3000:]
    for groups in (1, 2, 7, 10, 1000):
        assert file_group_indexes(keys, groups).tolist() == [
            file_group_index(k, groups) for k in keys]
        assert file_group_indexes(pa.chunked_array([keys[:7], keys[7:]]), groups).tolist() \
            == [file_group_index(k, groups) for k in keys]
    # ASCII keys all of one length (UUIDs, fixed-width ids) take a matrix path
    same = ["polygenelubricants"] + ["".join(rng.choice("az09-_/~\x7f\x01") for _ in range(18))
                                     for _ in range(2000)]
    for groups in (2, 10, 1000):
        assert file_group_indexes(same, groups).tolist() == [
            file_group_index(k, groups) for k in same]
        assert file_group_indexes(pa.array(same).slice(5), groups).tolist() == [
            file_group_index(k, groups) for k in same[5:]]


def test_metadata_out_of_step_rebuild_keeps_declared_indexes_and_waits_to_add_new_ones(
        tmp_path: Path) -> None:
    """Rebuilding an out-of-step MDT while another writer's instant is in flight rebuilds the
    index partitions the table declared (that writer planned with them and completes its
    entries into them) and leaves a partition this writer newly wants for a later start."""
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.index.type": "RECORD_INDEX"})
    oracle, rng, counter = Oracle(), random.Random(25), [0]
    _write_some(table, oracle, rng, counter, 2)
    other = Table.open(table.path)._client()
    _timeline, inflight = other.begin()  # another writer, alive, mid-write
    batch = random_batch(rng, oracle, counter, 20, new_only=True)
    instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    oracle.upsert(batch, instant)
    mdt = MetadataTable(table.storage, table.config)
    mdt.remove_instant(mdt.timeline(), instant)  # out of step
    wants_bloom = Table.open(table.path, {"hoodie.metadata.index.bloom.filter.enable": "true"})
    _write_some(wants_bloom, oracle, rng, counter, 1)
    declared = declared_partitions(table.storage)
    assert "record_index" in declared and "bloom_filters" not in declared
    other.abort(inflight)
    _write_some(wants_bloom, oracle, rng, counter, 1)
    assert "bloom_filters" in declared_partitions(table.storage)
    _same_files(wants_bloom)
    assert sorted_rows(wants_bloom.read(), COLUMNS) == oracle.snapshot()


def test_metadata_files_listing_naming_a_folder_outside_the_table_is_refused() -> None:
    """A ``files`` partition (tampered or corrupt) that lists a partition or a file name
    leading out of the table, or into ``.hoodie``, is refused: readers list storage instead,
    and no cleaner or reader is pointed at such a path."""
    from engine.errors import CorruptTableError
    from engine.layout.partition import is_safe_partition_path
    from engine.metadata.files import FilesChange, table_files
    from engine.metadata.records import FileInfo

    name = "00000001-1b2c-4d5e-8f90-123456789abc-0_0-1-1_20250101000000000.parquet"
    for partition in ("", "a", "a/b", "city=x", "__HIVE_DEFAULT_PARTITION__"):
        assert is_safe_partition_path(partition)
        change = FilesChange()
        change.add(partition, name, 10)
        assert len(table_files({r.key: r for r in change.records()}).base_files) == 1
    for partition in ("..", "../x", "a/../../x", ".hoodie", "a/.hoodie", "/x", "a//b", "a\\b"):
        assert not is_safe_partition_path(partition)
        change = FilesChange()
        change.add(partition, name, 10)
        with pytest.raises(CorruptTableError, match="not a folder of the table"):
            table_files({r.key: r for r in change.records()})
    change = FilesChange()
    change.add("a", name, 10)
    record = next(r for r in change.records() if r.key == "a")  # (and the partition list)
    bad = ".x/../../y_20250101000000000.log.1_0-0-0"  # writers refuse such a name
    forged = record._replace(payload={bad: FileInfo(10)})
    with pytest.raises(CorruptTableError, match="not a file name"):
        table_files({forged.key: forged})
