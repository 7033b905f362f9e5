"""The v8 timeline history (the "LSM timeline"): archived instants under
``.hoodie/timeline/history/`` (docs/engine.md, "Archival"; Java ``LSMTimeline``,
``LSMTimelineWriter``, ``HoodieLSMTimelineManifest``).

Three kinds of file:

* ``<min>_<max>_<level>.parquet``: rows of ``HoodieLSMTimelineInstant`` (``instantTime``,
  ``completionTime``, ``action``, ``metadata``, ``plan``, ``version``), one per archived
  action, sorted by requested time; ``min``/``max`` are the requested times of the first and
  last row (for a merged file: of its inputs). Written as parquet-avro writes them, with the
  ``parquet.avro.schema`` and ``writer.model.name=avro`` key-value metadata.
* ``manifest_<N>``: the files of snapshot N (Jackson-pretty JSON
  ``{"files":[{"fileName":…,"fileLen":…}]}``); only files of the latest manifest are visible.
* ``_version_``: the latest N as decimal text; readers fall back to the highest manifest.

Storage contract used: a file published by :meth:`~engine.storage.Storage.write_new` is
complete or absent, so a crash leaves at worst a parquet file no manifest lists (deleted and
rewritten by the next run) or a manifest newer than ``_version_`` (overwritten by the next
run, which computes N from ``_version_``). Writers hold the table lock.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import CorruptTableError
from engine.format.jackson import pretty_json
from engine.storage import Storage

HISTORY_SCHEMA = pa.schema([
    pa.field("instantTime", pa.string()),
    pa.field("completionTime", pa.string()),
    pa.field("action", pa.string()),
    pa.field("metadata", pa.binary()),
    pa.field("plan", pa.binary()),
    pa.field("version", pa.int32(), nullable=False),
])
"""Parquet schema of history files (``HoodieLSMTimelineInstant``)."""

AVRO_SCHEMA = {
    "type": "record", "name": "HoodieLSMTimelineInstant",
    "namespace": "org.apache.hudi.avro.model",
    "fields": [
        {"name": "instantTime", "type": ["null", "string"], "default": None},
        {"name": "completionTime", "type": ["null", "string"], "default": None},
        {"name": "action", "type": ["null", "string"], "default": None},
        {"name": "metadata", "type": ["null", "bytes"], "default": None},
        {"name": "plan", "type": ["null", "bytes"], "default": None},
        {"name": "version", "type": "int", "default": 1},
    ],
}

VERSION_FILE = "_version_"
MANIFEST_PREFIX = "manifest_"
MANIFEST_VERSIONS_RETAINED = 3
"""Manifest versions a cleanup keeps (Java ``getTimelineManifestRetainedVersions``)."""
COMPACTION_MAX_BYTES = 1 << 30
"""Size cap of one LSM merge's inputs (Java: 1 GB)."""

_FILE = re.compile(r"^(\d+)_(\d+)_(\d)\.parquet$")
_MANIFEST = re.compile(rf"^{MANIFEST_PREFIX}(\d+)$")


@dataclass(frozen=True)
class ArchivedInstant:
    """One row of the history: an archived action with its timeline files' bytes."""

    requested_time: str
    completion_time: str | None
    action: str
    metadata: bytes | None = None
    plan: bytes | None = None


@dataclass(frozen=True)
class HistoryFile:
    """A history parquet file as a manifest lists it."""

    name: str
    size: int

    @property
    def min_time(self) -> str:
        """Requested time of the file's first row."""
        return _parse_name(self.name)[0]

    @property
    def max_time(self) -> str:
        """Requested time of the file's last row."""
        return _parse_name(self.name)[1]

    @property
    def level(self) -> int:
        """LSM level (0: written by an archival, n+1: merged from level n)."""
        return _parse_name(self.name)[2]


def _parse_name(name: str) -> tuple[str, str, int]:
    m = _FILE.match(name)
    if m is None:
        raise CorruptTableError(f"timeline history file name {name!r} is not "
                                "<min>_<max>_<level>.parquet")
    return m.group(1), m.group(2), int(m.group(3))


