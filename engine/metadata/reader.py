"""Reading the metadata table: its file groups and slices, which MDT instants a reader
trusts, merging a group's records, and looking keys up.

Which MDT instants a reader trusts (Java ``getValidInstantTimestamps``): MDT-only instants
(initialization ``00000000000000…``, MDT compactions) and deltacommits whose data instant is
completed on the data timeline the reader loaded, or archived from it. A deltacommit written
for a data instant that has not completed (its writer died between the two commits, or it
completed after the reader loaded its timeline) is ignored, so a view sees exactly its own
snapshot.

:class:`GroupSlice` is the picklable description of one file group's latest slice: the driver
computes them, executor tasks read them (:func:`read_slice`, :func:`lookup_slice`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from engine.format.delete_block import decode_delete_block
from engine.format.hfile import HFileReader
from engine.format.hfile_cells import KeyIndex
from engine.format.log_block import BlockFrame, BlockType, LogBlock, iter_blocks, scan_frames
from engine.layout.file_group import FileSlice, TableFiles, build_file_slices, list_table_files
from engine.metadata.codec import (
    CellDecoder,
    block_schema,
    hfile_schema,
    read_base_file,
    read_log_file,
)
from engine.metadata.keys import file_group_indexes
from engine.metadata.records import MetadataRecord, merge_records
from engine.metadata.table import BOOTSTRAP_PREFIX, MetadataTable, completed_mdt_instants
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key
from engine.timeline.instant import Action, Instant

Validity = Callable[[Instant], bool]


def validity(data_timeline: Timeline) -> Validity:
    """Whether an MDT instant is trusted against ``data_timeline`` (module docstring)."""
    completed = {i.requested_time for i in data_timeline.instants if i.is_completed}
    active = data_timeline.active_times
    boundary = data_timeline.archived_boundary

    def valid(instant: Instant) -> bool:
        t = instant.requested_time
        if t.startswith(BOOTSTRAP_PREFIX) or instant.action is not Action.DELTA_COMMIT:
            return True
        if t in completed:
            return True
        return t not in active and boundary is not None and t < boundary

    return valid


def trust_all(_instant: Instant) -> bool:
    """Validity that trusts every completed MDT instant (the MDT's own services)."""
    return True


@dataclass(frozen=True)
class GroupSlice:
    """The latest slice of one MDT file group: paths relative to the MDT's base path, logs
    in merge order. Picklable."""

    partition: str
    file_id: str
    base_path: str | None
    log_paths: tuple[str, ...]

    @property
    def is_empty(self) -> bool:
        """True for a group holding nothing but its initial empty log (or nothing)."""
        return self.base_path is None and not self.log_paths


def file_slices(mdt: MetadataTable, mdt_timeline: Timeline, valid: Validity,
                partitions: Iterable[str], *, latest_only: bool = True) -> list[FileSlice]:
    """Slices of the file groups of ``partitions`` over the trusted MDT instants, by
    (partition, file id), oldest first within a group."""
    wanted = set(partitions)
    visible: Mapping[str, str] = {
        i.requested_time: completion_key(i)
        for i in completed_mdt_instants(mdt_timeline) if valid(i)}
    listed = list_table_files(mdt.storage, wanted)
    files = TableFiles(tuple(f for f in listed.base_files if f.partition_path in wanted),
                       tuple(f for f in listed.log_files if f.partition_path in wanted),
                       tuple(p for p in listed.partitions if p in wanted))
    return build_file_slices(files, mdt_timeline, visible, latest_only=latest_only)


def group_ids(mdt: MetadataTable, partition: str) -> list[str]:
    """The file ids of an MDT partition, sorted (their count is the key → group modulus;
    every group exists from initialization on, at least as its initial log)."""
    from engine.format.naming import parse_base_file, parse_log_file

    ids: set[str] = set()
    for status in mdt.storage.list_dir(partition):
        parsed = parse_base_file(status.name) or parse_log_file(status.name)
        if parsed is not None:
            ids.add(parsed.file_id)
    return sorted(ids)


def latest_group_slices(mdt: MetadataTable, mdt_timeline: Timeline, valid: Validity,
                        partition: str) -> list[GroupSlice]:
    """The latest slice of every file group of ``partition``, in file id order."""
    out = []
    for piece in file_slices(mdt, mdt_timeline, valid, [partition]):
        out.append(GroupSlice(partition, piece.file_id,
                              piece.base_file.path if piece.base_file else None,
                              tuple(log.path for log in piece.log_files)))
    return sorted(out, key=lambda g: g.file_id)


def _merge(merged: dict[str, MetadataRecord], key: str, newer: MetadataRecord | None) -> None:
    result = merge_records(merged.get(key), newer)
    if result is None:
        merged.pop(key, None)
    else:
        merged[key] = result


def read_slice(storage: Storage, piece: GroupSlice) -> dict[str, MetadataRecord]:
    """Every key of one group slice, merged by Hudi's rules (deleted keys dropped).
    ``storage`` is rooted at the MDT. Executor-safe."""
    merged: dict[str, MetadataRecord] = {}
    if piece.base_path is not None:
        for record in _parsed(storage, piece.base_path, _BASES, read_base_file):
            merged[record.key] = record
    for path in piece.log_paths:
        for key, newer in _parsed(storage, path, _LOG_ENTRIES, _log_entries):
            _merge(merged, key, newer)
    return merged


PARSED_KEPT_BYTES = 256 * 1024
"""MDT files up to this size are kept parsed per process (:func:`read_slice`): the ``files``
partition's base and logs, read whole by every listing through the MDT (a point lookup in a
process that answers many pays for them once). Records are immutable; larger files (a
record index read whole by a compaction) are parsed anew each time."""

_Entries = TypeVar("_Entries")
_BASES: OrderedDict[tuple[str, str, int, float | None], list[MetadataRecord]] = OrderedDict()
_LOG_ENTRIES: OrderedDict[tuple[str, str, int, float | None],
                          list[tuple[str, MetadataRecord | None]]] = OrderedDict()


def _log_entries(data: bytes) -> list[tuple[str, MetadataRecord | None]]:
    return list(read_log_file(data))


def _parsed(storage: Storage, path: str,
            cache: OrderedDict[tuple[str, str, int, float | None], _Entries],
            parse: Callable[[bytes], _Entries]) -> _Entries:
    """``parse`` of the file ``path``, kept per process when it is small
    (:data:`PARSED_KEPT_BYTES`)."""
    size, mtime = storage.stat(path)
    if size > PARSED_KEPT_BYTES:
        return parse(storage.read(path))
    return _kept(cache, READERS_KEPT, storage, path, lambda _size: parse(storage.read(path)),
                 stat=(size, mtime))


_READERS: OrderedDict[tuple[str, str, int, float | None], HFileReader] = OrderedDict()
_READERS_LOCK = threading.Lock()
READERS_KEPT = 64
"""Base HFile readers a process keeps (their block index and file info parsed, ~1 MB each
at most): a lookup then reads only data blocks. Files are immutable; a reader is found again
by path, size and modification time, so a file written anew under the same name (an MDT
rebuilt from scratch) is read anew."""


def base_reader(storage: Storage, path: str, *,
                stat: tuple[int, float] | None = None) -> HFileReader:
    """A ranged reader of the base HFile ``path`` (kept for the next lookup, see
    :data:`READERS_KEPT`; ``stat``: its size and mtime, when the caller has them)."""
    return _kept(_READERS, READERS_KEPT, storage, path, lambda size: HFileReader.from_ranges(
        size, lambda offset, length: storage.read_range(path, offset, length)), stat=stat)


_Kept = TypeVar("_Kept")


def _kept(cache: OrderedDict[tuple[str, str, int, float | None], _Kept], limit: int,
          storage: Storage, path: str, build: Callable[[int], _Kept], *,
          stat: tuple[int, float] | None = None) -> _Kept:
    """What ``build(size)`` makes of the file ``path``, kept in ``cache`` (least recently
    used first out beyond ``limit``) by location, size and mtime (one ``HEAD``, unless the
    caller has them: ``stat``)."""
    size, mtime = stat if stat is not None else storage.stat(path)
    key = (storage.base_path, path, size, mtime)
    with _READERS_LOCK:
        known = cache.get(key)
        if known is not None:
            cache.move_to_end(key)
            return known
    made = build(size)
    with _READERS_LOCK:
        cache[key] = made
        while len(cache) > limit:
            cache.popitem(last=False)
    return made


KEY_INDEX_SHARE = 4
"""A lookup that decompresses at least 1/4 of an HFile's data blocks builds the file's key
index (:meth:`~engine.format.hfile.HFileReader.key_index`: every block, once) and keeps it
when a budget is given (:func:`_hfile_cells`); a smaller lookup reads its blocks only."""

_KEY_INDEXES: OrderedDict[tuple[str, str, int, float, int], KeyIndex | None] = OrderedDict()
_KEY_INDEX_BYTES = [0]
_KEY_INDEXES_KEPT = 4096
"""Entries at most (files whose rows cannot be indexed are remembered as None)."""


def _hfile_cells(reader: HFileReader, identity: tuple[str, str, int, float, int],
                 rows: Sequence[bytes], cache_bytes: int) -> Iterable[tuple[bytes, bytes]]:
    """``reader.get_many(rows)`` (sorted, distinct), answered from the HFile's key index
    kept by the process when ``cache_bytes`` > 0 (Hudi 1.1 keeps decompressed HFile blocks
    in a process-wide cache the same way: ``HFileReaderCacheManager``, keyed by path, length
    and modification time). ``identity``: (storage root, path, size, mtime, offset of the
    HFile in the file): a file written anew, compacted or rolled back is another key, so a
    kept index is never stale. Indexes are kept least recently used first out while their
    bytes exceed ``cache_bytes``; one larger than that answers its lookup and is dropped."""
    if cache_bytes <= 0 or not reader.block_count:
        return reader.get_many(rows)
    with _READERS_LOCK:
        if identity in _KEY_INDEXES:
            _KEY_INDEXES.move_to_end(identity)
            known = _KEY_INDEXES[identity]
            return known.get_many(rows) if known is not None else reader.get_many(rows)
    if reader.blocks_touched(rows) * KEY_INDEX_SHARE < reader.block_count:
        return reader.get_many(rows)
    index = reader.key_index()
    size = index.nbytes if index is not None else 0
    if size <= cache_bytes:
        with _READERS_LOCK:
            old = _KEY_INDEXES.pop(identity, None)
            _KEY_INDEX_BYTES[0] -= old.nbytes if old is not None else 0
            _KEY_INDEXES[identity] = index
            _KEY_INDEX_BYTES[0] += size
            while _KEY_INDEX_BYTES[0] > cache_bytes or len(_KEY_INDEXES) > _KEY_INDEXES_KEPT:
                _, dropped = _KEY_INDEXES.popitem(last=False)
                _KEY_INDEX_BYTES[0] -= dropped.nbytes if dropped is not None else 0
    return index.get_many(rows) if index is not None else reader.get_many(rows)


def key_indexes_kept() -> tuple[int, int]:
    """(HFile key indexes the process keeps, their bytes)."""
    with _READERS_LOCK:
        return sum(i is not None for i in _KEY_INDEXES.values()), _KEY_INDEX_BYTES[0]


def drop_key_indexes() -> None:
    """Forget every kept key index (a bench measuring a cold lookup; tests)."""
    with _READERS_LOCK:
        _KEY_INDEXES.clear()
        _KEY_INDEX_BYTES[0] = 0


Cell = tuple[bytes, bytes | None, str | None]
"""(row, value bytes, writer schema of the file holding it): a delete-block entry has value
None; a schema None is Hudi 1.0's (:func:`~engine.metadata.records.decode_metadata_value`)."""


def slice_cells(storage: Storage, piece: GroupSlice, rows: Sequence[bytes], *,
                cache_bytes: int = 0) -> Iterator[Cell]:
    """(row, value bytes, schema) of the keys ``rows`` (UTF-8, sorted) in one group slice,
    oldest first: the base file's cells, then each log's in log order, a delete-block entry
    as (row, None, None). No record is decoded: :func:`lookup_slice` merges decoded records,
    :func:`lookup_values` keeps the newest bytes. The base file and the logs' HFile blocks
    are searched through their block indexes (only the data blocks holding the keys are
    decompressed, each once; a log holds a whole bulk insert's keys until the MDT
    compacts); delete blocks are read whole. With ``cache_bytes`` the HFiles' key indexes
    kept by the process answer (:func:`_hfile_cells`). Executor-safe."""
    if not rows:
        return
    wanted = set(rows)
    if piece.base_path is not None:
        stat = storage.stat(piece.base_path)
        base = base_reader(storage, piece.base_path, stat=stat)
        schema = hfile_schema(base)
        identity = (storage.base_path, piece.base_path, *stat, 0)
        for row, value in _hfile_cells(base, identity, rows, cache_bytes):
            yield row, value, schema
    for path in piece.log_paths:
        stat = storage.stat(path)
        blocks = log_blocks(storage, path, stat=stat)
        if blocks is None:  # a frame does not hold: read the log whole
            for block in iter_blocks(storage.read(path)):
                if block.block_type is BlockType.HFILE_DATA:
                    schema = block_schema(block.header)
                    for row, value in HFileReader(block.content).get_many(rows):
                        yield row, value, schema
                elif block.block_type is BlockType.DELETE:
                    yield from _deleted(block, wanted)
            continue
        for frame, reader in blocks:
            if reader is not None:
                schema = block_schema(frame.header)
                identity = (storage.base_path, path, *stat, frame.content_offset)
                for row, value in _hfile_cells(reader, identity, rows, cache_bytes):
                    yield row, value, schema
            elif frame.block_type is BlockType.DELETE:
                yield from _deleted(LogBlock(frame.block_type, frame.header, storage.read_range(
                    path, frame.content_offset, frame.content_length)), wanted)


def _deleted(block: LogBlock, wanted: set[bytes]) -> Iterator[Cell]:
    """(row, None, None) for the ``wanted`` keys a delete block deletes."""
    for deleted in decode_delete_block(block):
        row = str(deleted.record_key).encode("utf-8")
        if row in wanted:
            yield row, None, None


def lookup_slice(storage: Storage, piece: GroupSlice,
                 keys: Iterable[str]) -> dict[str, MetadataRecord]:
    """The merged records of ``keys`` in one group slice (:func:`slice_cells`, each cell
    decoded and merged by Hudi's rules). Executor-safe."""
    merged: dict[str, MetadataRecord] = {}
    decode = CellDecoder()
    for row, value, schema in slice_cells(storage, piece,
                                          sorted({k.encode("utf-8") for k in keys})):
        if value is None:
            _merge(merged, row.decode("utf-8"), None)
        else:
            record = decode(row, value, schema)
            _merge(merged, record.key, record)
    return merged


def lookup_values(storage: Storage, piece: GroupSlice, rows: Sequence[bytes], *,
                  cache_bytes: int = 0) -> dict[bytes, bytes | None]:
    """Row → the newest value bytes of ``rows`` (UTF-8 keys, sorted) in one group slice, None
    for a key whose newest entry is a delete (:func:`slice_cells`): a lookup for a partition
    whose newer entry simply replaces the older (``record_index``), with no record decoded,
    so a caller decodes each distinct value once (record-index values read alike under
    either writer schema, :class:`~engine.metadata.codec.CellDecoder`); ``cache_bytes``:
    :func:`slice_cells`. Executor-safe."""
    return {row: value for row, value, _ in slice_cells(storage, piece, rows,
                                                        cache_bytes=cache_bytes)}


SMALL_LOG_BLOCK = 256 * 1024
"""An HFile log block up to this size is fetched whole when its log is first looked up (one
read); a larger one (a bulk insert's keys, until the MDT compacts) by ranges, as a base
file is."""

LogBlocks = list[tuple[BlockFrame, HFileReader | None]]

_LOGS: OrderedDict[tuple[str, str, int, float | None], LogBlocks] = OrderedDict()


def log_blocks(storage: Storage, path: str, *,
               stat: tuple[int, float] | None = None) -> LogBlocks | None:
    """The blocks of the MDT log ``path`` with a reader for each HFile data block, kept per
    process as :func:`base_reader` keeps base files (a log is never written to again); None
    when a block's frame does not hold (then the log is read whole)."""
    blocks = _kept(_LOGS, READERS_KEPT * 4, storage, path,
                   lambda size: _log_blocks(storage, path, size), stat=stat)
    return blocks or None


def _log_blocks(storage: Storage, path: str, size: int) -> LogBlocks:
    """:func:`log_blocks` read anew ([] when a frame does not hold)."""
    frames = scan_frames(size, lambda offset, length: storage.read_range(path, offset, length))
    if frames is None:
        return []
    blocks: LogBlocks = []
    for frame in frames:
        reader = None
        if frame.block_type is BlockType.HFILE_DATA:
            start, length = frame.content_offset, frame.content_length
            if length <= SMALL_LOG_BLOCK:
                reader = HFileReader(storage.read_range(path, start, length))
            else:
                reader = HFileReader.from_ranges(length, _ranges_from(storage, path, start))
        blocks.append((frame, reader))
    return blocks


def _ranges_from(storage: Storage, path: str, start: int) -> Callable[[int, int], bytes]:
    """``read_range`` of the part of ``path`` that starts at ``start`` (an HFile inside a
    log block)."""
    return lambda offset, length: storage.read_range(path, start + offset, length)


def route(keys: Iterable[str], groups: int) -> dict[int, list[str]]:
    """Keys by the index of the file group they hash to (``hudi-metadata-table.md`` §4.8)."""
    listed = list(keys)
    out: dict[int, list[str]] = {}
    for key, index in zip(listed, file_group_indexes(listed, groups).tolist(), strict=True):
        out.setdefault(index, []).append(key)
    return out
