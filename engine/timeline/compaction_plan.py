"""The compaction plan on disk: ``HoodieCompactionPlan`` (``T.compaction.requested``).

The record is Hudi's (``engine/format/avro/HoodieCompactionPlan.avsc``, the schema embedded in
the Spark-written v8 sample); plans are written as version 2 (base and log file *names*) and
version 1 plans (full paths) are read too (Java ``CompactionPlanMigrator``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fastavro

from engine.errors import CorruptTableError
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import avro_schema, write_avro_ocf
from engine.timeline.instant import Action

PLAN_SCHEMA = "HoodieCompactionPlan"
PLAN_VERSION = 2
"""Version 2 plans hold file names (version 1 held full paths)."""


@dataclass(frozen=True)
class CompactionOperation:
    """One file group's share of a plan (``HoodieCompactionOperation``)."""

    partition_path: str
    file_id: str
    base_instant: str
    base_file: str | None  # name
    log_files: tuple[str, ...]  # names, in merge order
    metrics: Mapping[str, float] = field(default_factory=dict)

    def to_avro(self) -> dict[str, Any]:
        """Record for the ``HoodieCompactionOperation`` schema."""
        return {"baseInstantTime": self.base_instant, "deltaFilePaths": list(self.log_files),
                "dataFilePath": self.base_file, "fileId": self.file_id,
                "partitionPath": self.partition_path, "metrics": dict(self.metrics),
                "bootstrapFilePath": None}

    @classmethod
    def from_avro(cls, rec: Mapping[str, Any], version: int) -> CompactionOperation:
        """Parse an operation; version 1 paths are reduced to names."""
        def name(path: str) -> str:
            return path.rsplit("/", 1)[-1] if version < 2 else path

        base = rec.get("dataFilePath")
        return cls(partition_path=str(rec.get("partitionPath") or ""),
                   file_id=str(rec.get("fileId") or ""),
                   base_instant=str(rec.get("baseInstantTime") or ""),
                   base_file=name(base) if base else None,
                   log_files=tuple(name(p) for p in rec.get("deltaFilePaths") or ()),
                   metrics=dict(rec.get("metrics") or {}))


@dataclass(frozen=True)
class CompactionPlan:
    """``HoodieCompactionPlan``: what ``C.compaction.requested`` holds."""

    operations: tuple[CompactionOperation, ...]
    extra_metadata: Mapping[str, str] = field(default_factory=dict)
    version: int = PLAN_VERSION

    def to_avro_bytes(self) -> bytes:
        """The plan as an Avro OCF (strategy null, ``preserveHoodieMetadata`` false, as the
        Spark-written sample)."""
        return write_avro_ocf(PLAN_SCHEMA, {
            "operations": [op.to_avro() for op in self.operations],
            "extraMetadata": dict(self.extra_metadata), "version": self.version,
            "strategy": None, "preserveHoodieMetadata": False,
            "missingSchedulePartitions": []})

    @classmethod
    def from_bytes(cls, data: bytes) -> CompactionPlan:
        """Parse a plan, read with Hudi's schema (Avro schema resolution, as Java reads it)."""
        records = list(fastavro.reader(io.BytesIO(data), reader_schema=avro_schema(PLAN_SCHEMA)))
        if not records or not isinstance(records[0], dict):
            raise ValueError("no HoodieCompactionPlan record")
        raw = records[0]
        version = int(raw.get("version") or 1)
        ops = tuple(CompactionOperation.from_avro(op, version)
                    for op in raw.get("operations") or ())
        return cls(ops, dict(raw.get("extraMetadata") or {}), version)


def read_plan(timeline: Timeline, instant_time: str) -> CompactionPlan:
    """The plan of a compaction instant; :class:`CorruptTableError` naming the file if it
    is missing or cannot be parsed."""
    rel = f"{timeline.folder}/{instant_time}.{Action.COMPACTION.value}.requested"
    try:
        return CompactionPlan.from_bytes(timeline.storage.read(rel))
    except FileNotFoundError:
        raise CorruptTableError(f"compaction {instant_time} has no plan {rel}") from None
    except (ValueError, OSError, EOFError, TypeError) as exc:
        raise CorruptTableError(f"compaction plan {rel} cannot be read: {exc}") from exc