def file_name(min_time: str, max_time: str, level: int) -> str:
    """``<min>_<max>_<level>.parquet``."""
    return f"{min_time}_{max_time}_{level}.parquet"


def manifest_json(files: Sequence[HistoryFile]) -> str:
    """A manifest as Jackson's default pretty printer writes ``HoodieLSMTimelineManifest``
    (:func:`engine.format.jackson.pretty_json`)."""
    return pretty_json({"files": [{"fileName": f.name, "fileLen": f.size} for f in files]})


def rows_to_table(rows: Sequence[ArchivedInstant]) -> pa.Table:
    """History rows as an Arrow table of :data:`HISTORY_SCHEMA` (with the parquet-avro
    key-value metadata)."""
    table = pa.table({
        "instantTime": pa.array([r.requested_time for r in rows], pa.string()),
        "completionTime": pa.array([r.completion_time for r in rows], pa.string()),
        "action": pa.array([r.action for r in rows], pa.string()),
        "metadata": pa.array([r.metadata for r in rows], pa.binary()),
        "plan": pa.array([r.plan for r in rows], pa.binary()),
        "version": pa.array([1] * len(rows), pa.int32()),
    }, schema=HISTORY_SCHEMA)
    return table.replace_schema_metadata({
        "parquet.avro.schema": json.dumps(AVRO_SCHEMA, separators=(",", ":")),
        "writer.model.name": "avro",
    })


def _rows_of(table: pa.Table) -> list[ArchivedInstant]:
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    n = table.num_rows
    empty: list[None] = [None] * n
    return [ArchivedInstant(cols["instantTime"][i], cols.get("completionTime", empty)[i],
                            cols.get("action", empty)[i] or "", cols.get("metadata", empty)[i],
                            cols.get("plan", empty)[i])
            for i in range(n)]


