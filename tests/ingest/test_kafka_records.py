"""Whole-batch decoding of Kafka records (``ingest.kafka_records``) against kafka-python's own
record-by-record parser, on record batches built by kafka-python's producer-side builder.
(The read path through a broker, with and without it, is in ``test_kafka_source``.)"""

from __future__ import annotations

import random
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.record import MemoryRecords, MemoryRecordsBuilder

from ingest.kafka_records import CorruptRecordsError, RecordChunk, decode_records, use_record_chunks
from ingest.kafka_records import _batch_chunk as batch_chunk
from ingest.kafka_records import _chunk_of_legacy as chunk_of_legacy
from tests.kafka_broker import kafka_bootstrap  # noqa: F401

Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def build(records: list[Record], compression: int = 0, base_offset: int = 0) -> bytes:
    """One v2 record batch holding ``records`` (timestamp, key, value, headers)."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 30,
                                   offset=base_offset)
    for ts, key, value, headers in records:
        assert builder.append(ts, key, value, headers) is not None
    builder.close()
    return bytes(builder.buffer())


def random_records(rng: random.Random, n: int) -> list[Record]:
    out: list[Record] = []
    ts = 1_700_000_000_000
    for _ in range(n):
        ts += rng.choice([0, 1, 1_000, 10**6])  # one- to four-byte timestamp deltas
        key = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 5, 70, 300]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 20, 200, 20_000]))
        headers: list[tuple[str, bytes | None]] = []
        if rng.random() < 0.2:
            headers = [(f"h{j}-ü", None if j == 1 else rng.randbytes(j * 90))
                       for j in range(rng.randint(1, 3))]
        out.append((ts, key, value, headers))
    return out


def kafka_python_parse(data: bytes) -> list[tuple[int, int, Any, Any, list[Any]]]:
    batch = MemoryRecords(data).next_batch()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


def chunk_rows(chunk: RecordChunk) -> list[tuple[int, int, Any, Any, list[Any]]]:
    headers = chunk.headers or [[] for _ in chunk.offsets]
    return list(zip(chunk.offsets, chunk.timestamps, chunk.keys, chunk.values,
                    [list(h) for h in headers], strict=True))


@pytest.mark.parametrize("compression", [0, 1], ids=["none", "gzip"])
@pytest.mark.parametrize("seed", range(4))
def test_batch_decodes_like_kafka_python(seed: int, compression: int) -> None:
    rng = random.Random(seed)
    data = build(random_records(rng, rng.choice([1, 7, 300])), compression,
                 base_offset=rng.choice([0, 5, 123_456]))
    chunk = batch_chunk(MemoryRecords(data).next_batch())
    assert chunk_rows(chunk) == kafka_python_parse(data)
    assert chunk.offset == chunk.offsets[-1]


def test_chunk_without_headers_has_none_and_slices_by_offset() -> None:
    data = build([(1000 + i, b"k%d" % i, b"v%d" % i, []) for i in range(10)], base_offset=100)
    chunk = batch_chunk(MemoryRecords(data).next_batch())
    assert chunk.headers is None
    assert chunk.since(104).offsets == list(range(104, 110))
    assert chunk.before(103).values == [b"v0", b"v1", b"v2"]
    assert chunk.since(104).before(106).keys == [b"k4", b"k5"]
    assert len(chunk.since(200)) == 0


@pytest.mark.parametrize("cut", [1, 20, -3])
def test_truncated_or_damaged_records_raise(cut: int) -> None:
    data = build([(1, b"key", b"value" * 30, [("h", b"x")]) for _ in range(3)])
    batch = MemoryRecords(data).next_batch()
    batch._maybe_uncompress()
    records = bytes(batch._buffer[batch._pos:])
    if cut > 0:  # one record's length claims more bytes than it has
        damaged = bytes([records[0] + 2 * cut]) + records[1:]
    else:  # the batch ends early
        damaged = records[:cut]
    with pytest.raises(CorruptRecordsError):
        decode_records(damaged, 0, 3, 0, 0, None)


@pytest.mark.kafka
def test_use_record_chunks_plugs_into_this_kafka_python(kafka_bootstrap: str) -> None:  # noqa: F811
    """If kafka-python's internals changed, the job would silently run ~3x slower: fail here."""
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None)
    try:
        assert use_record_chunks(consumer)
    finally:
        consumer.close()


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_batch_decodes_like_kafka_python_and_checks_record_crcs(magic: int) -> None:
    builder = MemoryRecordsBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    for i in range(5):
        assert builder.append(1_700_000_000_000 + i if magic else None, b"k%d" % i,
                              None if i == 2 else b"v%d" % i, []) is not None
    builder.close()
    data = bytes(builder.buffer())
    got, expected = [], []
    records, again = MemoryRecords(data), MemoryRecords(data)
    while (batch := records.next_batch()) is not None:  # uncompressed: a batch per record
        chunk = chunk_of_legacy(batch, True)
        got += zip(chunk.offsets, chunk.timestamps, chunk.keys, chunk.values, strict=True)
        expected += [(r.offset, r.timestamp, r.key, r.value) for r in again.next_batch()]
    assert len(got) == 5 and got == expected
    damaged = bytearray(data)
    damaged[data.index(b"v0")] ^= 0xFF  # the first record's value: its CRC no longer matches
    with pytest.raises(CorruptRecordsError, match="crc"):
        chunk_of_legacy(MemoryRecords(bytes(damaged)).next_batch(), True)


def _txn_batch(values: list[bytes], base_offset: int, producer_id: int) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 30,
                                   offset=base_offset, transactional=True,
                                   producer_id=producer_id, producer_epoch=0, base_sequence=0)
    for value in values:
        assert builder.append(1_700_000_000_000, None, value, []) is not None
    builder.close()
    return bytes(builder.buffer())


@pytest.mark.parametrize("chunked", [True, False], ids=["chunks", "kafka-python"])
def test_read_committed_fetch_skips_aborted_transaction_batches(chunked: bool) -> None:
    """A fetch response that lists producer 7's transaction from offset 2 as aborted: under
    read_committed its batch is skipped, the committed ones (producer 5) are kept — by the
    chunk decoder as by kafka-python's own; under read_uncommitted all are kept."""
    from kafka import TopicPartition
    from kafka.consumer.fetcher import Fetcher
    from kafka.protocol.consumer import IsolationLevel
    from kafka.protocol.old.fetch import AbortedTransaction

    from ingest.kafka_records import _chunked_class

    data = (_txn_batch([b"c1", b"c2"], 0, producer_id=5)
            + _txn_batch([b"a1", b"a2"], 2, producer_id=7)
            + _txn_batch([b"c3"], 4, producer_id=5))
    base = Fetcher.PartitionRecords
    cls = _chunked_class(base, IsolationLevel.READ_COMMITTED) if chunked else base

    def values(level: Any) -> list[bytes]:
        records = cls(0, TopicPartition("t", 0), MemoryRecords(data), isolation_level=level,
                      aborted_transactions=[AbortedTransaction(7, 2)])
        out: list[bytes] = []
        for item in records.take():
            out += item.values if isinstance(item, RecordChunk) else [item.value]
        return out

    assert values(IsolationLevel.READ_COMMITTED) == [b"c1", b"c2", b"c3"]
    assert values(IsolationLevel.READ_UNCOMMITTED) == [b"c1", b"c2", b"a1", b"a2", b"c3"]
