"""File groups and file slices: which data files make up a view of the table.

A file group is (partition path, file id). A file slice is one base file (optional) plus
its ordered log files. Which files a view sees depends on the set of *visible* completed
instants (all of them for a snapshot; those at or before ``as_of`` for time travel):

* v8 (layout 2): a base file starts a slice at its requested instant; a log file, named
  with its own deltacommit instant, belongs to the slice with the greatest base instant
  ≤ the log's completion time; logs are ordered by (completion time, version, token).
* v6 (layout 1): a log file's name carries the base instant of its slice; visibility of
  its content is decided per block (:mod:`engine.read.reader`).

Files of instants that are not visible — in flight, failed, rolled back — are never part
of a view, and neither are file groups replaced by a visible replacecommit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from engine.format.naming import parse_base_file, parse_log_file
from engine.storage import Storage
from engine.timeline.active import HOODIE, Timeline, completion_key
from engine.timeline.instant import Action


@dataclass(frozen=True)
class BaseFile:
    """A base (parquet) file of a file group."""

    partition_path: str
    file_id: str
    instant_time: str
    name: str
    size: int

    @property
    def path(self) -> str:
        """Path relative to the table's base path."""
        return f"{self.partition_path}/{self.name}" if self.partition_path else self.name


@dataclass(frozen=True)
class LogFile:
    """A log file of a file group, with the completion time of the instant in its name."""

    partition_path: str
    file_id: str
    instant_time: str
    version: int
    write_token: str
    name: str
    size: int
    completion_time: str | None = None

    @property
    def path(self) -> str:
        """Path relative to the table's base path."""
        return f"{self.partition_path}/{self.name}" if self.partition_path else self.name

    def sort_key(self) -> tuple[str, int, str]:
        """Order of logs within a slice."""
        return (self.completion_time or self.instant_time, self.version, self.write_token)


@dataclass
class FileSlice:
    """One base file (or none) plus the log files written on top of it."""

    partition_path: str
    file_id: str
    base_instant: str
    base_file: BaseFile | None = None
    log_files: list[LogFile] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        """True if the slice has no files at all."""
        return self.base_file is None and not self.log_files

    def total_size(self) -> int:
        """Bytes of the base file and all logs."""
        size = self.base_file.size if self.base_file else 0
        return size + sum(log.size for log in self.log_files)


@dataclass(frozen=True)
class TableFiles:
    """Every data file found by listing, grouped by partition (no visibility applied)."""

    base_files: tuple[BaseFile, ...]
    log_files: tuple[LogFile, ...]
    partitions: tuple[str, ...]


def list_table_files(storage: Storage, folders: Iterable[str] | None = None) -> TableFiles:
    """Walk the table folder (skipping ``.hoodie``) and parse every data file name
    (``folders``: walk only those folders and what is below them)."""
    bases: list[BaseFile] = []
    logs: list[LogFile] = []
    partitions: list[str] = []
    walks = ([storage.walk_files("", skip=(HOODIE,))] if folders is None
             else [storage.walk_files(folder) for folder in sorted(set(folders))])
    for folder, files in (found for walk in walks for found in walk):
        found = False
        for status in files:
            base = parse_base_file(status.name)
            if base is not None:
                bases.append(BaseFile(folder, base.file_id, base.instant_time,
                                      status.name, status.size))
                found = True
                continue
            log = parse_log_file(status.name)
            if log is not None:
                logs.append(LogFile(folder, log.file_id, log.instant_time, log.version,
                                    log.write_token, status.name, status.size))
                found = True
        if found:
            partitions.append(folder)
    return TableFiles(tuple(bases), tuple(logs), tuple(sorted(set(partitions))))


