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
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401

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
    headers = ([[] for _ in chunk.offsets] if chunk.headers is None else
               [[(h["key"], h["value"]) for h in row or []] for row in chunk.headers.to_pylist()])
    return list(zip(chunk.offsets.tolist(), chunk.timestamps.tolist(), chunk.keys.to_pylist(),
                    chunk.values.to_pylist(), headers, strict=True))


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
    assert chunk.since(104).offsets.tolist() == list(range(104, 110))
    assert chunk.before(103).values.to_pylist() == [b"v0", b"v1", b"v2"]
    assert chunk.since(104).before(106).keys.to_pylist() == [b"k4", b"k5"]
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
        got += [row[:4] for row in chunk_rows(chunk)]
        expected += [(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value)
                     for r in again.next_batch()]
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
            out += item.values.to_pylist() if isinstance(item, RecordChunk) else [item.value]
        return out

    assert values(IsolationLevel.READ_COMMITTED) == [b"c1", b"c2", b"c3"]
    assert values(IsolationLevel.READ_UNCOMMITTED) == [b"c1", b"c2", b"a1", b"a2", b"c3"]


def _codecs() -> list[Any]:
    """Every compression codec (kafka-python's attribute value), skipped where its library is
    not installed here (the decoder sees the uncompressed records either way)."""
    from kafka import codec

    have = {1: codec.has_gzip(), 2: codec.has_snappy(), 3: codec.has_lz4(), 4: codec.has_zstd()}
    names = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
    return [pytest.param(c, id=names[c], marks=() if c == 0 or have[c] else pytest.mark.skip(
        reason=f"{names[c]} not installed")) for c in names]


def hostile_records(rng: random.Random, n: int) -> list[Record]:
    """Records of every shape a batch can hold: null and empty keys and values, lengths whose
    varints take one to four bytes, timestamps before and after the batch's first (negative
    and ten-byte deltas), headers on some records only (null and empty values, non-ASCII
    names), all mixed within one batch."""
    out: list[Record] = []
    for _ in range(n):
        ts = rng.choice([1_700_000_000_000, 0, 1, 2**62, 1_700_000_000_000 - 10**9,
                         1_700_000_000_000 + rng.randrange(10**7)])
        sizes = [0, 1, 63, 64, 127, 8_191, 8_192, 70_000]
        key = None if rng.random() < 0.2 else rng.randbytes(rng.choice(sizes[:6]))
        value = None if rng.random() < 0.2 else rng.randbytes(rng.choice(sizes))
        headers: list[tuple[str, bytes | None]] = []
        if rng.random() < 0.3:
            headers = [(rng.choice(["", "h", "ü" * 40, "trace-id"]),
                        rng.choice([None, b"", rng.randbytes(rng.choice([1, 200]))]))
                       for _ in range(rng.choice([1, 2, 70]))]
        out.append((ts, key, value, headers))
    return out


@pytest.mark.parametrize("compression", _codecs())
@pytest.mark.parametrize("seed", range(12))
def test_hostile_batches_decode_like_kafka_python(seed: int, compression: int) -> None:
    rng = random.Random(1000 + seed)
    records = hostile_records(rng, rng.choice([1, 2, 13, 200]))
    data = build(records, compression)
    base = rng.choice([0, 1, 2**40])  # the builder writes it as a 32-bit delta: patch it in
    data = base.to_bytes(8, "big") + data[8:]  # (not under the CRC)
    chunk = batch_chunk(MemoryRecords(data).next_batch())
    assert chunk_rows(chunk) == kafka_python_parse(data)
    assert chunk.offset == chunk.offsets[-1]
    assert (chunk.headers is None) == all(not r[3] for r in records)


def _with_log_append_time(data: bytes, max_timestamp: int) -> bytes:
    """``data``'s batch turned into a log-append-time batch (as a broker rewrites it under
    ``message.timestamp.type=LogAppendTime``), its CRC made right again."""
    from kafka.record.util import calc_crc32c

    out = bytearray(data)
    out[22] |= 0x08  # attributes (int16 at 21): timestamp type bit
    out[35:43] = max_timestamp.to_bytes(8, "big", signed=True)  # max timestamp
    out[17:21] = calc_crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def test_log_append_time_batch_gives_every_record_the_batch_time() -> None:
    data = _with_log_append_time(build(hostile_records(random.Random(5), 30)), 1_234_567)
    batch = MemoryRecords(data).next_batch()
    assert batch.validate_crc() and batch.timestamp_type == 1
    chunk = batch_chunk(batch)
    assert chunk.timestamps.tolist() == [1_234_567] * 30
    assert chunk_rows(chunk) == kafka_python_parse(data)


