"""Writing the metadata table: one deltacommit over any of its partitions, initializing a
partition, compaction and cleaning. Hold the table lock for every function here.

A deltacommit at data instant ``T`` writes, for every file group a key of the update routes
to (``hudi-metadata-table.md`` §4.8), a new log file ``.<fileId>_T.log.1_0-0-0`` holding an
HFile block of the upserted records and/or a delete block of the deleted keys, then the
completed deltacommit with one write stat per log file. Only partitions the data table
declares complete are written; records for others are dropped (their initialization reads
the table anew).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.layout.partition import write_partition_metadata
from engine.metadata.codec import base_file_bytes, init_log_file, log_file_bytes
from engine.metadata.keys import ALL_PARTITIONS_KEY, file_group_ids, file_group_indexes
from engine.metadata.keys import FILES as FILES_TYPE
from engine.metadata.reader import (
    GroupSlice,
    Validity,
    file_slices,
    group_ids,
    latest_group_slices,
    read_slice,
)
from engine.metadata.records import (
    BloomFilterInfo,
    ColumnStats,
    FileInfo,
    MetadataRecord,
)
from engine.metadata.schema import metadata_schema_without_meta_fields_json
from engine.metadata.table import (
    BOOTSTRAP_PREFIX,
    MetadataTable,
    declared_partitions,
    read_data_properties,
    set_declared_partitions,
)
from engine.metadata.update import MetadataUpdate, SharedUpserts
from engine.timeline.active import MetadataSynced, Timeline
from engine.timeline.commit_metadata import CommitMetadata, WriteStat
from engine.timeline.compaction_plan import CompactionOperation, CompactionPlan
from engine.timeline.instant import Action, new_instant_time

_log = logging.getLogger(__name__)

WRITE_TOKEN = "0-0-0"
MAX_DELTA_COMMITS = 10
"""``hoodie.metadata.compact.max.delta.commits``: deltacommits after which the MDT is
compacted (Hudi's default)."""
RETAINED_SLICES = 2
"""File slices of each MDT file group kept by MDT cleaning: the newest and the one before
(a reader that loaded the MDT just before a compaction still finds its files)."""


def _value_types(mdt: MetadataTable) -> bool:
    """The MDT's files carry Hudi 1.1's schema and V2 stats (table version 9)."""
    return mdt.data_config.table_version.column_stats_value_types


def _commit_meta(mdt: MetadataTable, stats: Sequence[WriteStat], operation: str, *,
                 compacted: bool = False) -> bytes:
    schema = metadata_schema_without_meta_fields_json(_value_types(mdt))
    return CommitMetadata(write_stats=tuple(stats), operation_type=operation,
                          compacted=compacted, extra_metadata={"schema": schema}
                          ).to_avro_bytes()


def _indexes(keys: list[str], groups: int) -> list[int]:
    return file_group_indexes(keys, groups).tolist()


def _route_shared(chunks: Sequence[SharedUpserts], groups: int
                  ) -> dict[int, list[SharedUpserts]]:
    """``chunks`` split by the file group each key routes to (keys keep their order)."""
    out: dict[int, list[SharedUpserts]] = {}
    for chunk in chunks:
        indexes = file_group_indexes(chunk.keys, groups)
        order = np.argsort(indexes, kind="stable")
        bounds = np.searchsorted(indexes[order], np.arange(groups + 1))
        for index in range(groups):
            lo, hi = int(bounds[index]), int(bounds[index + 1])
            if lo < hi:
                keys = chunk.keys.take(pa.array(order[lo:hi])) if hi - lo < len(order) \
                    else chunk.keys
                out.setdefault(index, []).append(SharedUpserts(keys, chunk.record))
    return out


def _not_upserted(keys: Sequence[str], upserts: Sequence[MetadataRecord],
                  shared: Sequence[SharedUpserts]) -> list[str]:
    """``keys`` that neither ``upserts`` nor ``shared`` upsert."""
    if not keys:
        return []
    upserted = {r.key for r in upserts}
    kept = [k for k in keys if k not in upserted]
    if shared and kept:
        values = pa.concat_arrays([chunk.keys.cast(pa.large_string()) for chunk in shared])
        array = pa.array(kept, pa.large_string())
        kept = array.filter(pc.invert(pc.is_in(array, value_set=values))).to_pylist()
    return kept


def write_deltacommit(mdt: MetadataTable, mdt_timeline: Timeline, instant_time: str,
                      update: MetadataUpdate, *,
                      declared: Collection[str] | None = None) -> str:
    """One MDT deltacommit at ``instant_time`` (see the module docstring); returns its
    completion time. ``mdt_timeline``: loaded under the table lock the caller holds (no
    MDT writer works without it), so the completion time is taken from it without
    listing the timeline again; ``declared``: the data table's declared MDT partitions
    (read from ``hoodie.properties`` if None)."""
    declared = set(declared_partitions(mdt.data_storage) if declared is None else declared)
    requested = mdt_timeline.create_requested(Action.DELTA_COMMIT, instant_time)
    inflight = mdt_timeline.transition_to_inflight(requested)
    stats: list[WriteStat] = []
    for partition in update.partitions():
        if partition not in declared:
            continue
        groups = group_ids(mdt, partition)
        if not groups:
            continue
        records: dict[int, list[MetadataRecord]] = {}
        upserts = update.upserts.get(partition, ())
        for record, index in zip(upserts, _indexes([r.key for r in upserts], len(groups)),
                                 strict=True):
            records.setdefault(index, []).append(record)
        shared = _route_shared(update.shared.get(partition, ()), len(groups))
        # A key both upserted and deleted by one action (a record moved between file
        # groups: the old file loses it, the new one gains it) keeps the upsert.
        deletes: dict[int, list[str]] = {}
        removed = _not_upserted(update.deletes.get(partition, ()), upserts,
                                update.shared.get(partition, ()))
        for key, index in zip(removed, _indexes(removed, len(groups)), strict=True):
            deletes.setdefault(index, []).append(key)
        for index in sorted(set(records) | set(shared) | set(deletes)):
            file_id = groups[index]
            name = f".{file_id}_{instant_time}.log.1_{WRITE_TOKEN}"
            upserted = len(records.get(index, ())) + sum(
                len(chunk.keys) for chunk in shared.get(index, ()))
            data = log_file_bytes(records.get(index, ()), instant_time,
                                  deletes=deletes.get(index, ()), partition=partition,
                                  value_types=_value_types(mdt),
                                  shared=shared.get(index, ()))
            mdt.storage.write_new(f"{partition}/{name}", data)
            count = upserted + len(deletes.get(index, ()))
            stats.append(WriteStat(
                file_id=file_id, path=f"{partition}/{name}", partition_path=partition,
                prev_commit=instant_time, num_writes=count,
                num_update_writes=upserted,
                num_deletes=len(deletes.get(index, ())), total_write_bytes=len(data),
                file_size_in_bytes=len(data), base_file="", log_files=(name,),
                total_log_blocks=1, total_log_records=count))
    done = mdt_timeline.complete(inflight, _commit_meta(mdt, stats, "UPSERT_PREPPED"),
                                 MetadataSynced(instant_time), listed=True)
    return done.completion_time or done.requested_time


def next_init_instant(mdt_timeline: Timeline) -> str:
    """The first ``00000000000000xxx`` instant not on the MDT timeline (Java
    ``generateUniqueInstantTime``)."""
    used = {i.requested_time for i in mdt_timeline.instants}
    n = 0
    while f"{BOOTSTRAP_PREFIX}{n:03d}" in used:
        n += 1
    return f"{BOOTSTRAP_PREFIX}{n:03d}"


def initialize_partition(mdt: MetadataTable, partition: str, num_groups: int,
                         records: Iterable[MetadataRecord]) -> str:
    """Build one MDT partition at a fresh initialization instant: every file group's
    initial log, a base HFile for each group that receives records, the deltacommit, then
    the partition is declared in the data table's ``hoodie.properties`` (listed as inflight
    while it is built). Returns the instant."""
    data_props = read_data_properties(mdt.data_storage)
    declared = [p for p in data_props.get("hoodie.table.metadata.partitions", "").split(",")
                if p and p != partition]
    set_declared_partitions(mdt.data_storage, declared, [partition])
    timeline = mdt.timeline()
    instant = next_init_instant(timeline)
    mdt.storage.delete_tree(partition)
    requested = timeline.create_requested(Action.DELTA_COMMIT, instant)
    inflight = timeline.transition_to_inflight(requested)
    write_partition_metadata(mdt.storage, partition, instant)
    ids = file_group_ids(partition, num_groups)
    for file_id in ids:
        mdt.storage.write_new(f"{partition}/.{file_id}_{instant}.log.1_{WRITE_TOKEN}",
                              init_log_file(instant))
    by_group: dict[int, list[MetadataRecord]] = {}
    listed = list(records)
    for record, index in zip(listed, _indexes([r.key for r in listed], num_groups), strict=True):
        by_group.setdefault(index, []).append(record)
    stats = []
    for index in sorted(by_group):
        name = f"{ids[index]}_{WRITE_TOKEN}_{instant}.hfile"
        data = base_file_bytes(by_group[index], name, partition,
                               value_types=_value_types(mdt))
        mdt.storage.write_new(f"{partition}/{name}", data)
        stats.append(WriteStat(file_id=ids[index], path=f"{partition}/{name}",
                               partition_path=partition, num_writes=len(by_group[index]),
                               num_inserts=len(by_group[index]),
                               total_write_bytes=len(data), file_size_in_bytes=len(data)))
    timeline.complete(inflight, _commit_meta(mdt, stats, "BULK_INSERT"), MetadataSynced(instant))
    set_declared_partitions(mdt.data_storage, [*declared, partition])
    _log.info("metadata table of %s: initialized %s (%d file groups, %d records)",
              mdt.data_storage.base_path, partition, num_groups,
              sum(len(v) for v in by_group.values()))
    return instant


# -- compaction and cleaning ----------------------------------------------------------------

def _compacted(record: MetadataRecord) -> MetadataRecord | None:
    """A merged record as a compacted base keeps it: files without tombstones, deleted
    stats and bloom filters dropped."""
    payload = record.payload
    if isinstance(payload, Mapping):
        live = {name: FileInfo(info.size) for name, info in payload.items()
                if isinstance(info, FileInfo) and not info.is_deleted}
        if not live and record.key != ALL_PARTITIONS_KEY:
            return None
        return record._replace(payload=live)
    if isinstance(payload, ColumnStats | BloomFilterInfo) and payload.is_deleted:
        return None
    return record


def compact(mdt: MetadataTable, mdt_timeline: Timeline, data_timeline: Timeline,
            valid: Validity) -> str:
    """Fold every non-empty file group of every declared MDT partition into a new base
    HFile at a fresh MDT instant (``compaction.requested`` plan, inflight, base files,
    ``commit``). Groups holding only their initial log stay log-only, as in Hudi."""
    partitions = sorted(set(declared_partitions(mdt.data_storage)))
    pieces: list[GroupSlice] = []
    for partition in partitions:
        pieces += [g for g in latest_group_slices(mdt, mdt_timeline, valid, partition)
                   if g.base_path is not None or len(g.log_paths) > 1
                   or partition == FILES_TYPE.name]
    c = new_instant_time(max(mdt_timeline.latest_instant_time(),
                             data_timeline.latest_instant_time()))
    ops = []
    for piece in pieces:
        base_name = piece.base_path.rsplit("/", 1)[-1] if piece.base_path else None
        base_instant = base_name.rsplit("_", 1)[-1].split(".")[0] if base_name else ""
        ops.append(CompactionOperation(
            partition_path=piece.partition, file_id=piece.file_id, base_instant=base_instant,
            base_file=base_name, log_files=tuple(p.rsplit("/", 1)[-1] for p in piece.log_paths)))
    requested = mdt_timeline.create_requested(Action.COMPACTION, c,
                                              CompactionPlan(operations=tuple(ops)).to_avro_bytes())
    inflight = mdt_timeline.transition_to_inflight(requested)
    stats = []
    for piece in pieces:
        merged = read_slice(mdt.storage, piece)
        kept = [r for r in (_compacted(r) for _, r in sorted(merged.items())) if r is not None]
        name = f"{piece.file_id}_{WRITE_TOKEN}_{c}.hfile"
        data = base_file_bytes(kept, name, piece.partition, value_types=_value_types(mdt))
        mdt.storage.write_new(f"{piece.partition}/{name}", data)
        stats.append(WriteStat(file_id=piece.file_id, path=f"{piece.partition}/{name}",
                               partition_path=piece.partition, num_writes=len(kept),
                               total_write_bytes=len(data), file_size_in_bytes=len(data),
                               total_log_files_compacted=len(piece.log_paths)))
    mdt_timeline.complete(inflight, _commit_meta(mdt, stats, "COMPACT", compacted=True),
                          MetadataSynced(c))
    return c


def clean(mdt: MetadataTable, mdt_timeline: Timeline) -> int:
    """Delete the slices of every MDT file group older than the newest ``RETAINED_SLICES``,
    and the MDT timeline files of instants that no longer own a file. Returns files
    deleted."""
    from engine.layout.file_group import FileSlice, list_table_files
    from engine.metadata.reader import trust_all

    partitions = declared_partitions(mdt.data_storage)
    by_group: dict[tuple[str, str], list[FileSlice]] = {}
    for piece in file_slices(mdt, mdt_timeline, trust_all, partitions, latest_only=False):
        by_group.setdefault((piece.partition_path, piece.file_id), []).append(piece)
    deleted = 0
    keep_from = ""
    for slices in by_group.values():
        if len(slices) <= RETAINED_SLICES:
            continue
        for piece in slices[:-RETAINED_SLICES]:
            paths = [log.path for log in piece.log_files]
            if piece.base_file is not None:
                paths.append(piece.base_file.path)
            for path in paths:
                mdt.storage.delete(path)
                deleted += 1
        oldest_kept = slices[-RETAINED_SLICES].base_instant
        keep_from = oldest_kept if not keep_from else min(keep_from, oldest_kept)
    if not deleted:
        return 0
    remaining = list_table_files(mdt.storage)
    owned = {f.instant_time for f in remaining.base_files}
    owned |= {f.instant_time for f in remaining.log_files}
    for instant in mdt_timeline.instants:
        t = instant.requested_time
        if t < keep_from and t not in owned and instant.is_completed:
            mdt_timeline.delete_instant_files(instant)
    return deleted
