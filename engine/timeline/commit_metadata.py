"""Commit metadata (``HoodieCommitMetadata``, ``HoodieWriteStat``) and rollback metadata.

On disk: v8 completed commits are Avro OCF files of ``org.apache.hudi.avro.model``
records; v6 commits are JSON. The Python models are frozen dataclasses with snake_case
names; :meth:`to_avro` / :meth:`from_avro` map them to the on-disk camelCase names.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import fastavro

from engine.errors import CorruptTableError
from engine.format.jackson import pretty_json

if TYPE_CHECKING:
    from engine.timeline.version import TableVersion


@cache
def avro_schema(name: str) -> Any:
    """Parsed Avro schema ``engine/format/avro/<name>.avsc``."""
    text = resources.files("engine.format").joinpath("avro").joinpath(f"{name}.avsc").read_text()
    return fastavro.parse_schema(json.loads(text))


def write_avro_ocf(schema_name: str, record: Mapping[str, Any]) -> bytes:
    """One record as an Avro object container file (codec null), as Hudi writes plans."""
    buf = io.BytesIO()
    fastavro.writer(buf, avro_schema(schema_name), [record], codec="null")
    return buf.getvalue()


def read_avro_ocf(data: bytes) -> dict[str, Any]:
    """The first record of an Avro object container file."""
    for record in fastavro.reader(io.BytesIO(data)):
        if isinstance(record, dict):
            return record
    return {}


_CAMEL = {
    "file_id": "fileId", "path": "path", "prev_commit": "prevCommit",
    "num_writes": "numWrites", "num_deletes": "numDeletes",
    "num_update_writes": "numUpdateWrites", "total_write_bytes": "totalWriteBytes",
    "total_write_errors": "totalWriteErrors", "partition_path": "partitionPath",
    "total_log_records": "totalLogRecords", "num_inserts": "numInserts",
    "total_log_blocks": "totalLogBlocks", "file_size_in_bytes": "fileSizeInBytes",
    "log_version": "logVersion", "log_offset": "logOffset", "base_file": "baseFile",
    "log_files": "logFiles", "prev_base_file": "prevBaseFile",
    "total_log_files_compacted": "totalLogFilesCompacted",
    "total_log_size_compacted": "totalLogSizeCompacted",
    "total_updated_records_compacted": "totalUpdatedRecordsCompacted",
}


@dataclass(frozen=True)
class WriteStat:
    """What one write handle wrote into one file of one file group (picklable)."""

    file_id: str
    path: str
    partition_path: str
    prev_commit: str = "null"
    num_writes: int = 0
    num_deletes: int = 0
    num_update_writes: int = 0
    num_inserts: int = 0
    total_write_bytes: int = 0
    file_size_in_bytes: int = 0
    total_write_errors: int = 0
    total_log_records: int = 0
    total_log_blocks: int = 0
    log_version: int | None = None
    log_offset: int | None = None
    base_file: str | None = None
    log_files: tuple[str, ...] | None = None
    prev_base_file: str | None = None
    total_log_files_compacted: int = 0
    total_log_size_compacted: int = 0
    total_updated_records_compacted: int = 0
    metadata: Any = field(default=None, compare=False, repr=False,
                          metadata={"in_memory": True})
    """What this file adds to the metadata table's index partitions (column stats of the
    file, record-index entries of the keys it inserted or deleted), made where the file is
    written and handed to the commit; never stored in commit metadata. An
    :class:`engine.metadata.update.MetadataUpdate` or None, untyped here (the timeline sits
    below the metadata table): :func:`engine.metadata.update.carried` reads it typed."""

    def to_avro(self) -> dict[str, Any]:
        """Record for the ``HoodieWriteStat`` Avro schema."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.metadata.get("in_memory"):
                continue
            value = getattr(self, f.name)
            out[_CAMEL[f.name]] = list(value) if isinstance(value, tuple) else value
        out.update({"totalCorruptLogBlock": 0, "totalRollbackBlocks": 0,
                    "totalLogReadTimeMs": 0})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WriteStat:
        """Parse a stat from Avro or JSON metadata (unknown keys ignored)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.metadata.get("in_memory"):
                continue
            value = data.get(_CAMEL[f.name])
            if value is None:
                continue
            kwargs[f.name] = tuple(value) if f.name == "log_files" else value
        kwargs.setdefault("file_id", data.get("fileId") or "")
        kwargs.setdefault("path", data.get("path") or "")
        kwargs.setdefault("partition_path", data.get("partitionPath") or "")
        return cls(**kwargs)


def _json_stat(stat: WriteStat) -> dict[str, Any]:
    """A write stat as v6 JSON holds it: the Avro record's fields, without the v8-only
    ones a v6 stat leaves out when empty (``prevBaseFile``); MOR fields only on appends."""
    out = stat.to_avro()
    if out.get("prevBaseFile") is None:
        out.pop("prevBaseFile", None)
    if stat.log_files is None:
        for key in ("logVersion", "logOffset", "baseFile", "logFiles"):
            out.pop(key, None)
    return out


@dataclass(frozen=True)
class CommitMetadata:
    """A completed commit/deltacommit/replacecommit's metadata."""

    write_stats: tuple[WriteStat, ...] = ()
    operation_type: str = "UPSERT"
    extra_metadata: Mapping[str, str] = field(default_factory=dict)
    compacted: bool = False
    partition_to_replace_file_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def schema(self) -> str | None:
        """The table's Avro schema JSON recorded with this commit (``extraMetadata.schema``)."""
        return self.extra_metadata.get("schema")

    def partition_to_write_stats(self) -> dict[str, list[WriteStat]]:
        """Stats grouped by partition path."""
        grouped: dict[str, list[WriteStat]] = {}
        for stat in self.write_stats:
            grouped.setdefault(stat.partition_path, []).append(stat)
        return grouped

    def encode(self, version: TableVersion) -> bytes:
        """The on-disk form for a table of ``version``: JSON before version 8, else Avro."""
        return self.to_json_bytes() if version.json_commit_metadata else self.to_avro_bytes()

    def to_json_bytes(self) -> bytes:
        """v6 on-disk form: ``HoodieCommitMetadata`` (``HoodieReplaceCommitMetadata`` with
        replaced file ids) as Jackson's default pretty printer writes it
        (:func:`engine.format.jackson.pretty_json`), keys in Java's field order."""
        record: dict[str, Any] = {
            "partitionToWriteStats": {
                p: [_json_stat(s) for s in stats]
                for p, stats in self.partition_to_write_stats().items()
            },
            "compacted": self.compacted,
            "extraMetadata": dict(self.extra_metadata),
            "operationType": self.operation_type,
        }
        if self.partition_to_replace_file_ids:
            record["partitionToReplaceFileIds"] = {
                p: list(ids) for p, ids in self.partition_to_replace_file_ids.items()}
        return pretty_json(record).encode("utf-8")

    def to_avro_bytes(self) -> bytes:
        """v8 on-disk form: ``HoodieCommitMetadata`` Avro OCF."""
        record = {
            "partitionToWriteStats": {
                p: [s.to_avro() for s in stats]
                for p, stats in self.partition_to_write_stats().items()
            },
            "compacted": self.compacted,
            "extraMetadata": dict(self.extra_metadata),
            "version": 1,
            "operationType": self.operation_type,
        }
        if self.partition_to_replace_file_ids:
            record["partitionToReplaceFileIds"] = {
                p: list(ids) for p, ids in self.partition_to_replace_file_ids.items()}
            return write_avro_ocf("HoodieReplaceCommitMetadata", record)
        return write_avro_ocf("HoodieCommitMetadata", record)

    @classmethod
    def from_bytes(cls, data: bytes) -> CommitMetadata:
        """Parse completed commit metadata: Avro OCF (v8) or JSON (v6); empty → empty."""
        if not data.strip():
            return cls()
        try:
            if data[:4] == b"Obj\x01":
                raw = read_avro_ocf(data)
            else:
                raw = json.loads(data.decode("utf-8"))
        except Exception as exc:
            raise CorruptTableError(f"cannot parse commit metadata: {exc}") from exc
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CommitMetadata:
        """Build from the decoded Avro record or JSON object."""
        stats: list[WriteStat] = []
        for partition, items in (raw.get("partitionToWriteStats") or {}).items():
            for item in items or ():
                stat = WriteStat.from_dict(item)
                if not stat.partition_path and partition:
                    stat = WriteStat(**{**stat.__dict__, "partition_path": partition})
                stats.append(stat)
        replaced = {p: tuple(ids or ()) for p, ids in
                    (raw.get("partitionToReplaceFileIds") or {}).items()}
        return cls(
            write_stats=tuple(stats),
            operation_type=str(raw.get("operationType") or "UNKNOWN"),
            extra_metadata=dict(raw.get("extraMetadata") or {}),
            compacted=bool(raw.get("compacted") or False),
            partition_to_replace_file_ids=replaced,
        )