@pytest.mark.parametrize("seed", range(40))
def test_damaged_records_raise_or_decode_like_kafka_python(seed: int) -> None:
    """Bytes of a batch's records changed at random: the decoder raises
    CorruptRecordsError (nothing else) or returns what kafka-python parses from them."""
    rng = random.Random(seed)
    records = hostile_records(rng, 8)
    batch = MemoryRecords(build(records)).next_batch()
    batch._maybe_uncompress()
    raw = bytearray(batch._buffer[batch._pos:])
    for _ in range(rng.choice([1, 2, 5])):
        raw[rng.randrange(len(raw))] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF,
                                                   rng.randrange(256)])
    try:
        expected = [(r.offset, r.timestamp, r.key, r.value, list(r.headers))
                    for r in _parse_records(bytes(batch._buffer[:batch._pos]) + bytes(raw))]
    except Exception:
        expected = None
    try:
        got = chunk_rows(decode_records(bytes(raw), 0, len(records), batch.base_offset,
                                        batch.first_timestamp, None))
    except CorruptRecordsError:
        got = None
    if got is not None:
        assert got == expected


def _parse_records(data: bytes) -> list[Any]:
    from kafka.record.default_records import DefaultRecordBatch

    return list(DefaultRecordBatch(data))


def _send_hostile(bootstrap: str, topic: str, rng: random.Random) -> int:
    """Produce :func:`hostile_records` to partition 0 of ``topic`` through the broker: plain
    and gzip producers, single records and lingering batches, and two committed transactions
    (their markers are control batches in the log). Returns the records sent."""
    from kafka import KafkaProducer

    sent = 0
    for settings in ({"linger_ms": 0}, {"linger_ms": 50, "batch_size": 1 << 20},
                     {"linger_ms": 50, "batch_size": 1 << 20, "compression_type": "gzip"},
                     {"transactional_id": unique_topic("txn")}):
        producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=16 << 20,
                                 **settings)
        try:
            for _round in range(2 if "transactional_id" in settings else 1):
                if "transactional_id" in settings:
                    if not _round:
                        producer.init_transactions()
                    producer.begin_transaction()
                for ts, key, value, headers in hostile_records(rng, 60):
                    # kafka-python's producer takes no null header value nor a record
                    # without key and value (the batch tests above cover both)
                    producer.send(topic, value, b"" if key is value is None else key,
                                  [(k, v or b"") for k, v in headers] or None, 0,
                                  max(ts, 0) % (2**41))
                    sent += 1
                if "transactional_id" in settings:
                    producer.commit_transaction()
            producer.flush()
        finally:
            producer.close()
    return sent


@pytest.mark.kafka
def test_broker_fetched_hostile_records_read_like_kafka_python(
        kafka_bootstrap: str) -> None:  # noqa: F811
    """Every record shape, fetched from the broker: the read task with whole-batch decoding
    (fastDecode=true) returns the same Arrow rows as with kafka-python's own record parsing
    (fastDecode=false), over the whole topic and over a range cut inside batches."""
    from ingest.kafka_options import KafkaSourceOptions
    from ingest.kafka_read import KafkaInputPartition, read_range

    topic = unique_topic("hostile")
    from ingest.kafka_produce import create_topic

    create_topic(kafka_bootstrap, topic, 1)
    sent = _send_hostile(kafka_bootstrap, topic, random.Random(3))

    def rows(fast: str, start: int, end: int) -> list[dict[str, Any]]:
        options = KafkaSourceOptions.from_options({
            "kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
            "fastDecode": fast})
        return [row for batch in read_range(options, KafkaInputPartition(topic, 0, start, end))
                for row in batch.to_pylist()]

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        end = consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()
    whole = rows("true", 0, end)
    assert len(whole) == sent  # every record, no transaction marker
    assert whole == rows("false", 0, end)
    assert rows("true", 37, end - 5) == rows("false", 37, end - 5)
    assert any(r["headers"] for r in whole) and any(r["key"] is None for r in whole)


@pytest.mark.parametrize("seed", range(6))
def test_consecutive_batches_decode_together_like_kafka_python(seed: int) -> None:
    """The batches of one fetch are decoded as one chunk: batches of every shape (one with
    log-append time, compressed ones, base offsets far apart), each record with its own
    batch's offset and timestamp base."""
    rng = random.Random(50 + seed)
    data = b""
    for i in range(rng.choice([2, 5, 9])):
        one = build(hostile_records(rng, rng.choice([1, 3, 40])), rng.choice([0, 1]))
        if i == 1:
            one = _with_log_append_time(one, 1_700_000_000_123)
        data += (1_000 * i + rng.randrange(3)).to_bytes(8, "big") + one[8:]
    batches, expected = [], []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        batches.append(batch)
        expected += [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    fresh = MemoryRecords(data)
    chunk = batch_chunk(*iter(fresh.next_batch, None))
    assert chunk_rows(chunk) == expected
