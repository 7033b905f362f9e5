"""Which bad records of a micro-batch a later record of the same key superseded.

A record the sink routes to the error table (:mod:`ingest.error_table`) may have a later
record of the same key in its own micro-batch that the sink did write. Without an ordering
field (commit-time ordering) that later record is the key's newer version, and a replay of
the bad record must not overwrite it (:mod:`ingest.replay`); with one, it decides a tie of
ordering values the same way (Hudi's merge gives a tie to the later-arriving record,
``DefaultHoodieRecordPayload``). The Kafka order within a batch is not recorded anywhere
else — the table keeps no offsets per row — so the prepare step records it on the error row
itself: :data:`ingest.rows.SUPERSEDED` (the error table's ``superseded_key`` column) is the
record key of a later record of the same batch that was written (upsert or delete), null when
there was none or the record's key could not be told.

A bad record's key is told, as far as it can be, from its value (when the value decoded and
the key fields are there: a partition value that cannot be stored, a null ordering value)
or else from its Kafka key, read as a tombstone's key is (:attr:`PrepareSpec.key_decoder
<ingest.prepare.PrepareSpec.key_decoder>`); the replay trusts the column only when it equals
the record key the value decodes to then. "Later" is the sink's arrival order (topic, Kafka
partition, offset; :func:`ingest.resolve.arrival_order`), among the records prepared
together: the records of one Kafka partition read by one task, up to the source's batch of
10,000 records — a later record outside those (another Kafka partition, the next 10,000) is
not seen, and the row then reads null (docs/ingest.md, "Replaying the error table").
Executor side; a pure function of its input, so a replayed batch records the same keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import TableConfig
from engine.errors import InvalidRecordError
from engine.layout.incoming import record_keys
from ingest.decode import DecoderError

__all__ = ["later_written", "superseded_keys", "value_keys"]

KafkaKeys = Callable[[list[bytes], list[int]],
                     Sequence[tuple[int, str | None, str | None, str | None]]]
"""How Kafka keys become record keys, as a tombstone's do: (raw keys, their rows) → (row,
record key, partition, reason it cannot) per row (``ingest.prepare._tombstone_keys``)."""


def superseded_keys(coordinates: pa.Table, data: pa.Table, config: TableConfig,
                    error: np.ndarray, written: np.ndarray, keys: pa.Array,
                    kafka_keys: pa.Array, kafka_key_of: KafkaKeys) -> pa.Array:
    """The ``superseded_key`` of each prepared row (null for every row but the ``error``
    ones a later ``written`` row of the same key follows): an error row's key from its
    decoded value (:func:`value_keys`), else the row's record key (a tombstone whose
    partition is unknown), else its Kafka key through ``kafka_key_of``; ``keys``: the record
    keys of the rows, ``coordinates``: topic, Kafka partition, offset."""
    rows = np.flatnonzero(error)
    if not len(rows) or not written.any():
        return pa.nulls(len(error), pa.string())
    known = keys.to_pylist()
    hints = value_keys(data, rows, config)
    hints.update({int(r): known[r] for r in rows if int(r) not in hints and known[r]})
    raw = kafka_keys.to_pylist()
    rest = [int(r) for r in rows if int(r) not in hints and raw[r]]
    try:
        mapped = kafka_key_of([raw[r] for r in rest], rest) if rest else []
    except DecoderError:  # a key decoder's bug fails the tombstones, not these hints
        mapped = []
    hints.update({row: key for row, key, _, reason in mapped if reason is None and key})
    return later_written(coordinates, written, known, hints)


def value_keys(data: pa.Table, rows: np.ndarray, config: TableConfig) -> dict[int, str]:
    """The record keys of those ``rows`` of ``data`` (decoded values, nulls where a value
    did not decode) whose key fields are all present: row → key."""
    if not len(rows):
        return {}
    fields = config.record_key_fields
    if any(f not in data.column_names for f in fields):
        return {}
    picked = data.take(pa.array(rows, pa.int64())).select(list(fields))
    present = np.ones(len(rows), dtype=bool)
    for name in fields:
        col = picked.column(name).combine_chunks()
        missing = pc.is_null(col)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            missing = pc.or_(missing, pc.fill_null(pc.equal(pc.utf8_length(col), 0), False))
        present &= ~missing.to_numpy(zero_copy_only=False)
    if not present.any():
        return {}
    try:
        keys = record_keys(picked.filter(pa.array(present)), config).to_pylist()
    except InvalidRecordError:  # a key value the key generator refuses: not told
        return {}
    return {int(row): str(key) for row, key in zip(rows[present].tolist(), keys, strict=True)}


def later_written(coordinates: pa.Table, written: np.ndarray, keys: list[str | None],
                  hints: Mapping[int, str]) -> pa.Array:
    """Per row: the key ``hints[row]`` when a row after it in arrival order (``coordinates``:
    topic, Kafka partition and offset columns, in that order) is ``written`` with that key
    (``keys``), else null."""
    n = len(written)
    out: list[str | None] = [None] * n
    if not hints or not written.any():
        return pa.array(out, pa.string())
    order = pc.sort_indices(coordinates, sort_keys=[
        (name, "ascending") for name in coordinates.column_names]).to_numpy()
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    last: dict[str, int] = {}
    for row in np.flatnonzero(written).tolist():
        key = keys[row]
        if key is not None and rank[row] > last.get(key, -1):
            last[key] = int(rank[row])
    for row, key in hints.items():
        if last.get(key, -1) > rank[row]:
            out[row] = key
    return pa.array(out, pa.string())
