"""Fast decoding of fetched Kafka records: whole record batches into columns.

kafka-python turns every fetched record into several Python objects (a record, a
``ConsumerRecord``, property calls per field); at ~20-40 µs per record that alone capped a
task's Kafka read at ~25-40k records/s per core, below what the rest of the job sustains.
This module keeps kafka-python for everything around the records — connections, metadata,
fetch sessions, positions, retries, SASL/SSL, CRCs, decompression — and replaces only the
last step: each fetched record batch (message format v2) becomes one :class:`RecordChunk` of
columns (numpy offsets and timestamps, Arrow keys and values), decoded over the batch's bytes
with numpy and Arrow (:func:`decode_records`); the only Python step per record finds where
the record starts (one varint).

How it plugs in: kafka-python's fetcher builds one ``Fetcher.PartitionRecords`` per fetched
partition and iterates what its ``_unpack_records`` yields; :func:`use_record_chunks` points
one consumer's fetcher at :class:`ChunkedPartitionRecords`, whose ``_unpack_records`` yields
chunks instead of single records, keeping the original's rules: CRC check per batch, control
batches skipped, under ``read_committed`` the batches of aborted transactions skipped (with the
original's bookkeeping of the aborted transactions a fetch response lists), the fetch position
moved past each chunk. ``poll`` then returns chunks
(``max_records`` counts chunks). These are kafka-python internals, so :func:`use_record_chunks`
checks they look as expected and otherwise leaves the consumer alone (it yields
``ConsumerRecord`` objects, which callers must accept too); kafka-python is pinned to the
minor versions this was checked against.

Offset holes: on a topic that is not compacted, a partition's log has no holes (every offset is
a record, a transaction marker or a record of an aborted transaction, all inside record
batches), so a fetch response whose batches skip offsets shows data that is *not yet visible*
(a broker that makes a later batch readable before an earlier one: Tansu with two producers),
not data that is gone. :func:`refuse_offset_holes` makes a consumer keep only the batches up to
the first hole of such a topic: its position stops there and its next fetch asks again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from engine.errors import TerminalError

log = logging.getLogger(__name__)

__all__ = ["HEADERS_TYPE", "RecordChunk", "contiguous_length", "decode_batches",
           "decode_records", "offset_hole",
           "refuse_offset_holes", "use_record_chunks"]


HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()),
                                                       pa.field("value", pa.binary())])))
"""Arrow type of a record's headers (Spark's ``ARRAY<STRUCT<key: STRING, value: BINARY>>``)."""


@dataclass
class RecordChunk:
    """Consecutive records of one partition, as columns (one record batch, or part of one)."""

    offset: int
    """The last offset in the chunk (the fetcher compares it with its fetch offset)."""
    offsets: np.ndarray
    """int64, ascending."""
    timestamps: np.ndarray
    """int64 milliseconds since the epoch."""
    keys: pa.BinaryArray
    values: pa.BinaryArray
    headers: pa.Array | None
    """:data:`HEADERS_TYPE` per record (null for a record without headers); None when no
    record of the chunk has headers."""

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def of_records(cls, records: list[tuple[int, int, bytes | None, bytes | None, Any]]
                   ) -> RecordChunk:
        """A chunk of ``(offset, timestamp, key, value, headers)`` tuples (headers: a list of
        ``(name, value)`` pairs, or empty / None; timestamp None, as message format v0 has
        none, becomes -1, Kafka's ``NO_TIMESTAMP``)."""
        n = len(records)
        headers = [list(r[4]) or None if r[4] else None for r in records]
        return cls(records[-1][0] if records else -1,
                   np.fromiter((r[0] for r in records), np.int64, n),
                   np.fromiter((-1 if r[1] is None else r[1] for r in records), np.int64, n),
                   pa.array([r[2] for r in records], pa.binary()),
                   pa.array([r[3] for r in records], pa.binary()),
                   pa.array(headers, HEADERS_TYPE) if any(headers) else None)

    def since(self, first: int) -> RecordChunk:
        """The records with offsets ``>= first``."""
        return self._slice(int(np.searchsorted(self.offsets, first)), len(self.offsets))

    def before(self, end: int) -> RecordChunk:
        """The records with offsets ``< end``."""
        return self._slice(0, int(np.searchsorted(self.offsets, end)))

    def _slice(self, start: int, stop: int) -> RecordChunk:
        if start == 0 and stop == len(self.offsets):
            return self
        offsets = self.offsets[start:stop]
        return RecordChunk(int(offsets[-1]) if len(offsets) else self.offset, offsets,
                           self.timestamps[start:stop], self.keys[start:stop],
                           self.values[start:stop],
                           None if self.headers is None else self.headers[start:stop])


class CorruptRecordsError(TerminalError, ValueError):
    """A record batch's bytes do not parse as message format v2 records."""


def _long_varint(buf: Any, pos: int) -> tuple[int, int]:
    """A zigzag varint of any length at ``pos``: (value, next position)."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordsError(f"varint longer than 10 bytes at {pos}")


_VARINT_PAD = 10
"""Zero bytes after a decoded buffer: a varint read at any position up to its end stays in."""


def _varints(data: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints (up to 10 bytes, 64 bits) starting at each of ``pos``: (values as
    int64, the positions after them), over all positions at once, a byte of each per step."""
    byte = data[pos]
    value = (byte & 0x7F).astype(np.uint64)
    after = pos + 1
    longer = np.flatnonzero(byte >= 0x80)
    shift = 7
    while longer.size:
        if shift > 63:
            raise CorruptRecordsError(f"varint longer than 10 bytes at {int(pos[longer[0]])}")
        byte = data[after[longer]]
        value[longer] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[longer] += 1
        longer = longer[byte >= 0x80]
        shift += 7
    return (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64), \
        after


def _byte_ranges(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """``data[start:start + length]`` per row as one binary array, null where ``length`` < 0.

    The ranges lie in ``data`` in order with gaps between them; they are laid out as the even
    elements of one binary array over ``data`` itself (the gaps are the odd ones) and Arrow's
    ``take`` copies the even ones out: no Python step per row.
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    valid = lengths >= 0
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + np.where(valid, lengths, 0)
    if int(bounds[-1]) >= 1 << 31:
        raise CorruptRecordsError("record batch larger than 2 GiB")
    nulls = int(n - np.count_nonzero(valid))
    bitmap = None
    if nulls:
        every = np.ones(2 * n - 1, bool)
        every[0::2] = valid
        bitmap = pa.py_buffer(np.packbits(every, bitorder="little"))
    spread = pa.BinaryArray.from_buffers(
        pa.binary(), 2 * n - 1, [bitmap, pa.py_buffer(bounds.astype(np.int32)),
                                 pa.py_buffer(data)], null_count=nulls)
    return spread.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def _record_starts(buf: Any, pos: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``count`` records' bodies start (after the length varint) and their
    lengths, relative to ``pos``: the one step that must walk record by record (each record's
    place follows from the one before), so it reads one varint per record and nothing else."""
    body = [0] * count
    lengths = [0] * count
    size = len(buf)
    p = pos
    try:
        for i in range(count):
            b = buf[p]
            if b < 0x80:
                length, p = (b >> 1) ^ -(b & 1), p + 1
            elif buf[p + 1] < 0x80:
                v = (b & 0x7F) | (buf[p + 1] << 7)
                length, p = (v >> 1) ^ -(v & 1), p + 2
            else:
                length, p = _long_varint(buf, p)
            if length <= 0 or p + length > size:
                raise CorruptRecordsError(f"record length {length} at {p - pos}")
            body[i] = p - pos
            lengths[i] = length
            p += length
    except IndexError as exc:
        raise CorruptRecordsError(f"record batch ends inside a record at {p - pos}") from exc
    return np.array(body, np.int64), np.array(lengths, np.int64)


BatchRecords = tuple[Any, int, int, int, int, "int | None"]
"""One v2 record batch's records: (buffer, position of the first record, record count, base
offset, first timestamp, the batch's max timestamp if it uses log-append time else None)."""


def decode_records(buf: Any, pos: int, count: int, base_offset: int, first_timestamp: int,
                   append_time: int | None) -> RecordChunk:
    """Decode ``count`` v2 records starting at ``buf[pos]`` (uncompressed): one batch's
    records, as :func:`decode_batches`."""
    return decode_batches([(buf, pos, count, base_offset, first_timestamp, append_time)])


def decode_batches(batches: Sequence[BatchRecords]) -> RecordChunk:
    """Decode the records of consecutive v2 record batches (uncompressed) as one chunk.

    Record: length, attributes, timestamp delta, offset delta, key, value (varint-length bytes,
    -1 = null), headers (count, then key string + nullable value each); every integer a zigzag
    varint. A batch that uses log-append time gives every record its max timestamp. After
    :func:`_record_starts` has found each record, every field is decoded for all records of
    all the batches at once with numpy (:func:`_varints`) and keys and values are cut out by
    Arrow (:func:`_byte_ranges`); only records that carry headers are decoded one by one. The
    batches of one fetch are decoded together: numpy's and Arrow's cost per call would
    dominate batches of a few hundred records (producers with a short linger send those).
    """
    views = [memoryview(buf)[pos:] for buf, pos, *_ in batches]
    try:
        data = np.zeros(sum(len(v) for v in views) + _VARINT_PAD, np.uint8)
        bodies, sizes, placed = [], [], 0
        for (buf, pos, count, *_), view in zip(batches, views, strict=True):
            data[placed:placed + len(view)] = np.frombuffer(view, np.uint8)
            body, length = _record_starts(buf, pos, count)
            bodies.append(body + placed)
            sizes.append(length)
            placed += len(view)
    finally:
        for view in views:
            view.release()
    body = np.concatenate(bodies) if len(bodies) != 1 else bodies[0]
    lengths = np.concatenate(sizes) if len(sizes) != 1 else sizes[0]
    counts = np.array([b[2] for b in batches], np.int64)
    count = int(counts.sum())
    end = body + lengths

    def where(i: int) -> str:
        batch = int(np.searchsorted(np.cumsum(counts), i, side="right"))
        return f"record {i - int(counts[:batch].sum())} of the batch at offset {batches[batch][3]}"

    def inside(at: np.ndarray, what: str) -> None:
        over = np.flatnonzero(at > end)
        if over.size:
            i = int(over[0])
            raise CorruptRecordsError(f"{where(i)}: its {what} runs past the record's length "
                                      f"{int(lengths[i])}")

    stamps, at = _varints(data, body + 1)  # + 1: attributes, one byte, unused
    inside(at, "timestamp delta")
    deltas, at = _varints(data, at)
    inside(at, "offset delta")
    key_lengths, key_starts = _varints(data, at)
    inside(key_starts, "key length")
    at = key_starts + np.maximum(key_lengths, 0)
    inside(at, "key")
    value_lengths, value_starts = _varints(data, at)
    inside(value_starts, "value length")
    at = value_starts + np.maximum(value_lengths, 0)
    inside(at, "value")
    header_counts, at = _varints(data, at)
    inside(at, "header count")
    headers = None
    with_headers = np.flatnonzero(header_counts != 0)
    if with_headers.size:
        rows: list[list[tuple[str, bytes | None]] | None] = [None] * count
        for i in with_headers.tolist():
            rows[i], at[i] = _headers(data, int(header_counts[i]), int(at[i]), int(end[i]))
        headers = pa.array(rows, HEADERS_TYPE)
    wrong = np.flatnonzero(at != end)
    if wrong.size:
        i = int(wrong[0])
        raise CorruptRecordsError(f"{where(i)} holds {int(at[i] - body[i])} bytes, its length "
                                  f"says {int(lengths[i])}")
    offsets = deltas + np.repeat(np.array([b[3] for b in batches], np.int64), counts)
    appended = np.array([-1 if b[5] is None else b[5] for b in batches], np.int64)
    firsts = np.array([b[4] for b in batches], np.int64)
    stamps = np.where(np.repeat(appended >= 0, counts), np.repeat(appended, counts),
                      stamps + np.repeat(firsts, counts))
    return RecordChunk(int(offsets[-1]) if count else batches[-1][3] - 1, offsets, stamps,
                       _byte_ranges(data, key_starts, key_lengths),
                       _byte_ranges(data, value_starts, value_lengths), headers)


def _headers(data: np.ndarray, count: int, pos: int, end: int
             ) -> tuple[list[tuple[str, bytes | None]], int]:
    """``count`` headers (key string, nullable value) starting at ``pos``, within ``end``."""
    if count < 0:
        raise CorruptRecordsError(f"header count {count} at {pos}")
    buf = data[:end + _VARINT_PAD].tobytes()
    pairs: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        n, pos = _long_varint(buf, pos)
        if n < 0 or pos + n > end:
            raise CorruptRecordsError(f"header key length {n} at {pos}")
        try:
            name = buf[pos:pos + n].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordsError(f"header key at {pos} is not UTF-8: {exc}") from None
        pos += n
        n, pos = _long_varint(buf, pos)
        if pos + max(n, 0) > end:
            raise CorruptRecordsError(f"header value length {n} at {pos}")
        if n >= 0:
            pairs.append((name, buf[pos:pos + n]))
            pos += n
        else:
            pairs.append((name, None))
    return pairs, pos


def _chunk_of_legacy(batch: Any, check_crcs: bool) -> RecordChunk:
    """Message format v0/v1 (one record object per record, kafka-python's own parser; these
    formats carry a CRC per record)."""
    records = list(batch)
    if check_crcs:
        bad = next((r for r in records if not r.validate_crc()), None)
        if bad is not None:
            raise CorruptRecordsError(f"record at offset {bad.offset} failed its crc check")
    return RecordChunk.of_records([(r.offset, r.timestamp, r.key, r.value, None)
                                   for r in records])


def _batch_chunk(*batches: Any) -> RecordChunk:
    """Consecutive v2 record batches (already CRC-checked, no control batch) as one chunk."""
    parts: list[BatchRecords] = []
    for batch in batches:
        batch._maybe_uncompress()
        append_time = (batch.max_timestamp if batch.timestamp_type == batch.LOG_APPEND_TIME
                       else None)
        parts.append((batch._buffer, batch._pos, batch.records_count, batch.base_offset,
                      batch.first_timestamp, append_time))
    return decode_batches(parts)


@functools.cache
def _chunked_class(base: type, read_committed: Any) -> type:
    """A subclass of kafka-python's ``Fetcher.PartitionRecords`` yielding chunks."""
    from kafka.errors import CorruptRecordError

    class ChunkedPartitionRecords(base):
        def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any,
                            value_deserializer: Any) -> Any:
            if key_deserializer or value_deserializer:
                yield from super()._unpack_records(tp, records, key_deserializer,
                                                   value_deserializer)
                return
            batch = records.next_batch()
            last_batch = None
            group: list[Any] = []  # consecutive v2 batches of records, decoded together
            while batch is not None:
                last_batch = batch
                if self.check_crcs and not batch.validate_crc():
                    raise CorruptRecordError(f"Record batch for partition {tp} at offset "
                                             f"{batch.base_offset} failed crc check")
                if batch.magic == 2:
                    self.leader_epoch = batch.leader_epoch
                    if ((self.isolation_level == read_committed and batch.has_producer_id()
                            and self._skip_aborted(batch))
                            or batch.is_control_batch):  # transaction markers: not records
                        yield from self._chunk_of(tp, group)
                        group = []
                        self.next_fetch_offset = batch.next_offset
                    else:
                        group.append(batch)
                else:
                    yield from self._chunk_of(tp, group)
                    group = []
                    try:
                        chunk = _chunk_of_legacy(batch, self.check_crcs)
                    except CorruptRecordsError as exc:
                        raise CorruptRecordError(f"Record batch for partition {tp} at offset "
                                                 f"{batch.base_offset}: {exc}") from None
                    yield from self._yield(chunk)
                batch = records.next_batch()
            yield from self._chunk_of(tp, group)
            if last_batch is not None and last_batch.magic == 2:
                self.next_fetch_offset = last_batch.next_offset
            self.drain()

        def _chunk_of(self, tp: Any, group: list[Any]) -> Any:
            """Yield the records of ``group`` (v2 batches) from the fetch offset on."""
            if not group:
                return
            try:
                chunk = _batch_chunk(*group)
            except CorruptRecordsError as exc:
                raise CorruptRecordError(f"Record batches for partition {tp} from offset "
                                         f"{group[0].base_offset}: {exc}") from None
            yield from self._yield(chunk)

        def _yield(self, chunk: RecordChunk) -> Any:
            chunk = chunk.since(self.fetch_offset)
            if len(chunk):
                self.records_read += len(chunk)
                self.next_fetch_offset = chunk.offset + 1
                yield chunk

        def _skip_aborted(self, batch: Any) -> bool:
            """``read_committed``: True for a batch of an aborted transaction (the rule of
            kafka-python's own ``_unpack_records``: the fetch response lists the aborted
            transactions, each from its first offset up to its abort marker)."""
            self._consume_aborted_transactions_up_to(batch.last_offset)
            if self._contains_abort_marker(batch):
                self.aborted_producer_ids.discard(batch.producer_id)
                return False
            return bool(self._is_batch_aborted(batch))

    return ChunkedPartitionRecords


def use_record_chunks(consumer: Any) -> bool:
    """Make ``consumer.poll`` return :class:`RecordChunk` items; False if this kafka-python
    does not look as expected (the consumer is left unchanged, returning records)."""
    try:
        from kafka.consumer.fetcher import Fetcher
        from kafka.protocol.consumer import IsolationLevel
        from kafka.record.default_records import DefaultRecordBatch

        fetcher = consumer._fetcher
        base = Fetcher.PartitionRecords
        expected = ("_unpack_records", "take", "drain", "_consume_aborted_transactions_up_to",
                    "_contains_abort_marker", "_is_batch_aborted")
        batch_parts = ("_maybe_uncompress", "records_count", "first_timestamp",
                       "max_timestamp", "LOG_APPEND_TIME", "has_producer_id", "last_offset")
        if (not isinstance(fetcher, Fetcher) or not all(hasattr(base, a) for a in expected)
                or not all(hasattr(DefaultRecordBatch, a) for a in batch_parts)
                or "_buffer" not in DefaultRecordBatch.__slots__
                or "_pos" not in DefaultRecordBatch.__slots__):
            raise AttributeError("unexpected kafka-python internals")
    except (ImportError, AttributeError) as exc:
        log.warning("decoding Kafka records one by one (slower): %s", exc)
        return False
    fetcher.PartitionRecords = _chunked_class(base, IsolationLevel.READ_COMMITTED)
    return True


_V2_MAGIC_AT = 16  # base offset (8 bytes), batch length (4), partition leader epoch (4), magic
_V2_LAST_DELTA_AT = 23  # ... magic (1), crc (4), attributes (2), last offset delta (4)
_V2_HEADER = 27


def contiguous_length(buf: Any, fetch_offset: int) -> tuple[int, tuple[int, int] | None]:
    """How many leading bytes of a fetch response's record data hold no offset hole.

    Returns ``(length, None)`` when the batches cover every offset from ``fetch_offset`` on, or
    ``(length, (missing, next_base))`` when the batch after ``length`` bytes starts at
    ``next_base`` while offset ``missing`` came in no batch. Only message format v2 batches are
    checked (their headers carry first and last offset); a legacy batch, or a batch cut short
    by the fetch size, ends the check with everything kept.
    """
    view = memoryview(buf)
    try:
        pos, expected, size = 0, fetch_offset, len(view)
        while pos + _V2_HEADER <= size and view[pos + _V2_MAGIC_AT] == 2:
            base = int.from_bytes(view[pos:pos + 8], "big", signed=True)
            length = 12 + int.from_bytes(view[pos + 8:pos + 12], "big", signed=True)
            last = base + int.from_bytes(view[pos + _V2_LAST_DELTA_AT:pos + _V2_HEADER], "big",
                                         signed=True)
            if base > expected:
                return pos, (expected, base)
            expected = max(expected, last + 1)
            pos += length
        return size, None
    finally:
        view.release()


def refuse_offset_holes(consumer: Any, topics: set[str]) -> bool:
    """Make ``consumer`` stop at the first offset hole of a fetch from any of ``topics`` (the
    subscribed topics that are not compacted; see the module docstring); other topics' holes
    are skipped as before. Call again to change the set. False if kafka-python's internals
    look unfamiliar (the consumer is then left unchanged)."""
    try:
        from kafka.record.memory_records import MemoryRecords

        fetcher = consumer._fetcher
        base = fetcher.PartitionRecords
        if "_buffer" not in MemoryRecords.__slots__:
            raise AttributeError("unexpected kafka-python internals")
    except (ImportError, AttributeError) as exc:
        log.warning("offset holes are skipped, not waited for: %s", exc)
        return False
    if not hasattr(base, "gapless_topics"):
        fetcher.PartitionRecords = base = _gapless_class(base, MemoryRecords)
    base.gapless_topics.clear()
    base.gapless_topics.update(topics)
    base.holes.clear()
    return True


def offset_hole(consumer: Any, tp: Any) -> tuple[int, int] | None:
    """The last hole ``consumer`` stopped at in ``tp`` since :func:`refuse_offset_holes`:
    (first missing offset, next offset present), or None."""
    holes = getattr(getattr(consumer, "_fetcher", None), "PartitionRecords", None)
    return getattr(holes, "holes", {}).get(tp)


def _gapless_class(base: type, memory_records: type) -> type:
    """A subclass of a ``PartitionRecords`` class that cuts each fetched partition's records at
    the first hole (per consumer: it holds that consumer's topics and the holes it saw)."""

    class GaplessPartitionRecords(base):
        gapless_topics: set[str] = set()  # noqa: RUF012 - replaced per class below
        holes: dict[Any, tuple[int, int]] = {}  # noqa: RUF012
        """The last hole seen per partition: (first missing offset, next offset present)."""

        def __init__(self, fetch_offset: int, tp: Any, records: Any, *args: Any,
                     **kwargs: Any) -> None:
            if tp.topic in self.gapless_topics:
                length, hole = contiguous_length(records._buffer, fetch_offset)
                if hole is not None:
                    log.debug("%s: offsets from %d are not visible yet but %d is; fetching "
                              "again from %d", tp, hole[0], hole[1], hole[0])
                    self.holes[tp] = hole
                    records = memory_records(bytes(records._buffer[:length]))
            super().__init__(fetch_offset, tp, records, *args, **kwargs)

    GaplessPartitionRecords.gapless_topics = set()
    GaplessPartitionRecords.holes = {}
    return GaplessPartitionRecords
