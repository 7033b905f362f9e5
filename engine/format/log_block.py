"""Hudi log block framing: block types, header keys, and reading blocks out of log files.

A log file is a plain concatenation of blocks, no file header (Java ``HoodieLogFileReader``). Each
block is framed as::

    "#HUDI#" | blockLen: i64 | version=1: i32 | type: i32 | header map | contentLen: i64
    | content | footer map | totalLen: i64 (= blockLen + 6)

with every integer big-endian, and a *map* being ``count: i32`` then per entry
``key ordinal: i32, value length: i32, UTF-8 value``. ``blockLen`` counts the bytes after
itself through ``totalLen``. The footer is always written (usually empty). Header order is
arbitrary in Java (a HashMap); it is kept as read, so a block re-frames byte for byte.

Reading (:func:`iter_blocks`) follows the Java reader's recovery rule: a block whose frame does
not hold (bad magic, ``totalLen - 6 != blockLen``, a length running past the end of the file,
inner lengths that do not add up) is skipped by scanning for the next ``#HUDI#``; a truncated
tail ends the iteration. So a half-written file never raises. A block whose frame holds but
that uses something this module does not know (log format version != 1, an unknown block type
or header key) raises :class:`LogFormatError` instead of being silently dropped.

The contents of each block type are coded by :mod:`engine.format.log_format` (data and command
blocks) and :mod:`engine.format.delete_block`. Pure bytes in, bytes out (except
:func:`read_log_file`); safe on executors; everything returned is picklable.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import CorruptTableError, TerminalError

__all__ = [
    "MAGIC",
    "BlockType",
    "HeaderKey",
    "LogBlock",
    "LogFormatError",
    "frame_block",
    "frame_parts",
    "iter_blocks",
    "read_log_file",
    "schema_json",
]

_log = logging.getLogger(__name__)

MAGIC = b"#HUDI#"
LOG_FORMAT_VERSION = 1
ROLLBACK_COMMAND = "0"

# Big-endian ints as Java's DataOutputStream writes them (shared with the content codecs).
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
I32_PAIR = struct.Struct(">ii")
# version + type + header count + content length + footer count + total length
_MIN_BLOCK_LEN = 4 + 4 + 4 + 8 + 4 + 8


class LogFormatError(CorruptTableError, ValueError):
    """A log block cannot be interpreted: malformed content, or an unknown version/type/key."""


class BlockType(enum.IntEnum):
    """``HoodieLogBlock.HoodieLogBlockType``; the ordinal is what the file stores."""

    COMMAND = 0
    DELETE = 1
    CORRUPT = 2
    AVRO_DATA = 3
    HFILE_DATA = 4
    PARQUET_DATA = 5
    CDC_DATA = 6


class HeaderKey(enum.IntEnum):
    """``HoodieLogBlock.HeaderMetadataType``; the ordinal is what the file stores."""

    INSTANT_TIME = 0
    TARGET_INSTANT_TIME = 1
    SCHEMA = 2
    COMMAND_BLOCK_TYPE = 3
    COMPACTED_BLOCK_TIMES = 4
    RECORD_POSITIONS = 5
    BLOCK_IDENTIFIER = 6
    IS_PARTIAL = 7
    BASE_FILE_INSTANT_TIME_OF_RECORD_POSITIONS = 8


@dataclass(frozen=True)
class LogBlock:
    """One framed block of a log file; ``header``/``footer`` keep their on-disk order."""

    block_type: BlockType
    header: Mapping[HeaderKey, str]
    content: bytes  # raw content bytes (field 7 of the framing)
    footer: Mapping[HeaderKey, str] = field(default_factory=dict)

    @property
    def instant_time(self) -> str:
        """The ``INSTANT_TIME`` header: the (delta)commit that wrote this block."""
        try:
            return self.header[HeaderKey.INSTANT_TIME]
        except KeyError:
            raise LogFormatError(f"{self.block_type.name} block has no INSTANT_TIME") from None

    @property
    def target_instant_time(self) -> str | None:
        """The ``TARGET_INSTANT_TIME`` header (the instant a rollback block undoes), if any."""
        return self.header.get(HeaderKey.TARGET_INSTANT_TIME)

    @property
    def is_rollback(self) -> bool:
        """Whether this is a rollback command block."""
        return (
            self.block_type is BlockType.COMMAND
            and self.header.get(HeaderKey.COMMAND_BLOCK_TYPE) == ROLLBACK_COMMAND
        )

    @functools.cached_property
    def schema(self) -> dict[str, Any] | None:
        """The parsed ``SCHEMA`` header (an Avro record schema), or None without one."""
        text = self.header.get(HeaderKey.SCHEMA)
        return None if text is None else dict(json.loads(text))

    def to_bytes(self) -> bytes:
        """Frame this block again (byte-identical to what it was read from)."""
        return frame_block(self.block_type, self.header, self.content, self.footer)


# --------------------------------------------------------------------------------------------
# Framing
# --------------------------------------------------------------------------------------------


def _encode_map(entries: Mapping[HeaderKey, str] | None) -> bytes:
    items = list((entries or {}).items())
    parts = [I32.pack(len(items))]
    for key, value in items:
        raw = value.encode("utf-8")
        parts.append(I32_PAIR.pack(int(HeaderKey(key)), len(raw)))
        parts.append(raw)
    return b"".join(parts)


def frame_parts(
    block_type: BlockType,
    header: Mapping[HeaderKey, str],
    content: Sequence[Any],
    footer: Mapping[HeaderKey, str] | None,
) -> bytes:
    """Frame one block whose content is the concatenation of ``content`` (bytes-likes)."""
    encoded_header = _encode_map(header)
    encoded_footer = _encode_map(footer)
    content_len = sum(memoryview(part).nbytes for part in content)
    block_len = 4 + 4 + len(encoded_header) + 8 + content_len + len(encoded_footer) + 8
    return b"".join(
        [
            MAGIC,
            I64.pack(block_len),
            I32_PAIR.pack(LOG_FORMAT_VERSION, int(BlockType(block_type))),
            encoded_header,
            I64.pack(content_len),
            *content,
            encoded_footer,
            I64.pack(block_len + len(MAGIC)),
        ]
    )


def schema_json(avro_schema: Mapping[str, Any] | str) -> str:
    """The ``SCHEMA`` header value for an Avro schema: compact JSON, as Java's toString."""
    if isinstance(avro_schema, str):
        return avro_schema
    return json.dumps(avro_schema, separators=(",", ":"), ensure_ascii=False)