class Visibility(Mapping[str, str]):
    """The completed data instants a view sees: requested time → completion ordering key.

    Instants of the active timeline are held; archived ones (in the LSM history, or older
    than the active timeline: Java treats those as completed) are looked up on demand, so
    the history is read only when a data file's instant is not on the active timeline.
    Iterating lists the active instants and, loading the history, the archived ones in it.
    """

    def __init__(self, timeline: Timeline, active: dict[str, str], *,
                 as_of: str | None = None, end_completion: str | None = None) -> None:
        self.timeline = timeline
        self.active = active
        self.as_of = as_of
        self.end_completion = end_completion
        self._looked_up: dict[str, str | None] = {}
        self.used_archived = False
        """True once an archived instant was found visible (its replacecommits then count)."""

    def _in_view(self, requested_time: str, key: str) -> bool:
        if self.as_of is not None and requested_time > self.as_of:
            return False
        return self.end_completion is None or key <= self.end_completion

    def _archived(self, requested_time: str) -> str | None:
        if requested_time not in self._looked_up:
            key = self.timeline.archived_completion_key(requested_time)
            if key is not None and not self._in_view(requested_time, key):
                key = None
            self._looked_up[requested_time] = key
            if key is not None:
                self.used_archived = True
        return self._looked_up[requested_time]

    def __getitem__(self, requested_time: str) -> str:
        found = self.active.get(requested_time)
        if found is None:
            found = self._archived(requested_time)
        if found is None:
            raise KeyError(requested_time)
        return found

    def __contains__(self, requested_time: object) -> bool:
        return isinstance(requested_time, str) and self.get(requested_time) is not None

    def archived_items(self) -> dict[str, str]:
        """Visible archived instants recorded in the history (loads it)."""
        found: dict[str, str] = {}
        for row in self.timeline.archived():
            if row.requested_time in self.active:
                continue
            key = self._archived(row.requested_time)
            if key is not None:
                found[row.requested_time] = key
        return found

    def __iter__(self) -> Iterator[str]:
        return iter({**self.archived_items(), **self.active})

    def __len__(self) -> int:
        return len({**self.archived_items(), **self.active})

    def completed_after(self, start: str, *, inclusive: bool = False) -> list[str]:
        """Requested times of visible instants whose completion key is > ``start`` (>= with
        ``inclusive``); the history is read only if ``start`` precedes the active timeline's
        instants."""

        def after(completed: str) -> bool:
            return completed >= start if inclusive else completed > start

        times = [t for t, c in self.active.items() if after(c)]
        first_active = min(self.active.values(), default=None)
        if first_active is None or start < first_active:
            times += [t for t, c in self.archived_items().items() if after(c)]
        return sorted(times)


def delete_unreferenced(storage: Storage, instant_time: str,
                        referenced: Iterable[str]) -> None:
    """Delete the data files (base and log) named with ``instant_time`` that ``referenced``
    (paths relative to the table) does not list: files of task attempts that failed and were
    retried, in the partitions ``referenced`` names. A writer or table service calls it
    before its commit point, so no reader ever sees them."""
    keep = set(referenced)
    # Only the partitions the instant wrote: a retried task attempt writes the same file
    # group as the attempt that died, so no commit walks the whole table here.
    for folder in sorted({path.rpartition("/")[0] for path in keep}):
        for status in storage.list_dir(folder):
            parsed = parse_base_file(status.name) or parse_log_file(status.name)
            path = f"{folder}/{status.name}" if folder else status.name
            if (parsed is not None and parsed.instant_time == instant_time
                    and path not in keep):
                storage.delete(path)


def visible_instants(timeline: Timeline, *, as_of: str | None = None,
                     end_completion: str | None = None) -> Visibility:
    """Completed data instants a view sees: requested time → completion ordering key.

    ``as_of`` (time travel): the instants requested by then (Java's and hudi-rs's rule), but
    not a replacecommit that completed after ``as_of`` did (after the time, for a time that
    is no instant): a clustering carries writes that completed while it ran into its new
    file groups, so its files may hold data of commits later than ``as_of``. Until it
    completed, the groups it replaces held that view (the cleaner keeps them as long as a
    readable view needs them: :mod:`engine.services.clean`). A compaction's base file only
    holds logs that completed before its instant, so it stays in the view by its instant.
    """
    cut: str | None = None
    if as_of is not None:
        cut = timeline.completion_time_of(as_of)
        if cut is None and as_of not in timeline.active_times:
            cut = timeline.archived_completion_key(as_of)
        cut = max(as_of, cut or as_of)
    visible: dict[str, str] = {}
    for instant in timeline.completed_data_instants:
        if as_of is not None and instant.requested_time > as_of:
            continue
        key = completion_key(instant)
        if end_completion is not None and key > end_completion:
            continue
        if (cut is not None and key > cut
                and instant.action.completed_action is Action.REPLACE_COMMIT):
            continue
        visible[instant.requested_time] = key
    return Visibility(timeline, visible, as_of=as_of, end_completion=end_completion)


