"""Hudi data file names: base files, log files, file ids and write tokens (``FSUtils``)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

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
    """Parse a log file name (write token required, as hudi-rs requires); None otherwise."""
    m = _LOG.match(name)
    if not m or m.group(5):
        return None
    return LogFileName(m.group(1), m.group(2), int(m.group(3)), m.group(4))


def new_file_id() -> str:
    """A new file group id: ``<uuid4>-0`` (``FSUtils.createNewFileId``)."""
    return f"{uuid.uuid4()}-0"


def write_token(task_partition: int = 0, stage: int = 0, attempt: int = 0) -> str:
    """``<taskPartitionId>-<stageId>-<taskAttemptId>``, all non-negative decimals."""
    for value in (task_partition, stage, attempt):
        if value < 0:
            raise ValueError(f"write token parts must be non-negative, got {value}")
    return f"{task_partition}-{stage}-{attempt}"