def frame_block(
    block_type: BlockType,
    header: Mapping[HeaderKey, str],
    content: bytes,
    footer: Mapping[HeaderKey, str] | None = None,
) -> bytes:
    """Frame one log block (format version 1); header/footer entries keep the mapping's order.

    ``content`` may be any bytes-like object. The footer is written even when empty.
    """
    return frame_parts(block_type, header, [content], footer)


class _Corrupt(TerminalError):
    """Internal: the frame at this offset does not hold."""


def _read_map(data: bytes, pos: int, end: int) -> tuple[dict[HeaderKey, str], int]:
    if pos + 4 > end:
        raise _Corrupt("map count runs past the block")
    (count,) = I32.unpack_from(data, pos)
    pos += 4
    if count < 0 or count * 8 > end - pos:
        raise _Corrupt(f"bad map entry count {count}")
    entries: dict[HeaderKey, str] = {}
    for _ in range(count):
        if pos + 8 > end:
            raise _Corrupt("map entry runs past the block")
        key, length = I32_PAIR.unpack_from(data, pos)
        pos += 8
        if length < 0 or pos + length > end:
            raise _Corrupt(f"bad map value length {length}")
        try:
            header_key = HeaderKey(key)
        except ValueError:
            raise LogFormatError(f"unknown log block header key {key}") from None
        try:
            entries[header_key] = data[pos : pos + length].decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"header {header_key.name} is not UTF-8") from None
        pos += length
    return entries, pos


def _block_type(data: bytes, at: int, start: int) -> BlockType:
    """The type of the block at file offset ``start``, from its version and type fields at
    ``at`` in ``data``; an unknown version or type raises :class:`LogFormatError`."""
    version, type_ordinal = I32_PAIR.unpack_from(data, at)
    if version != LOG_FORMAT_VERSION:
        raise LogFormatError(f"log format version {version} at offset {start} is not supported")
    try:
        return BlockType(type_ordinal)
    except ValueError:
        raise LogFormatError(f"unknown log block type {type_ordinal} at offset {start}") from None


def _read_block(data: bytes, start: int) -> tuple[LogBlock, int]:
    """Parse the block whose magic is at ``start``; raises _Corrupt if its frame does not hold."""
    size = len(data)
    if start + len(MAGIC) + 8 > size:
        raise _Corrupt("truncated block length")
    (block_len,) = I64.unpack_from(data, start + len(MAGIC))
    body = start + len(MAGIC) + 8
    end = body + block_len  # just past the trailing total length
    if block_len < _MIN_BLOCK_LEN or end > size:
        raise _Corrupt(f"block length {block_len} does not fit the file")
    (total_len,) = I64.unpack_from(data, end - 8)
    if total_len != block_len + len(MAGIC):
        raise _Corrupt(f"trailing length {total_len} != block length {block_len} + 6")
    block_type = _block_type(data, body, start)
    limit = end - 8
    header, pos = _read_map(data, body + 8, limit)
    if pos + 8 > limit:
        raise _Corrupt("content length runs past the block")
    (content_len,) = I64.unpack_from(data, pos)
    pos += 8
    if content_len < 0 or pos + content_len > limit:
        raise _Corrupt(f"content length {content_len} runs past the block")
    content = data[pos : pos + content_len]
    footer, pos = _read_map(data, pos + content_len, limit)
    if pos != limit:
        raise _Corrupt("block parts do not add up to the block length")
    return LogBlock(block_type, header, content, footer), end


