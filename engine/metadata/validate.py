"""Checking the metadata table against storage, and rebuilding it.

:func:`validate` compares the ``files`` partition, merged as a reader merges it, with a walk
of the table folder restricted to files of completed data instants, and reports every
difference (a file the MDT lacks, a file it lists that storage does not hold, a size that
differs, a data action without its deltacommit). When the table keeps the ``record_index``,
every live record key of the latest snapshot is checked against it (a key the index lacks,
an entry for a key no slice holds, an entry pointing at a group that does not hold the key):
a wrong record index makes writers duplicate or lose records. ``tidelake table metadata
validate`` prints them; ``rebuild`` drops the MDT and builds it from storage under the table
lock.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from engine.layout.file_group import TableFiles, list_table_files, visible_instants
from engine.metadata.files import listing_of, live_files
from engine.metadata.keys import ALL_PARTITIONS_KEY
from engine.metadata.listing import missing_deltacommits, read_files_partition, validity
from engine.metadata.record_index import RECORD_INDEX
from engine.metadata.table import FILES, MetadataTable, declared_partitions
from engine.storage import Storage
from engine.timeline.active import Timeline


@dataclass(frozen=True)
class Difference:
    """One way the MDT and storage disagree."""

    kind: str  # "missing from the MDT" | "not on storage" | "size" | "deltacommit" | "record index"
    partition: str
    name: str
    detail: str = ""

    def __str__(self) -> str:
        where = f"{self.partition}/{self.name}" if self.partition else self.name
        return f"{self.kind}: {where}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Validation:
    """The outcome of :func:`validate`."""

    declared: tuple[str, ...]
    files_checked: int
    differences: tuple[Difference, ...]
    keys_checked: int = 0
    """Record keys checked against the ``record_index`` (0 when the table keeps none)."""

    @property
    def ok(self) -> bool:
        """True when the MDT is declared and agrees with storage."""
        return FILES in self.declared and not self.differences


def committed_files(storage: Storage, timeline: Timeline) -> TableFiles:
    """Data files on storage whose instant is completed on ``timeline`` (or archived)."""
    visible = visible_instants(timeline)
    listed = list_table_files(storage)
    return TableFiles(tuple(f for f in listed.base_files if f.instant_time in visible),
                      tuple(f for f in listed.log_files if f.instant_time in visible),
                      listed.partitions)


def _pending_clean_files(storage: Storage, timeline: Timeline) -> set[tuple[str, str]]:
    """(partition identifier, file name) of every file a pending clean plans to delete: a
    clean deletes its files before it completes and tells the MDT at its commit, as Hudi's
    does, so until then the MDT still lists them (no reader reads them: they are in no
    latest slice)."""
    from engine.metadata.keys import partition_identifier
    from engine.services.clean import CleanerPlan
    from engine.timeline.instant import Action

    out: set[tuple[str, str]] = set()
    for pending in timeline.pending([Action.CLEAN]):
        rel = f"{timeline.folder}/{pending.requested_time}.clean.requested"
        try:
            plan = CleanerPlan.from_bytes(storage.read(rel), storage, rel)
        except (FileNotFoundError, ValueError):
            continue
        for partition, paths in plan.files.items():
            out |= {(partition_identifier(partition), p.rsplit("/", 1)[-1]) for p in paths}
    return out


def validate(storage: Storage, timeline: Timeline) -> Validation:
    """Compare the MDT's ``files`` partition with storage (``timeline`` loaded now)."""
    declared = declared_partitions(storage)
    mdt = MetadataTable(storage, timeline.config)
    if FILES not in declared or not mdt.exists:
        return Validation(declared, 0, ())
    mdt_timeline = mdt.timeline()
    diffs: list[Difference] = [
        Difference("deltacommit", "", t, "a completed data action the MDT does not know")
        for t in missing_deltacommits(mdt_timeline, timeline)]
    merged = read_files_partition(mdt, mdt_timeline, validity(timeline))
    expected = {r.key: r for r in listing_of(committed_files(storage, timeline))}
    being_cleaned = _pending_clean_files(storage, timeline)
    checked = 0
    for key in sorted(set(expected) | set(merged)):
        if key == ALL_PARTITIONS_KEY:
            continue
        want = live_files(expected[key]) if key in expected else {}
        have = live_files(merged[key]) if key in merged else {}
        for name in sorted(set(want) | set(have)):
            checked += 1
            if name not in have:
                diffs.append(Difference("missing from the MDT", key, name))
            elif name not in want:
                if (key, name) in being_cleaned:
                    continue  # a pending clean deleted it; its commit will tell the MDT
                diffs.append(Difference("not on storage", key, name,
                                        "listed by the MDT, absent or uncommitted"))
            elif want[name] != have[name]:
                diffs.append(Difference("size", key, name,
                                        f"storage {want[name]}, MDT {have[name]}"))
    listed = set(live_files(merged[ALL_PARTITIONS_KEY])) if ALL_PARTITIONS_KEY in merged else set()
    for key in expected:
        if key != ALL_PARTITIONS_KEY and live_files(expected[key]) and key not in listed:
            diffs.append(Difference("missing from the MDT", key, "(partition)",
                                    "not in __all_partitions__"))
    keys_checked = 0
    # The snapshot's slices come through the MDT listing: checked against storage above.
    if RECORD_INDEX in declared and not diffs:
        keys_checked = _check_record_index(storage, timeline, mdt, mdt_timeline, diffs)
    return Validation(declared, checked, tuple(diffs), keys_checked)