class LSMHistory:
    """Reads and writes one table's timeline history folder. Writers hold the table lock."""

    def __init__(self, storage: Storage, folder: str, *, compression: str = "gzip") -> None:
        self.storage = storage
        self.folder = folder
        self.compression = compression

    def _rel(self, name: str) -> str:
        return f"{self.folder}/{name}"

    # -- snapshots -------------------------------------------------------------------------

    def manifest_versions(self) -> list[int]:
        """Every manifest version on storage, ascending."""
        found = []
        for status in self.storage.list_dir(self.folder):
            m = _MANIFEST.match(status.name)
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def latest_version(self) -> int:
        """The latest snapshot version: ``_version_``, else the highest manifest; 0 if none."""
        try:
            text = self.storage.read(self._rel(VERSION_FILE)).decode("utf-8").strip()
        except FileNotFoundError:
            versions = self.manifest_versions()
            return versions[-1] if versions else 0
        if not text.isdigit():
            raise CorruptTableError(f"{self._rel(VERSION_FILE)}: {text!r} is not a version")
        return int(text)

    def manifest(self, version: int | None = None) -> list[HistoryFile]:
        """Files of snapshot ``version`` (default: the latest); [] for version 0."""
        version = self.latest_version() if version is None else version
        if version <= 0:
            return []
        rel = self._rel(f"{MANIFEST_PREFIX}{version}")
        try:
            raw = json.loads(self.storage.read(rel))
            files = [HistoryFile(str(e["fileName"]), int(e["fileLen"]))
                     for e in raw.get("files") or ()]
        except FileNotFoundError:
            raise CorruptTableError(f"timeline history snapshot {rel} is missing") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptTableError(f"timeline history manifest {rel}: {exc}") from exc
        return files

    def _publish_manifest(self, files: Sequence[HistoryFile], current: int) -> int:
        new = current + 1
        rel = self._rel(f"{MANIFEST_PREFIX}{new}")
        self.storage.delete(rel)  # left by a run that crashed before updating _version_
        self.storage.write_new(rel, manifest_json(files).encode("utf-8"))
        self.storage.delete(self._rel(VERSION_FILE))
        self.storage.write_new(self._rel(VERSION_FILE), str(new).encode("ascii"))
        return new

    # -- reading ---------------------------------------------------------------------------

    def read_file(self, name: str, columns: Sequence[str] | None = None) -> list[ArchivedInstant]:
        """Rows of one history parquet file."""
        rel = self._rel(name)
        try:
            table = pq.read_table(pa.BufferReader(self.storage.read(rel)),
                                  columns=list(columns) if columns else None)
        except FileNotFoundError:
            raise CorruptTableError(f"timeline history file {rel} is listed in the "
                                    "manifest but missing") from None
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptTableError(f"timeline history file {rel}: {exc}") from exc
        return _rows_of(table)

    def instants(self, columns: Sequence[str] | None = None) -> list[ArchivedInstant]:
        """Every archived action of the latest snapshot, by requested time (a time written
        twice — by a retried run of another writer — appears once)."""
        by_time: dict[str, ArchivedInstant] = {}
        for entry in sorted(self.manifest(), key=lambda f: (f.level, f.name), reverse=True):
            for row in self.read_file(entry.name, columns):
                by_time.setdefault(row.requested_time, row)
        return [by_time[t] for t in sorted(by_time)]

    # -- writing ---------------------------------------------------------------------------

    def _write_parquet(self, name: str, rows: Sequence[ArchivedInstant]) -> HistoryFile:
        buf = io.BytesIO()
        pq.write_table(rows_to_table(rows), buf, compression=self.compression)
        data = buf.getvalue()
        self.storage.write_new(self._rel(name), data)
        return HistoryFile(name, len(data))

    def append(self, rows: Sequence[ArchivedInstant]) -> str:
        """Write ``rows`` as one level-0 file and publish it in a new snapshot; returns the
        file name. Idempotent: a file of that name already in the manifest is kept as is
        (the earlier run succeeded); one not in the manifest was left by a crash and is
        rewritten."""
        if not rows:
            raise ValueError("append: no instants to archive")
        rows = sorted(rows, key=lambda r: r.requested_time)
        name = file_name(rows[0].requested_time, rows[-1].requested_time, 0)
        version = self.latest_version()
        files = self.manifest(version)
        if any(f.name == name for f in files):
            return name
        self.storage.delete(self._rel(name))
        written = self._write_parquet(name, rows)
        self._publish_manifest([*files, written], version)
        return name

    def compact_and_clean(self, batch_size: int) -> int:
        """LSM compaction: while a level holds ≥ ``batch_size`` files, merge its oldest
        consecutive files (at most ``batch_size``, inputs ≤ 1 GB) into one file of the next
        level; then drop old manifests and unreferenced parquet files. Returns the number of
        merges."""
        merges = 0
        level = 0
        while True:
            version = self.latest_version()
            files = self.manifest(version)
            layer = sorted((f for f in files if f.level == level), key=lambda f: f.name)
            if len(layer) < max(batch_size, 2):
                break
            chosen = _candidates(layer, batch_size)
            if len(chosen) < 2:
                break
            out = file_name(min(f.min_time for f in chosen), max(f.max_time for f in chosen),
                            level + 1)
            rows: dict[str, ArchivedInstant] = {}
            for entry in chosen:
                for row in self.read_file(entry.name):
                    rows[row.requested_time] = row
            self.storage.delete(self._rel(out))
            written = self._write_parquet(out, [rows[t] for t in sorted(rows)])
            chosen_names = {f.name for f in chosen}
            kept = [f for f in files if f.name not in chosen_names]
            self._publish_manifest([*kept, written], version)
            merges += 1
            level += 1
        self.clean(merges)
        return merges

    def clean(self, merges: int = 0) -> list[str]:
        """Keep the newest ``3 + merges`` manifests; delete older ones, then parquet files
        no kept manifest lists (also the leftovers of crashed runs). Returns deleted names."""
        versions = self.manifest_versions()
        latest = self.latest_version()
        keep = sorted((v for v in versions if v <= latest), reverse=True)
        keep = keep[:MANIFEST_VERSIONS_RETAINED + merges]
        referenced: set[str] = set()
        for version in keep:
            referenced.update(f.name for f in self.manifest(version))
        deleted = []
        for version in versions:
            if version not in keep:
                name = f"{MANIFEST_PREFIX}{version}"
                self.storage.delete(self._rel(name))
                deleted.append(name)
        for status in self.storage.list_dir(self.folder):
            if _FILE.match(status.name) and status.name not in referenced:
                self.storage.delete(self._rel(status.name))
                deleted.append(status.name)
        return deleted