def replaced_file_groups(timeline: Timeline, visible: Mapping[str, str]) -> set[tuple[str, str]]:
    """(partition, file id) of file groups replaced by visible replacecommits (archived
    ones too once the view has read an archived instant's files)."""
    replaced: set[tuple[str, str]] = set()
    for instant in timeline.completed_data_instants:
        if instant.requested_time not in visible:
            continue
        if instant.action.completed_action.value != "replacecommit":
            continue
        meta = timeline.commit_metadata(instant)
        for partition, ids in meta.partition_to_replace_file_ids.items():
            replaced.update((partition, fid) for fid in ids)
    if isinstance(visible, Visibility) and visible.used_archived:
        for row in timeline.archived():
            if row.action != "replacecommit" or row.requested_time not in visible:
                continue
            meta = timeline.archived_commit_metadata(row)
            for partition, ids in meta.partition_to_replace_file_ids.items():
                replaced.update((partition, fid) for fid in ids)
    return replaced


def build_file_slices(files: TableFiles, timeline: Timeline, visible: Mapping[str, str],
                      *, latest_only: bool = True,
                      pending_slice_starts: Mapping[tuple[str, str], str] | None = None,
                      include_replaced: bool = False) -> list[FileSlice]:
    """File slices of every live file group under the given visibility, by partition/id.

    ``pending_slice_starts`` (the cleaner's view, v8): (partition, file id) → the instant
    of a pending compaction planned for that group. As Java's file-system view does, an
    empty slice starts there, so logs completing after it belong to it; such empty slices
    are returned (they are the latest slice of their group). ``include_replaced``: also
    return the slices of groups replaced by a visible replacecommit.
    """
    by_completion = timeline.config.table_version.completion_times
    groups: dict[tuple[str, str], dict[str, FileSlice]] = {}
    pending = dict(pending_slice_starts or {}) if by_completion else {}
    for (partition, file_id), start in pending.items():
        groups.setdefault((partition, file_id), {})[start] = FileSlice(partition, file_id, start)
    for base in files.base_files:
        if base.instant_time not in visible:
            continue
        slices = groups.setdefault((base.partition_path, base.file_id), {})
        current = slices.get(base.instant_time)
        if current is None or current.base_file is None:
            slices[base.instant_time] = FileSlice(base.partition_path, base.file_id,
                                                  base.instant_time, base)
    for log in files.log_files:
        group_key = (log.partition_path, log.file_id)
        slices = groups.setdefault(group_key, {})
        if by_completion:
            completion = visible.get(log.instant_time)
            if completion is None:
                continue  # uncommitted or not yet visible: never read
            log = LogFile(log.partition_path, log.file_id, log.instant_time, log.version,
                          log.write_token, log.name, log.size, completion)
            owner = max((t for t in slices if t <= completion), default=None)
            if owner is None:
                owner = log.instant_time  # a log-only file group starts here
                slices[owner] = FileSlice(log.partition_path, log.file_id, owner)
        else:
            owner = log.instant_time
            if owner not in slices:
                slices[owner] = FileSlice(log.partition_path, log.file_id, owner)
        slices[owner].log_files.append(log)
    replaced = (set() if include_replaced  # after the files: see Visibility
                else replaced_file_groups(timeline, visible))
    result: list[FileSlice] = []
    for (partition, file_id), slices in sorted(groups.items()):
        if (partition, file_id) in replaced or not slices:
            continue
        for slc in slices.values():
            slc.log_files.sort(key=LogFile.sort_key)
        barrier = pending.get((partition, file_id))
        if by_completion:
            _merge_log_only_slices(slices, barrier)
        ordered = [slices[t] for t in sorted(slices)]
        ordered = [s for s in ordered if not s.is_empty or s.base_instant == barrier]
        if not ordered:
            continue
        result.extend(ordered[-1:] if latest_only else ordered)
    return result


def _merge_log_only_slices(slices: dict[str, FileSlice], barrier: str | None = None) -> None:
    """v8: consecutive log-only slices of one group are one slice (no base file between);
    a pending compaction's slice (``barrier``) starts a slice as a base file does."""
    keys = sorted(slices)
    merged_into: str | None = None
    for key in keys:
        slc = slices[key]
        if slc.base_file is None and merged_into is not None and key != barrier:
            slices[merged_into].log_files.extend(slc.log_files)
            slices[merged_into].log_files.sort(key=LogFile.sort_key)
            del slices[key]
            continue
        merged_into = key


def partitions_of(slices: Iterable[FileSlice]) -> list[str]:
    """Distinct partition paths of the given slices, sorted."""
    return sorted({s.partition_path for s in slices})
