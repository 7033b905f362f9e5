"""Partition paths: encoding values so no value can leave the table folder.

A partition value becomes one path segment. Characters that a file system or Hudi's own
path parsing would interpret are escaped as ``%XX`` (Hudi's ``PartitionPathEncodeUtils``
set, plus every control character); a value made only of dots (``.``, ``..``) has its dots
escaped; null and the empty string become Hive's ``__HIVE_DEFAULT_PARTITION__``. A segment
longer than a file name may be is refused with :class:`~engine.errors.InvalidRecordError`,
so the caller can route the record to its error table instead of writing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from engine.errors import InvalidRecordError
from engine.properties import dumps
from engine.storage import Storage

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
PARTITION_METAFILE = ".hoodie_partition_metadata"
MAX_SEGMENT_BYTES = 255

_ESCAPE = set('"#%\'*/:=?\\{[]^') | {chr(c) for c in range(0x20)} | {"\x7f"}


def encode_partition_value(value: str | None) -> str:
    """One path segment for a partition value (escaped; never ``.``, ``..`` or empty)."""
    if value is None or value == "":
        return DEFAULT_PARTITION
    if set(value) == {"."}:
        return "%2E" * len(value)
    encoded = "".join(f"%{ord(ch):02X}" if ch in _ESCAPE else ch for ch in value)
    return encoded


def decode_partition_value(segment: str) -> str:
    """Inverse of :func:`encode_partition_value` (``%XX`` unescaping)."""
    out: list[str] = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "%" and _is_hex(segment[i + 1:i + 3]):
            out.append(chr(int(segment[i + 1:i + 3], 16)))
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


def partition_path(fields: Sequence[str], values: Sequence[str | None],
                   *, hive_style: bool) -> str:
    """The partition path of one record, e.g. ``city=chennai`` or ``2024/01``."""
    segments = []
    for name, value in zip(fields, values, strict=True):
        seg = encode_partition_value(value)
        if hive_style:
            seg = f"{encode_partition_value(name)}={seg}"
        if len(seg.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise InvalidRecordError(
                f"partition value for '{name}' is too long for a folder name "
                f"({len(seg.encode('utf-8'))} bytes encoded, at most {MAX_SEGMENT_BYTES})")
        segments.append(seg)
    return "/".join(segments)


def write_partition_metadata(storage: Storage, partition: str, instant_time: str) -> None:
    """Create ``.hoodie_partition_metadata`` in a partition folder if it is missing."""
    rel = f"{partition}/{PARTITION_METAFILE}" if partition else PARTITION_METAFILE
    if storage.exists(rel):
        return
    depth = 0 if not partition else partition.count("/") + 1
    text = dumps({"commitTime": instant_time, "partitionDepth": str(depth)},
                 comment="partition metadata")
    with contextlib.suppress(FileExistsError):  # another task made it first: same content
        storage.write_new(rel, text.encode("latin-1"))
