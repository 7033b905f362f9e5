"""Tagging (Hudi's ``HoodieIndex.tagLocation``): which stored file groups a batch's keys live
in, by the writer's index, and what that makes of each record.

:meth:`Tagger.key_locations` asks the index (SIMPLE reads the slices' keys, BLOOM prunes the
files by their footers or the metadata table first, RECORD_INDEX looks the keys up in the
metadata table's ``record_index``; the same locations either way). On top of it,
:meth:`Tagger.tag_updates` routes an upsert batch: records whose key is stored update its
file groups, copies a global index finds in another partition are deleted, the rest are
inserts for placement (:mod:`engine.write.planner`); :meth:`Tagger.locate` finds the groups a
batch of deletes addresses. The bucket indexes need no lookup: their placement is
:mod:`engine.write.placement`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import IndexType, TableConfig, WriteConfig
from engine.index import bloom as bloom_index
from engine.index import record_index
from engine.index.simple import key_locations, tag
from engine.layout.file_group import FileSlice
from engine.merge.policy import (
    ABSENT,
    KIND_CODES,
    LIVE,
    DeletePolicy,
    resolve_single,
    stays_in_place,
    update_partition_path,
)
from engine.read.slice_reader import SliceReader
from engine.schema import PARTITION_PATH, RECORD_KEY, cast_column

Groups = dict[tuple[str, str], list[pa.Table]]
"""(partition, file id) → the pieces of a batch that go to that file group."""


@dataclass(frozen=True)
class TaggedRecords:
    """What a global index's tagging decided for a batch of records
    (:meth:`Tagger.tag_located`)."""

    updates: dict[tuple[str, str], pa.Table]
    """(partition, file id) → the records that update that group."""
    moved_out: dict[tuple[str, str], pa.Table]
    """(partition, file id) → deletes of old copies of keys that move to another partition
    (key, partition and the ordering value the delete policy gives them)."""
    inserts: pa.Table
    """Records of new keys and of moved ones, to place
    (:meth:`~engine.write.write_client.WriteClient.insert_buckets`)."""


@dataclass(frozen=True)
class Tagger:
    """One writer's tagging: its table, options and delete policy (picklable)."""

    config: TableConfig
    write_config: WriteConfig
    delete_policy: DeletePolicy
    """How a moved key's old copy is deleted (:class:`engine.merge.policy.DeletePolicy`)."""
    bloom_metadata: bool = False
    """BLOOM reads the bloom filters and key ranges from the metadata table."""

    def key_locations(self, reader: SliceReader, slices: list[FileSlice],
                      partitions: set[str] | None, keys: pa.ChunkedArray,
                      written_to: pa.Array | None = None) -> pa.Table:
        """Locations of the slices' live keys: all of them (SIMPLE), or those of ``keys`` in
        the files whose footers admit one (BLOOM: :mod:`engine.index.bloom`, same result), or
        those of ``keys`` the metadata table's record_index holds (RECORD_INDEX:
        :mod:`engine.index.record_index`, same result; under event time with the stored
        ordering value of the keys moving away from the partitions ``written_to``)."""
        if self.write_config.index_type is IndexType.RECORD_INDEX:
            moves = written_to if self.config.orders_by_event_time else None
            return record_index.locations(
                reader, slices, keys.combine_chunks(), partitions=moves,
                update_partition_path=update_partition_path(self.write_config),
                cache_bytes=self.write_config.record_index_cache_bytes)
        if not self.write_config.index_type.uses_bloom:
            return key_locations(reader, slices, partitions)
        metadata = (bloom_index.MetadataSource.of(reader.storage, reader.timeline)
                    if self.bloom_metadata else None)
        return bloom_index.key_locations(
            reader, slices, partitions, keys.combine_chunks(),
            prune_by_ranges=self.write_config.bloom_prune_by_ranges,
            metadata=metadata).locations

    def locate(self, deletes: pa.Table, reader: SliceReader,
               slices: list[FileSlice]) -> pa.Table:
        """Deletes with the partition and file group their key lives in among ``slices``
        (found ones only, in column ``_file_id``); a key found in several file groups is
        deleted from every one of them. Looked up everywhere without a partition column or
        with a global index."""
        known_partition = PARTITION_PATH in deletes.column_names
        global_lookup = not known_partition or self.write_config.index_type.is_global
        wanted = None if global_lookup else set(deletes.column(PARTITION_PATH).to_pylist())
        locations = self.key_locations(reader, slices, wanted, deletes.column(RECORD_KEY))
        parts = (deletes.column(PARTITION_PATH).combine_chunks() if known_partition
                 else pa.nulls(deletes.num_rows, pa.string()))
        tagged = tag(deletes.column(RECORD_KEY).combine_chunks(), parts, locations,
                     global_index=global_lookup)
        located = (deletes if tagged.num_rows == deletes.num_rows
                   else deletes.take(tagged.column("row")))
        if PARTITION_PATH in located.column_names:
            located = located.drop_columns([PARTITION_PATH])
        located = located.append_column(PARTITION_PATH, tagged.column("loc_partition"))
        located = located.append_column("_file_id", tagged.column("loc_file_id"))
        return located.filter(pc.is_valid(located.column("_file_id")))

    def tag_located(self, records: pa.Table, reader: SliceReader, slices: list[FileSlice],
                    locations: pa.Table) -> TaggedRecords:
        """:meth:`tag_updates` of a global index with the key ``locations`` already looked
        up (the streaming job's record-index tasks look them up in the record_index groups
        their keys hash to): which records update which file group, which old copies a move
        deletes, and the records to insert. Executor-safe."""
        group_records: Groups = {}
        group_deletes: Groups = {}
        inserts = self.tag_updates(records, reader, slices, True, group_records,
                                   group_deletes, {}, locations=locations)
        return TaggedRecords({g: pa.concat_tables(t) for g, t in group_records.items()},
                             {g: pa.concat_tables(t) for g, t in group_deletes.items()},
                             inserts)

    def tag_updates(self, records: pa.Table, reader: SliceReader, slices: list[FileSlice],
                    global_index: bool, group_records: Groups, group_deletes: Groups,
                    group_updates: dict[tuple[str, str], list[pa.Array]], *,
                    locations: pa.Table | None = None) -> pa.Table:
        """Route records whose key exists to its file groups; returns the records to insert.

        As Hudi's simple indexes do, a record is tagged once per location of its key: a key
        stored in several file groups (two inserts of one key, or a key SIMPLE put in two
        partitions, looked up by GLOBAL_SIMPLE) is updated in every one of them. With a
        global index, copies in another partition are deleted and the record is inserted
        into its own partition unless a copy already lives there.
        """
        parts = records.column(PARTITION_PATH).combine_chunks()
        wanted = None if global_index else set(parts.unique().to_pylist())
        if locations is None:
            locations = self.key_locations(reader, slices, wanted, records.column(RECORD_KEY),
                                           parts)
        tagged = tag(records.column(RECORD_KEY).combine_chunks(), parts, locations,
                     global_index=global_index)
        rows = tagged.column("row").to_numpy(zero_copy_only=False)
        # Every row appears at least once (left join): as many rows means one location each.
        expanded = (records if tagged.num_rows == records.num_rows
                    else records.take(tagged.column("row")))
        loc_p = tagged.column("loc_partition").combine_chunks()
        loc_f = tagged.column("loc_file_id").combine_chunks()
        found = pc.is_valid(loc_f)
        exp_parts = expanded.column(PARTITION_PATH).combine_chunks()
        same = pc.and_(found, stays_in_place(
            loc_p, exp_parts, update_partition_path=update_partition_path(self.write_config)))
        moved = pc.and_(found, pc.invert(same))
        losing = self.loses_to_stored(expanded, tagged, found)
        if losing is not None:
            # An update whose ordering value is below the stored one would lose on every
            # read: it is not written (so no reader's incremental view shows it).
            same = pc.and_(same, pc.invert(losing))
            moved_kept = pc.and_(moved, pc.invert(losing))
        else:
            moved_kept = moved
        n = records.num_rows

        def per_row(mask: pa.Array) -> np.ndarray:
            out = np.zeros(n, dtype=bool)
            out[rows[np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)]] = True
            return out

        found_any = per_row(found)
        stays = per_row(pc.and_(found, pc.invert(moved)))  # a copy in its own partition
        lost = per_row(losing) if losing is not None else np.zeros(n, dtype=bool)
        has_moved = per_row(moved_kept)
        insert_mask = ~found_any | (has_moved & ~stays & ~lost)

        # An update is written where its key is stored: in place, its partition path is the
        # stored one (update.partition.path false: Java's createNewTaggedHoodieRecord).
        updates = expanded.set_column(expanded.schema.get_field_index(PARTITION_PATH),
                                      PARTITION_PATH, loc_p)
        updates = updates.append_column("_p", loc_p).append_column("_f", loc_f).filter(same)
        for (part, fid), piece in split_by_columns(updates, "_p", "_f"):
            group_records.setdefault((part, fid), []).append(piece.drop_columns(["_p", "_f"]))
            group_updates.setdefault((part, fid), []).append(
                piece.column(RECORD_KEY).combine_chunks().cast(pa.string()))
        if pc.any(moved_kept).as_py():
            # Update-partition-path: delete the old copies, insert into the new partition.
            # The old copy's delete carries the ordering value the delete policy gives it
            # (natural deletes: none, so it wins over the copy whatever its value).
            columns = {RECORD_KEY: expanded.column(RECORD_KEY), PARTITION_PATH: loc_p}
            ordering = self.config.precombine_field
            at = (self.delete_policy.delete_ordering(tagged.column("loc_ordering"))
                  if "loc_ordering" in tagged.column_names else None)
            if at is not None and ordering:
                columns[ordering] = cast_column(at, expanded.schema.field(ordering).type)
            old = pa.table({**columns, "_p": loc_p, "_f": loc_f}).filter(moved_kept)
            for (part, fid), piece in split_by_columns(old, "_p", "_f"):
                group_deletes.setdefault((part, fid), []).append(piece.drop_columns(["_p", "_f"]))
        return records.filter(pa.array(insert_mask))

    def loses_to_stored(self, records: pa.Table, tagged: pa.Table,
                        found: pa.Array) -> pa.Array | None:
        """Rows that lose to the stored version of their key, by
        :func:`engine.merge.policy.resolve_single` under :attr:`delete_policy` (event time:
        their ordering value is lower); None without event time."""
        ordering = self.config.precombine_field
        if (not self.config.orders_by_event_time or not ordering
                or "loc_ordering" not in tagged.column_names):
            return None
        stored = tagged.column("loc_ordering").combine_chunks()
        incoming = records.column(ordering).combine_chunks()
        if not stored.type.equals(incoming.type):
            stored = cast_column(stored, incoming.type)
        is_found = found.to_numpy(zero_copy_only=False).astype(bool)
        outcome = resolve_single(
            np.zeros(len(incoming), dtype=bool), incoming,
            pc.is_null(incoming).to_numpy(zero_copy_only=False).astype(bool),
            np.where(is_found, KIND_CODES[LIVE], KIND_CODES[ABSENT]).astype(np.int8), stored,
            event_time=True, policy=self.delete_policy)
        return pa.array(is_found & ~outcome.winner)


def split_by_columns(table: pa.Table, col_a: str,
                     col_b: str) -> list[tuple[tuple[str, str], pa.Table]]:
    """``table``'s rows grouped by the values of two columns (in row order within each)."""
    if not table.num_rows:
        return []
    with_idx = table.append_column("__i", pa.array(np.arange(table.num_rows)))
    grouped = with_idx.group_by([col_a, col_b]).aggregate([("__i", "list")])
    out = []
    for a, b, idx in zip(grouped.column(col_a).to_pylist(), grouped.column(col_b).to_pylist(),
                         grouped.column("__i_list").to_pylist(), strict=True):
        out.append(((a, b), table.take(pa.array(sorted(idx)))))
    return out