def _check_record_index(storage: Storage, timeline: Timeline, mdt: MetadataTable,
                        mdt_timeline: Timeline, diffs: list[Difference]) -> int:
    """Append a difference for every record key the ``record_index`` gets wrong against the
    latest snapshot's slices; the number of keys checked. A key held by several groups
    (``insert`` writes without a lookup) is right wherever the index points among them.
    Both sides are Arrow columns joined by key (a table of 10M keys is checked without a
    Python object per key)."""
    import numpy as np
    import pyarrow.compute as pc

    from engine.layout.view import TableView
    from engine.metadata.reader import latest_group_slices, read_slice
    from engine.metadata.records import RecordIndexInfo
    from engine.schema import RECORD_KEY

    groups: list[tuple[str, str]] = []
    number: dict[tuple[str, str], int] = {}

    def group_number(where: tuple[str, str]) -> int:
        if where not in number:
            number[where] = len(groups)
            groups.append(where)
        return number[where]

    view = TableView(storage, timeline)
    reader = view.slice_reader(use_threads=True)
    held = []
    for slc in view.latest_file_slices():
        keys = reader.read_slice(slc, columns=[RECORD_KEY]).column(RECORD_KEY)
        keys = keys.combine_chunks().cast(pa.string())
        at = group_number((slc.partition_path, slc.file_id))
        held.append(pa.table({"key": keys, "held": np.full(len(keys), at, dtype=np.int32)}))
    indexed = []
    for piece in latest_group_slices(mdt, mdt_timeline, validity(timeline), RECORD_INDEX):
        entry_keys: list[str] = []
        locations: list[int] = []
        for key, record in read_slice(mdt.storage, piece).items():
            info = record.payload
            if isinstance(info, RecordIndexInfo):
                entry_keys.append(key)
                locations.append(group_number((info.partition_name or "",
                                               info.location_file_id)))
        indexed.append(pa.table({"key": pa.array(entry_keys, pa.string()),
                                 "indexed": pa.array(locations, pa.int32())}))
    data = pa.concat_tables(held) if held else pa.table(
        {"key": pa.array([], pa.string()), "held": pa.array([], pa.int32())})
    index = pa.concat_tables(indexed) if indexed else pa.table(
        {"key": pa.array([], pa.string()), "indexed": pa.array([], pa.int32())})
    joined = data.join(index, "key", join_type="full outer")
    held_at, indexed_at = joined.column("held"), joined.column("indexed")
    keys = joined.column("key")
    lacking = pc.unique(keys.filter(pc.is_null(indexed_at)))
    unheld = joined.filter(pc.is_null(held_at))
    both = joined.filter(pc.and_(pc.is_valid(held_at), pc.is_valid(indexed_at)))
    right = pc.unique(both.column("key").filter(pc.equal(both.column("held"),
                                                         both.column("indexed"))))
    wrong = both.filter(pc.invert(pc.is_in(both.column("key"), value_set=right)))
    found: list[Difference] = [Difference(RECORD_INDEX_KIND, RECORD_INDEX, key,
                                          "a live key the index lacks")
                               for key in lacking.to_pylist()]
    for key, at in zip(unheld.column("key").to_pylist(), unheld.column("indexed").to_pylist(),
                       strict=True):
        found.append(Difference(RECORD_INDEX_KIND, RECORD_INDEX, key,
                                f"indexed at {_group(groups[at])}, held by no slice"))
    holders: dict[str, list[int]] = {}
    pointed: dict[str, int] = {}
    for key, h, i in zip(wrong.column("key").to_pylist(), wrong.column("held").to_pylist(),
                         wrong.column("indexed").to_pylist(), strict=True):
        holders.setdefault(key, []).append(h)
        pointed[key] = i
    for key, at in pointed.items():
        found.append(Difference(RECORD_INDEX_KIND, RECORD_INDEX, key, (
            f"indexed at {_group(groups[at])}, held by "
            + ", ".join(_group(groups[g]) for g in sorted(set(holders[key]),
                                                          key=lambda g: groups[g])))))
    diffs.extend(sorted(found, key=lambda d: d.name))
    return len(pc.unique(data.column("key"))) if data.num_rows else 0


RECORD_INDEX_KIND = "record index"


def _group(where: tuple[str, str]) -> str:
    partition, file_id = where
    return f"{partition or '(no partition)'}/{file_id}"
