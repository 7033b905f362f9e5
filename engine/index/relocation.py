"""Where the records of a replaced file group went: for indexes kept outside the table.

A clustering completes as a replacecommit: it rewrote the records of its input file groups
into new groups in the same partition, and it names the inputs replaced
(``partitionToReplaceFileIds``). Readers skip replaced groups, and a write into one is
refused (:func:`engine.write.conflicts.check_conflicts`): its data would never be read.
Hudi's own indexes either read locations from the table (simple, bloom) or are rewritten by
the clustering's commit (the metadata table's record index). An index kept *outside* the
table — the streaming job's state-store global index — still names the old group after a
clustering; it asks here where a key went.

:class:`FileGroupLineage` maps each replaced group to the groups its replacecommit wrote,
following chains (a clustering of a clustering's output) to the groups still live; archived
replacecommits count too, since an outside index can name a group replaced long ago.
:class:`MovedKeys` finds which of those groups holds a key. The base file a replacecommit
wrote for a group holds exactly the keys moved there: the clustering carries every write
that reached its input groups into its output before it commits, and nothing is written
into a replaced group after that. So that file is read once, by its key column only, and
kept sorted in memory; a lookup is a binary search. When the cleaner has removed it (the
group was compacted and the file left the retained commits), the group's latest base file
holds the same keys and is read instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from engine.config import TableConfig
from engine.format.base_file import read_base_file
from engine.format.naming import parse_base_file
from engine.schema import RECORD_KEY
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import CommitMetadata
from engine.timeline.instant import Action

__all__ = ["FileGroupLineage", "MovedKeys", "Relocations", "Replacement"]


@dataclass(frozen=True)
class Replacement:
    """One replacecommit's effect on one partition."""

    instant: str
    """The replacecommit's requested time."""
    successors: Mapping[str, str]
    """File id → the base file (relative path) the replacecommit wrote for it."""


class FileGroupLineage:
    """(partition, file id) of every replaced file group → its :class:`Replacement`."""

    def __init__(self, replaced: Mapping[tuple[str, str], Replacement]) -> None:
        self._replaced = dict(replaced)
        self._successors: dict[tuple[str, str], dict[str, str]] = {}

    @classmethod
    def of(cls, timeline: Timeline) -> FileGroupLineage:
        """The lineage of every completed replacecommit, active and archived."""
        replaced: dict[tuple[str, str], Replacement] = {}
        metas: list[tuple[str, CommitMetadata]] = []
        for row in timeline.archived():
            if row.action == Action.REPLACE_COMMIT.value:
                metas.append((row.requested_time, timeline.archived_commit_metadata(row)))
        for instant in timeline.completed_data_instants:
            if instant.action.completed_action is Action.REPLACE_COMMIT:
                metas.append((instant.requested_time, timeline.commit_metadata(instant)))
        for requested, meta in metas:
            written: dict[str, dict[str, str]] = {}
            for stat in meta.write_stats:
                written.setdefault(stat.partition_path, {})[stat.file_id] = stat.path
            for partition, ids in meta.partition_to_replace_file_ids.items():
                step = Replacement(requested, written.get(partition, {}))
                for file_id in ids:
                    replaced[(partition, file_id)] = step
        return cls(replaced)

    def __bool__(self) -> bool:
        return bool(self._replaced)

    def is_replaced(self, partition: str, file_id: str) -> bool:
        return (partition, file_id) in self._replaced

    def live_successors(self, partition: str, file_id: str) -> dict[str, str]:
        """The live groups that hold the records of a replaced group (none for a live one):
        file id → the base file the replacecommit that made it wrote, by file id (walked
        once per group: the lineage does not change)."""
        cached = self._successors.get((partition, file_id))
        if cached is not None:
            return cached
        found: dict[str, str] = {}
        todo, seen = [file_id], {file_id}
        while todo:
            step = self._replaced.get((partition, todo.pop()))
            if step is None:
                continue
            for successor, path in step.successors.items():
                if successor in seen:
                    continue
                seen.add(successor)
                if (partition, successor) in self._replaced:
                    todo.append(successor)
                else:
                    found[successor] = path
        result = self._successors[(partition, file_id)] = dict(sorted(found.items()))
        return result