@dataclass(frozen=True)
class WriteTotals:
    """A commit's write stats summed as Hudi's ``HoodieCommitMetadata.fetchTotal*`` sum them
    (the numbers Hudi's ``HoodieMetrics.updateCommitMetrics`` publishes per commit), plus the
    most log files a written file slice holds after the commit."""

    partitions_written: int = 0
    files_insert: int = 0
    """Files with no previous commit (``prevCommit`` is ``null``): new file groups."""
    files_update: int = 0
    records_written: int = 0
    update_records_written: int = 0
    insert_records_written: int = 0
    records_deleted: int = 0
    bytes_written: int = 0
    log_files_compacted: int = 0
    log_files_size: int = 0
    """Bytes of the log files a compaction read (Hudi's ``totalLogSizeCompacted``)."""
    compacted_records_updated: int = 0
    max_slice_log_files: int = 0
    """The most log files in one file slice this commit wrote to (``logFiles`` of its log
    files' stats: the slice's earlier log files and the new one); 0 for base files only."""

    @classmethod
    def of(cls, stats: Sequence[WriteStat]) -> WriteTotals:
        """The totals of ``stats`` (one commit's)."""
        new = [s for s in stats if s.prev_commit.lower() == "null"]
        return cls(
            partitions_written=len({s.partition_path for s in stats}),
            files_insert=len(new), files_update=len(stats) - len(new),
            records_written=sum(s.num_writes for s in stats),
            update_records_written=sum(s.num_update_writes for s in stats),
            insert_records_written=sum(s.num_inserts for s in stats),
            records_deleted=sum(s.num_deletes for s in stats),
            bytes_written=sum(s.total_write_bytes for s in stats),
            log_files_compacted=sum(s.total_log_files_compacted for s in stats),
            log_files_size=sum(s.total_log_size_compacted for s in stats),
            compacted_records_updated=sum(s.total_updated_records_compacted for s in stats),
            max_slice_log_files=max((len(s.log_files or ()) for s in stats), default=0))