@dataclass(frozen=True)
class BlockFrame:
    """Where one block's content sits in a log file, found from its frame alone."""

    block_type: BlockType
    header: Mapping[HeaderKey, str]
    content_offset: int
    content_length: int


_FRAME_HEAD = 64 * 1024
"""Bytes read at a block's start to parse its frame: magic, lengths, header (larger headers
are read again whole)."""


def scan_frames(size: int, read_range: Callable[[int, int], bytes]) -> list[BlockFrame] | None:
    """The blocks of a log file of ``size`` bytes, read by ranges: each block's start (its
    frame up to the content) and its trailing length, not its content. None when a frame
    does not hold (a corrupt or truncated block): read the file whole with
    :func:`iter_blocks` then, which skips such blocks."""
    frames: list[BlockFrame] = []
    pos = 0
    while pos < size:
        first = read_range(pos, min(_FRAME_HEAD, size - pos))
        if not first.startswith(MAGIC) or len(first) < len(MAGIC) + 8:
            return None
        (block_len,) = I64.unpack_from(first, len(MAGIC))
        end = pos + len(MAGIC) + 8 + block_len
        if block_len < _MIN_BLOCK_LEN or end > size:
            return None
        try:
            frame = _parse_frame(first, pos, end)
        except _Corrupt:
            if len(first) >= end - pos:
                return None
            try:  # a header longer than the first read
                frame = _parse_frame(read_range(pos, end - pos), pos, end)
            except _Corrupt:
                return None
        (total_len,) = I64.unpack(read_range(end - 8, 8))
        if total_len != block_len + len(MAGIC):
            return None
        frames.append(frame)
        pos = end
    return frames


def _parse_frame(data: bytes, start: int, end: int) -> BlockFrame:
    """The frame of the block at file offset ``start`` (ending at ``end``) from ``data``,
    the file's bytes from ``start`` on (at least up to the content)."""
    body = len(MAGIC) + 8
    if body + 8 > len(data):
        raise _Corrupt("frame runs past the bytes read")
    block_type = _block_type(data, body, start)
    limit = min(len(data), end - start - 8)
    header, pos = _read_map(data, body + 8, limit)
    if pos + 8 > limit:
        raise _Corrupt("content length runs past the bytes read")
    (content_len,) = I64.unpack_from(data, pos)
    pos += 8
    if content_len < 0 or start + pos + content_len > end - 8:
        raise _Corrupt(f"content length {content_len} runs past the block")
    return BlockFrame(block_type, header, start + pos, content_len)


def iter_blocks(data: bytes | bytearray | memoryview) -> Iterator[LogBlock]:
    """Yield the blocks of a whole log file, skipping corrupt ones.

    A corrupt or truncated block (bad magic, trailing length mismatch, lengths running past
    the end) is logged and skipped by scanning for the next ``#HUDI#``; if there is none the
    iteration ends. Never raises on a half-written file; raises LogFormatError for a well
    framed block of an unknown version, type or header key.
    """
    buf = data if isinstance(data, bytes) else bytes(data)
    pos = 0
    while pos < len(buf):
        if buf.startswith(MAGIC, pos):
            try:
                block, pos = _read_block(buf, pos)
            except _Corrupt as exc:
                _log.warning("skipping corrupt log block at offset %d: %s", pos, exc)
                pos = buf.find(MAGIC, pos + len(MAGIC))
            else:
                yield block
                continue
        else:
            _log.warning("no log block magic at offset %d; scanning for the next block", pos)
            pos = buf.find(MAGIC, pos + 1)
        if pos < 0:
            return


def read_log_file(path: str | os.PathLike[str]) -> list[LogBlock]:
    """Read all readable blocks of a local log file (see :func:`iter_blocks`); the engine
    reads log files through its storage (``iter_blocks(storage.read(rel))``)."""
    from engine.storage import LocalStorage

    folder, name = os.path.split(os.path.abspath(path))
    return list(iter_blocks(LocalStorage(folder).read(name)))