class MovedKeys:
    """Finds keys in the groups that replaced a file group, reading each such group's keys
    once (:mod:`engine.index.relocation`). Thread-safe; the sorted key arrays of at most
    ``max_bytes`` of files are kept (least recently used first out)."""

    def __init__(self, storage: Storage, *, max_bytes: int = 256 << 20) -> None:
        self.storage = storage
        self.max_bytes = max_bytes
        self._keys: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def locate(self, timeline: Timeline, lineage: FileGroupLineage, partition: str,
               file_id: str, keys: Sequence[str]) -> list[str | None]:
        """For each key once stored in ``(partition, file_id)``: the live file group that
        holds it now — ``file_id`` itself while that group is not replaced — or None when
        no group that replaced it has the key (it was deleted, or never written)."""
        if not lineage.is_replaced(partition, file_id):
            return [file_id] * len(keys)
        found: list[str | None] = [None] * len(keys)
        wanted = np.array([k.encode("utf-8") for k in keys], dtype=object)
        if not len(wanted):
            return found
        for successor, path in lineage.live_successors(partition, file_id).items():
            stored = self._sorted_keys(timeline, partition, successor, path)
            if not len(stored):
                continue
            probe = wanted.astype(stored.dtype)
            at = np.searchsorted(stored, probe)
            hit = (at < len(stored)) & (stored[np.minimum(at, len(stored) - 1)] == probe)
            for i in np.flatnonzero(hit):
                if found[i] is None and len(wanted[i]) <= stored.dtype.itemsize:
                    found[i] = successor
        return found

    def _sorted_keys(self, timeline: Timeline, partition: str, file_id: str,
                     written: str) -> np.ndarray:
        """The keys moved into ``file_id``, cached under ``written`` (the replacecommit's
        file) whichever file they were read from: any base file of the group since then
        holds them, so a hit costs no I/O even after the cleaner removed ``written``."""
        with self._lock:
            hit = self._keys.get(written)
            if hit is not None:
                self._keys.move_to_end(written)
                return hit
        path = written if self.storage.exists(written) else \
            _latest_base_file(self.storage, timeline, partition, file_id)
        if path is None:
            return np.array([], dtype="S1")
        with self.storage.open_input(path) as source:
            column = read_base_file(source, columns=[RECORD_KEY]).column(0)
        keys = _sorted_bytes(column)
        with self._lock:
            if written not in self._keys:
                self._keys[written] = keys
                self._bytes += keys.nbytes
                while self._bytes > self.max_bytes and len(self._keys) > 1:
                    _, dropped = self._keys.popitem(last=False)
                    self._bytes -= dropped.nbytes
        return keys


_MOVED_KEYS: dict[str, MovedKeys] = {}
"""Per table path: the keys of clustering outputs, read once per process."""


@dataclass
class Relocations:
    """A table's replaced file groups as one reader of an outside index sees them: the
    lineage of its timeline as loaded by :meth:`load`, and the keys of the groups that
    replaced them (shared by every :class:`Relocations` of the table in the process)."""

    timeline: Timeline
    lineage: FileGroupLineage
    moved: MovedKeys

    @classmethod
    def load(cls, storage: Storage, config: TableConfig) -> Relocations:
        """The table at ``storage`` as its timeline is now."""
        timeline = Timeline.load(storage, config)
        moved = _MOVED_KEYS.setdefault(storage.base_path, MovedKeys(storage))
        return cls(timeline, FileGroupLineage.of(timeline), moved)

    def locate(self, partition: str, file_id: str, key: str) -> str | None:
        """:meth:`MovedKeys.locate` for one key once stored in ``(partition, file_id)``."""
        return self.moved.locate(self.timeline, self.lineage, partition, file_id, [key])[0]


def _sorted_bytes(column: pa.ChunkedArray) -> np.ndarray:
    """Keys as a sorted fixed-width bytes array (numpy compares them as bytes)."""
    values = [v for v in column.cast(pa.string()).to_pylist() if v is not None]
    if not values:
        return np.array([], dtype="S1")
    return np.sort(np.array([v.encode("utf-8") for v in values], dtype=bytes))


def _latest_base_file(storage: Storage, timeline: Timeline, partition: str,
                      file_id: str) -> str | None:
    """The newest completed base file of one file group, by listing its partition."""
    done = {i.requested_time for i in timeline.completed_data_instants}
    archived = timeline.archived()
    best: tuple[str, str] | None = None
    for status in storage.list_dir(partition):
        name = parse_base_file(status.name)
        if name is None or name.file_id != file_id:
            continue
        if name.instant_time not in done and name.instant_time not in archived:
            continue  # written by an attempt that never completed
        if best is None or name.instant_time > best[0]:
            best = (name.instant_time, f"{partition}/{status.name}" if partition
                    else status.name)
    return None if best is None else best[1]
