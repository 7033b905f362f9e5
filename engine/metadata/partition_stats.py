"""The ``partition_stats`` partition of the metadata table (``hudi-metadata-table.md`` §4.4,
partitioned tables): per (column, partition), the union of the column stats
(:mod:`engine.metadata.file_stats`) of the files of the partition's latest file slices,
recomputed for every partition a commit touches.

For every partition a commit writes, the partition's stats per indexed column are the union
of the column stats of the files of its latest file slices **as they are once the commit
completes** (tight bound, ``isTightBound`` true, so the newest record of a key wins over
older ones). The slices are built the way readers build them (:func:`build_file_slices`)
over the files the table lists plus the commit's own, with the commit visible and the groups
it replaces dropped. Stats of the commit's files come from the sync's update; the others are
looked up in ``column_stats``. A file without stats for a column makes the column's bound
unknown (null min/max with values): readers then never prune the partition on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from engine.format.naming import parse_base_file, parse_log_file
from engine.layout.file_group import BaseFile, LogFile, TableFiles, build_file_slices
from engine.metadata.file_stats import (
    META_COLUMNS_TO_INDEX,
    columns_to_index,
    merge_bounds,
    table_columns,
    table_file_stats,
)
from engine.metadata.indexes import IndexPartition
from engine.metadata.keys import COLUMN_STATS as COLUMN_STATS_TYPE
from engine.metadata.keys import PARTITION_STATS as PARTITION_STATS_TYPE
from engine.metadata.keys import (
    b64_xxh64,
    column_stats_key,
    partition_identifier,
    partition_stats_key,
)
from engine.metadata.records import ColumnStats, MetadataRecord, partition_stats_record
from engine.schema import META_FIELDS
from engine.timeline.commit_metadata import CommitMetadata
from engine.timeline.instant import Action

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.metadata.update import MetadataUpdate
    from engine.storage import Storage
    from engine.timeline.active import Timeline
    from engine.timeline.instant import Instant

COLUMN_STATS = COLUMN_STATS_TYPE.name
PARTITION_STATS = PARTITION_STATS_TYPE.name

_LAST = "9" * 20
"""A completion key after every other: the commit being synced completes last."""


class _WithInstant(Mapping[str, str]):
    """A view's visible instants plus the instant being completed."""

    def __init__(self, visible: Mapping[str, str], instant_time: str) -> None:
        self.visible = visible
        self.instant_time = instant_time

    def __getitem__(self, key: str) -> str:
        if key == self.instant_time:
            return _LAST
        return self.visible[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.visible
        yield self.instant_time

    def __len__(self) -> int:
        return len(self.visible) + 1


def lookup_column_stats(storage: Storage, data_timeline: Timeline,
                        keys: list[str]) -> dict[str, ColumnStats]:
    """The live column_stats entries of ``keys`` as a reader of ``data_timeline`` sees
    them (deleted and missing keys left out)."""
    from engine.metadata.reader import latest_group_slices, lookup_slice, route, validity
    from engine.metadata.table import MetadataTable

    mdt = MetadataTable(storage, data_timeline.config)
    if not keys or not mdt.exists:
        return {}
    groups = latest_group_slices(mdt, mdt.timeline(), validity(data_timeline), COLUMN_STATS)
    if not groups:
        return {}
    out: dict[str, ColumnStats] = {}
    for index, wanted in route(keys, len(groups)).items():
        for key, record in lookup_slice(mdt.storage, groups[index], wanted).items():
            payload = record.payload
            if isinstance(payload, ColumnStats) and not payload.is_deleted:
                out[key] = payload
    return out


def recompute(data_timeline: Timeline, instant: Instant, content: bytes,
              update: MetadataUpdate) -> MetadataUpdate | None:
    """The partition_stats records of the partitions the commit ``instant`` writes (see
    the module docstring); None for other actions and non-partitioned tables."""
    from engine.layout.view import TableView
    from engine.metadata.update import MetadataUpdate
    from engine.schema import table_schema

    config = data_timeline.config
    if (not config.partition_fields or not content or instant.action.completed_action
            not in (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT)):
        return None
    meta = CommitMetadata.from_bytes(content)
    touched = {s.partition_path for s in meta.write_stats}
    touched |= set(meta.partition_to_replace_file_ids)
    touched.discard("")
    if not touched:
        return None
    schema = table_schema(data_timeline)
    if schema is None:
        return None
    storage = data_timeline.storage
    view = TableView(storage, data_timeline)
    listed = view.list_table_files()
    bases = [f for f in listed.base_files if f.partition_path in touched]
    logs = [f for f in listed.log_files if f.partition_path in touched]
    t = instant.requested_time
    for stat in meta.write_stats:
        name = stat.path.rsplit("/", 1)[-1]
        base = parse_base_file(name)
        if base is not None:
            bases.append(BaseFile(stat.partition_path, base.file_id, base.instant_time, name,
                                  stat.file_size_in_bytes))
            continue
        log = parse_log_file(name)
        if log is not None:
            logs.append(LogFile(stat.partition_path, log.file_id, log.instant_time,
                                log.version, log.write_token, name, stat.file_size_in_bytes))
    files = TableFiles(tuple(bases), tuple(logs), tuple(sorted(touched)))
    replaced = {(p, i) for p, ids in meta.partition_to_replace_file_ids.items() for i in ids}
    slices = [s for s in build_file_slices(files, data_timeline,
                                           _WithInstant(view.visible, t))
              if (s.partition_path, s.file_id) not in replaced]
    columns = set(columns_to_index(schema, populate_meta_fields=config.populate_meta_fields))
    known: dict[tuple[str, str], dict[str, ColumnStats]] = {}
    for record in update.upserts.get(COLUMN_STATS, ()):
        p = record.payload
        if isinstance(p, ColumnStats) and p.file_name and p.column_name and not p.is_deleted:
            columns.add(p.column_name)
    # A column_stats key names its partition by hash (characters 12-24).
    by_hash = {b64_xxh64(partition_identifier(p)): p for p in touched}
    for record in update.upserts.get(COLUMN_STATS, ()):
        p = record.payload
        partition = by_hash.get(record.key[12:24])
        if (partition is not None and isinstance(p, ColumnStats) and p.file_name
                and p.column_name and not p.is_deleted):
            known.setdefault((partition, p.file_name), {})[p.column_name] = p
    per_partition: dict[str, list[tuple[str, str]]] = {p: [] for p in touched}
    for slc in slices:
        names = ([slc.base_file.name] if slc.base_file is not None else [])
        names += [log.name for log in slc.log_files]
        per_partition[slc.partition_path] += [(slc.partition_path, n) for n in names]
    ordered = sorted(columns)
    wanted = {column_stats_key(c, part, n): (part, n, c)
              for files_of in per_partition.values() for part, n in files_of
              if (part, n) not in known for c in ordered}
    for key, stats in lookup_column_stats(storage, data_timeline, list(wanted)).items():
        part, n, c = wanted[key]
        known.setdefault((part, n), {})[c] = stats
    out = MetadataUpdate()
    records: list[MetadataRecord] = []
    for partition in sorted(touched):
        files_of = per_partition[partition]
        for c in ordered:
            merged = merge_bounds((known.get(f, {}).get(c) for f in files_of), c)
            records.append(partition_stats_record(partition, c, merged))
    out.add(PARTITION_STATS, records)
    # Columns another writer (Java) kept partition stats of and this one does not compute
    # (decimals, binaries, beyond the column limit): their bounds in the touched partitions
    # no longer hold, so their entries are deleted (a missing entry rules nothing out). The
    # meta fields no writer indexes are left out (a table whose every column is indexed
    # deletes nothing).
    unkept = sorted(set(schema.names) - columns
                    - (set(META_FIELDS) - set(META_COLUMNS_TO_INDEX)))
    out.delete(PARTITION_STATS, [partition_stats_key(c, p) for p in sorted(touched)
                                 for c in unkept])
    return out


# -- the partition ----------------------------------------------------------------------------

def _build(view: TableView, write_config: WriteConfig) -> list[MetadataRecord]:
    if not view.config.partition_fields:
        return []
    by_partition: dict[str, list[dict[str, ColumnStats]]] = {}
    for (partition, _), stats in table_file_stats(view, write_config).items():
        by_partition.setdefault(partition, []).append(stats)
    columns = table_columns(view, write_config)
    return [partition_stats_record(p, c, merge_bounds((f.get(c) for f in files), c))
            for p, files in sorted(by_partition.items()) for c in columns]


def _wanted(write_config: WriteConfig) -> bool | None:
    if write_config.column_stats_enable is False:
        return False  # partition stats are built from column stats
    if write_config.partition_stats_enable is not None:
        return write_config.partition_stats_enable
    return write_config.column_stats_enable  # Hudi: follows column stats by default


PARTITION = IndexPartition(PARTITION_STATS, _wanted,
                           lambda _view, wc: wc.partition_stats_file_groups, _build,
                           sync=recompute)
