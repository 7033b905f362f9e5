"""Fast decoding of fetched Kafka records: whole record batches into columns.

kafka-python turns every fetched record into several Python objects (a record, a
``ConsumerRecord``, property calls per field); at ~20-40 µs per record that alone capped a
task's Kafka read at ~25-40k records/s per core, below what the rest of the job sustains.
This module keeps kafka-python for everything around the records — connections, metadata,
fetch sessions, positions, retries, SASL/SSL — and replaces only the last step: each fetched
record batch (message format v2) becomes one :class:`RecordChunk` of plain column lists,
decoded by one tight loop over the batch's bytes.

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

import bisect
import functools
import logging
from dataclasses import dataclass
from typing import Any

from engine.errors import TerminalError

log = logging.getLogger(__name__)

__all__ = ["RecordChunk", "contiguous_length", "decode_records", "offset_hole",
           "refuse_offset_holes", "use_record_chunks"]


@dataclass
class RecordChunk:
    """Consecutive records of one partition, as columns (one record batch, or part of one)."""

    offset: int
    """The last offset in the chunk (the fetcher compares it with its fetch offset)."""
    offsets: list[int]
    timestamps: list[int]
    """Milliseconds since the epoch."""
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[tuple[str, bytes | None]]] | None
    """Per record; None when no record of the chunk has headers."""

    def __len__(self) -> int:
        return len(self.offsets)

    def since(self, first: int) -> RecordChunk:
        """The records with offsets ``>= first``."""
        return self._slice(bisect.bisect_left(self.offsets, first), len(self.offsets))

    def before(self, end: int) -> RecordChunk:
        """The records with offsets ``< end``."""
        return self._slice(0, bisect.bisect_left(self.offsets, end))

    def _slice(self, start: int, stop: int) -> RecordChunk:
        if start == 0 and stop == len(self.offsets):
            return self
        offsets = self.offsets[start:stop]
        return RecordChunk(offsets[-1] if offsets else self.offset, offsets,
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


def decode_records(buf: Any, pos: int, count: int, base_offset: int, first_timestamp: int,
                   append_time: int | None) -> RecordChunk:
    """Decode ``count`` v2 records starting at ``buf[pos]`` (uncompressed).

    Record: length, attributes, timestamp delta, offset delta, key, value (varint-length bytes,
    -1 = null), headers (count, then key string + nullable value each); every integer a zigzag
    varint. ``append_time``: the batch's max timestamp when it uses log-append time (then every
    record has it). Hand-inlined for the one- and two-byte varints that dominate; see
    :func:`_long_varint` for the rest.
    """
    offsets: list[int] = []
    stamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[tuple[str, bytes | None]]] = []
    any_headers = False
    view = memoryview(buf)
    end_of_buffer = len(buf)
    try:
        for _ in range(count):
            # length
            b = buf[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                length, pos = (v >> 1) ^ -(v & 1), pos + 2
            else:
                length, pos = _long_varint(buf, pos)
            start = pos
            end = pos + length
            if length <= 0 or end > end_of_buffer:
                raise CorruptRecordsError(f"record length {length} at {start}")
            pos += 1  # attributes (unused, one byte)
            # timestamp delta
            b = buf[pos]
            if b < 0x80:
                ts, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                ts, pos = _long_varint(buf, pos)
            # offset delta
            b = buf[pos]
            if b < 0x80:
                od, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                od, pos = (v >> 1) ^ -(v & 1), pos + 2
            else:
                od, pos = _long_varint(buf, pos)
            # key
            b = buf[pos]
            if b < 0x80:
                n, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                n, pos = _long_varint(buf, pos)
            if n >= 0:
                keys.append(bytes(view[pos:pos + n]))
                pos += n
            else:
                keys.append(None)
            # value
            b = buf[pos]
            if b < 0x80:
                n, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif buf[pos + 1] < 0x80:
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                n, pos = (v >> 1) ^ -(v & 1), pos + 2
            else:
                n, pos = _long_varint(buf, pos)
            if n >= 0:
                values.append(bytes(view[pos:pos + n]))
                pos += n
            else:
                values.append(None)
            # headers
            b = buf[pos]
            if b == 0:
                pos += 1
                headers.append([])
            else:
                count_h, pos = _long_varint(buf, pos)
                if count_h < 0:
                    raise CorruptRecordsError(f"header count {count_h} at {pos}")
                pairs: list[tuple[str, bytes | None]] = []
                for _h in range(count_h):
                    n, pos = _long_varint(buf, pos)
                    if n < 0:
                        raise CorruptRecordsError(f"header key length {n} at {pos}")
                    name = bytes(view[pos:pos + n]).decode("utf-8")
                    pos += n
                    n, pos = _long_varint(buf, pos)
                    if n >= 0:
                        pairs.append((name, bytes(view[pos:pos + n])))
                        pos += n
                    else:
                        pairs.append((name, None))
                headers.append(pairs)
                any_headers = True
            if pos != end:
                raise CorruptRecordsError(f"record at {start} holds {pos - start} bytes, its "
                                          f"length says {length}")
            offsets.append(base_offset + od)
            stamps.append(first_timestamp + ts if append_time is None else append_time)
    except IndexError as exc:
        raise CorruptRecordsError(f"record batch ends inside a record at {pos}") from exc
    finally:
        view.release()
    return RecordChunk(offsets[-1] if offsets else base_offset - 1, offsets, stamps, keys,
                       values, headers if any_headers else None)


def _chunk_of_legacy(batch: Any, check_crcs: bool) -> RecordChunk:
    """Message format v0/v1 (one record object per record, kafka-python's own parser; these
    formats carry a CRC per record)."""
    records = list(batch)
    if check_crcs:
        bad = next((r for r in records if not r.validate_crc()), None)
        if bad is not None:
            raise CorruptRecordsError(f"record at offset {bad.offset} failed its crc check")
    return RecordChunk(records[-1].offset if records else -1,
                       [r.offset for r in records], [r.timestamp for r in records],
                       [r.key for r in records], [r.value for r in records], None)


def _batch_chunk(batch: Any) -> RecordChunk:
    """One v2 record batch (already CRC-checked, not a control batch) as a chunk."""
    batch._maybe_uncompress()
    append_time = batch.max_timestamp if batch.timestamp_type == batch.LOG_APPEND_TIME else None
    return decode_records(batch._buffer, batch._pos, batch.records_count, batch.base_offset,
                          batch.first_timestamp, append_time)


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
            while batch is not None:
                last_batch = batch
                if self.check_crcs and not batch.validate_crc():
                    raise CorruptRecordError(f"Record batch for partition {tp} at offset "
                                             f"{batch.base_offset} failed crc check")
                if batch.magic == 2:
                    self.leader_epoch = batch.leader_epoch
                    if (self.isolation_level == read_committed and batch.has_producer_id()
                            and self._skip_aborted(batch)):
                        self.next_fetch_offset = batch.next_offset
                        batch = records.next_batch()
                        continue
                    if batch.is_control_batch:  # transaction markers: not records
                        self.next_fetch_offset = batch.next_offset
                        batch = records.next_batch()
                        continue
                try:
                    chunk = (_batch_chunk(batch) if batch.magic == 2
                             else _chunk_of_legacy(batch, self.check_crcs))
                except CorruptRecordsError as exc:
                    raise CorruptRecordError(f"Record batch for partition {tp} at offset "
                                             f"{batch.base_offset}: {exc}") from None
                chunk = chunk.since(self.fetch_offset)
                if len(chunk):
                    self.records_read += len(chunk)
                    self.next_fetch_offset = chunk.offset + 1
                    yield chunk
                batch = records.next_batch()
            if last_batch is not None and last_batch.magic == 2:
                self.next_fetch_offset = last_batch.next_offset
            self.drain()

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
