"""Hudi data file names: base files, log files, file ids and write tokens (``FSUtils``)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.storage import TEMP_PREFIX

if TYPE_CHECKING:
    from engine.timeline.version import TableVersion

_BASE = re.compile(r"^([a-zA-Z0-9-]+)_([a-zA-Z0-9-]+)_(\d+)\.(parquet|orc|hfile|lance)$")
_LOG = re.compile(r"^\.(.+)_(\d+)\.log\.(\d+)_(\d+-\d+-\d+)(\.cdc)?$")


@dataclass(frozen=True)
class BaseFileName:
    """Parsed ``<fileId>_<writeToken>_<instant>.parquet``."""

    file_id: str
    write_token: str
    instant_time: str
    extension: str = "parquet"

    @property
    def name(self) -> str:
        """The file name."""
        return f"{self.file_id}_{self.write_token}_{self.instant_time}.{self.extension}"


@dataclass(frozen=True)
class LogFileName:
    """Parsed ``.<fileId>_<instant>.log.<version>_<writeToken>``."""

    file_id: str
    instant_time: str
    version: int
    write_token: str

    @property
    def name(self) -> str:
        """The file name."""
        return f".{self.file_id}_{self.instant_time}.log.{self.version}_{self.write_token}"


def parse_base_file(name: str) -> BaseFileName | None:
    """Parse a base file name; None if ``name`` is not one."""
    m = _BASE.match(name)
    if not m:
        return None
    return BaseFileName(m.group(1), m.group(2), m.group(3), m.group(4))


def parse_log_file(name: str) -> LogFileName | None:
    """Parse a log file name (write token required, as hudi-rs requires); None otherwise.

    A local write's temporary of a log file (``.tmp.<hex>.<final name>``, see
    :data:`engine.storage.TEMP_PREFIX`) is none: its name would otherwise match with a file
    id ``tmp.<hex>.<id>``, and a storage listing would take a killed writer's leftover for a
    file group of its own."""
    m = _LOG.match(name)
    if not m or m.group(5) or name.startswith(TEMP_PREFIX):
        return None
    return LogFileName(m.group(1), m.group(2), int(m.group(3)), m.group(4))


def new_log_file(version: TableVersion, file_id: str, instant_time: str,
                 base_instant: str | None, slice_logs: Iterable[str],
                 write_token: str) -> LogFileName:
    """The log file a write at ``instant_time`` adds to the file slice whose base instant is
    ``base_instant`` (None: a new file group) and whose log files are ``slice_logs``.

    From version 8 on it is named by the writing instant, version 1 (one file per
    deltacommit). Before, it carries the slice's base instant (the writing instant for a
    new group) and the next log version of the slice: a new file per write as Hudi writes
    on object stores (rolling over instead of appending), so the files that readers group
    by base instant and order by version hold the writes in their order."""
    if not version.logs_named_by_slice:
        return LogFileName(file_id, instant_time, 1, write_token)
    base = base_instant or instant_time
    versions = [parsed.version for parsed in map(parse_log_file, slice_logs)
                if parsed is not None and parsed.instant_time == base]
    return LogFileName(file_id, base, max(versions, default=0) + 1, write_token)


def new_file_id() -> str:
    """A new file group id: ``<uuid4>-0`` (``FSUtils.createNewFileId``)."""
    return f"{uuid.uuid4()}-0"


def write_token(task_partition: int = 0, stage: int = 0, attempt: int = 0) -> str:
    """``<taskPartitionId>-<stageId>-<taskAttemptId>``, all non-negative decimals."""
    for value in (task_partition, stage, attempt):
        if value < 0:
            raise ValueError(f"write token parts must be non-negative, got {value}")
    return f"{task_partition}-{stage}-{attempt}"