@dataclass(frozen=True)
class RollbackMetadata:
    """What a rollback removed (``HoodieRollbackMetadata``)."""

    start_rollback_time: str
    rolled_back: tuple[tuple[str, str], ...]  # (instant time, action)
    deleted_files: Mapping[str, Sequence[str]]  # partition → relative paths deleted
    time_taken_ms: int = 0

    def to_avro_bytes(self) -> bytes:
        """On-disk form: ``HoodieRollbackMetadata`` Avro OCF."""
        record = {
            "startRollbackTime": self.start_rollback_time,
            "timeTakenInMillis": self.time_taken_ms,
            "totalFilesDeleted": sum(len(v) for v in self.deleted_files.values()),
            "commitsRollback": [t for t, _ in self.rolled_back],
            "partitionMetadata": {
                p: {"partitionPath": p, "successDeleteFiles": list(files),
                    "failedDeleteFiles": [], "rollbackLogFiles": {},
                    "logFilesFromFailedCommit": {}}
                for p, files in self.deleted_files.items()
            },
            "version": 1,
            "instantsRollback": [{"commitTime": t, "action": a} for t, a in self.rolled_back],
        }
        return write_avro_ocf("HoodieRollbackMetadata", record)

    def plan_avro_bytes(self) -> bytes:
        """The ``HoodieRollbackPlan`` written as the requested rollback instant."""
        (instant, action) = self.rolled_back[0]
        record = {
            "instantToRollback": {"commitTime": instant, "action": action},
            "RollbackRequests": [
                {"partitionPath": p, "fileId": "", "latestBaseInstant": "",
                 "filesToBeDeleted": list(files), "logBlocksToBeDeleted": {}}
                for p, files in self.deleted_files.items()
            ],
            "version": 1,
        }
        return write_avro_ocf("HoodieRollbackPlan", record)