def _candidates(layer: Sequence[HistoryFile], batch_size: int) -> list[HistoryFile]:
    """Java ``getCandidateFiles``: consecutive oldest files, ≤ batch, ≤ the size cap."""
    chosen: list[HistoryFile] = []
    total = 0
    for entry in layer:
        total += entry.size
        chosen.append(entry)
        if len(chosen) >= batch_size:
            break
        if total > COMPACTION_MAX_BYTES:
            if len(chosen) < 2:
                chosen, total = [], 0
            else:
                break
    return chosen


class ArchivedTimeline:
    """The archived instants of one history snapshot: requested time →
    :class:`ArchivedInstant` without its bytes (times and actions only, so the history of a
    long-lived table stays small in memory); :meth:`metadata` reads one instant's metadata
    bytes on demand."""

    def __init__(self, rows: Iterable[ArchivedInstant],
                 history: LSMHistory | None = None,
                 files: Sequence[HistoryFile] = ()) -> None:
        self.by_time = {r.requested_time: r for r in rows}
        self._history = history
        self._files = tuple(files)
        self._metadata: dict[str, bytes | None] = {}
        self._lock = threading.Lock()

    def __contains__(self, requested_time: object) -> bool:
        return requested_time in self.by_time

    def __iter__(self) -> Iterator[ArchivedInstant]:
        return iter(self.by_time[t] for t in sorted(self.by_time))

    def __len__(self) -> int:
        return len(self.by_time)

    def get(self, requested_time: str) -> ArchivedInstant | None:
        """The archived action at that requested time, if any."""
        return self.by_time.get(requested_time)

    def metadata(self, requested_time: str) -> bytes | None:
        """The completed file's bytes of an archived instant (None if empty or unknown),
        read from the history file whose time range holds it (cached)."""
        with self._lock:
            if requested_time in self._metadata:
                return self._metadata[requested_time]
        found: bytes | None = None
        if self._history is not None and requested_time in self.by_time:
            for entry in sorted(self._files, key=lambda f: (f.level, f.name), reverse=True):
                if not entry.min_time <= requested_time <= entry.max_time:
                    continue
                rows = [r for r in self._history.read_file(entry.name,
                                                           ["instantTime", "metadata"])
                        if r.requested_time == requested_time]
                if rows:
                    found = rows[0].metadata
                    break
        with self._lock:
            self._metadata[requested_time] = found
        return found

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


_cache_lock = threading.Lock()
_cache: dict[tuple[str, str], tuple[int, tuple[str, ...], ArchivedTimeline]] = {}


def load_archived(storage: Storage, folder: str) -> ArchivedTimeline:
    """The archived timeline of the latest snapshot, cached per table while the snapshot
    (version and file list) stays the same."""
    history = LSMHistory(storage, folder)
    version = history.latest_version()
    key = (storage.base_path, folder)
    files = history.manifest(version)
    names = tuple(f.name for f in files)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] == version and hit[1] == names:
            return hit[2]
    rows = history.instants(["instantTime", "completionTime", "action"])
    archived = ArchivedTimeline(rows, history, files)
    with _cache_lock:
        _cache[key] = (version, names, archived)
    return archived
