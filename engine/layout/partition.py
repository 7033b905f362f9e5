"""Partition paths: Hudi's encoding of partition values, and folders that stay in the table.

A partition value becomes one path segment, as Hudi's key generators build it
(``KeyGenUtils.getRecordPartitionPath``): null and the empty string become Hive's
``__HIVE_DEFAULT_PARTITION__``; hive-style tables prefix ``<field>=`` (the field name as is);
segments are joined with ``/``. What happens to the value itself depends on the table's
``hoodie.datasource.write.partitionpath.urlencode`` (recorded in ``hoodie.properties``):

* ``true`` (what tidelake records for new tables): the value is escaped exactly as Java's
  ``PartitionPathEncodeUtils.escapePathName`` does (``%XX``, upper-case hex, for the control
  characters and ``"#%'*/:=?\\{[]^`` and DEL), **plus** a leading ``.`` becomes ``%2E`` — a
  documented deviation: Java leaves it, which lets a value such as ``.hoodie`` write into the
  metadata folder. Java's ``unescapePathName`` decodes ``%2E`` back to ``.``, so the value
  read back is the same.
* ``false`` (tables that recorded it, e.g. written by Java): the value is written as is, as
  Java does. A value that would make an unsafe folder is refused with
  :class:`~engine.errors.InvalidRecordError` naming it: a segment that starts with ``.``
  (``.``, ``..``, ``.hoodie``), a ``/`` (Java would nest folders that no partition parser maps
  back to the value; a leading/trailing/double ``/`` would even leave empty segments), a
  backslash, or a NUL character.

Either way a segment longer than a file name may be is refused, so a streaming caller can
route the record to its error table instead of writing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from engine.errors import InvalidRecordError
from engine.layout.properties import dumps
from engine.storage import Storage

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
PARTITION_METAFILE = ".hoodie_partition_metadata"
MAX_SEGMENT_BYTES = 255

# Java's PartitionPathEncodeUtils.charToEscape: 0x00-0x1F, DEL and these.
_ESCAPE = set('"#%\'*/:=?\\{[]^') | {chr(c) for c in range(0x20)} | {"\x7f"}
# Characters a raw (urlencode=false) value may not hold: folder splits and what no file
# system stores.
_RAW_REFUSED = {"/": "a '/'", "\\": "a backslash", "\x00": "a NUL character"}


def escape_path_name(value: str) -> str:
    """Java's ``PartitionPathEncodeUtils.escapePathName`` (non-empty values), plus ``.``.

    Every character of Java's escape set becomes ``%XX``; a leading ``.`` becomes ``%2E``
    (our addition, so no segment starts with a dot).
    """
    encoded = "".join(f"%{ord(ch):02X}" if ch in _ESCAPE else ch for ch in value)
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    return encoded


def encode_partition_value(value: str | None, *, url_encode: bool = True) -> str:
    """One path segment for a partition value under the table's ``urlencode`` setting.

    Raises :class:`InvalidRecordError` naming the value when ``url_encode`` is false and the
    raw value would make an unsafe folder (see the module docstring).
    """
    if value is None or value == "":
        return DEFAULT_PARTITION
    if url_encode:
        return escape_path_name(value)
    for ch, what in _RAW_REFUSED.items():
        if ch in value:
            raise InvalidRecordError(
                f"partition value {value!r} holds {what}; the table records "
                "hoodie.datasource.write.partitionpath.urlencode=false, so it would be "
                "written as is and cannot make one safe folder")
    if value.startswith("."):
        raise InvalidRecordError(
            f"partition value {value!r} starts with '.'; the table records "
            "hoodie.datasource.write.partitionpath.urlencode=false, so it would be written "
            "as is into a hidden or parent folder")
    return value


def decode_partition_value(segment: str) -> str:
    """Inverse of :func:`escape_path_name`: Java's ``unescapePathName`` (``%XX`` → char)."""
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


def is_safe_partition_path(path: str) -> bool:
    """Whether a partition path read back (from the metadata table, a commit) names a
    folder inside the table that no writer keeps its own files in: ``""`` (no partition) or
    non-empty segments, none starting with ``.`` (``..``, ``.hoodie``), without backslash or
    NUL — what :func:`partition_path` lets a writer make."""
    if path == "":
        return True
    return all(seg and not seg.startswith(".") and "\\" not in seg and "\x00" not in seg
               for seg in path.split("/"))


def partition_path(fields: Sequence[str], values: Sequence[str | None],
                   *, hive_style: bool, url_encode: bool = True) -> str:
    """The partition path of one record, e.g. ``city=chennai`` or ``2024/01``.

    Raises :class:`InvalidRecordError` for a value that cannot be stored (see the module
    docstring) — the message names the field and the value.
    """
    segments = []
    for name, value in zip(fields, values, strict=True):
        seg = encode_partition_value(value, url_encode=url_encode)
        if hive_style:
            seg = f"{name}={seg}"
        if seg.startswith(".") or "/" in seg or "\x00" in seg:
            raise InvalidRecordError(
                f"partition field {name!r} makes the unsafe folder name {seg!r}")
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
