"""Which bad records of a micro-batch a later record of the same key superseded.

A record the sink routes to the error table (:mod:`ingest.error_table`) may have a later
record of the same key in its own micro-batch that the sink did write. Without an ordering
field (commit-time ordering) that later record is the key's newer version, and a replay of
the bad record must not overwrite it (:mod:`ingest.replay`); with one, it decides a tie of
ordering values the same way (Hudi's merge gives a tie to the later-arriving record,
``DefaultHoodieRecordPayload``). The Kafka order within a batch is not recorded anywhere
else — the table keeps no offsets per row — so the prepare step records it on the error row
itself: :data:`ingest.prepare.SUPERSEDED` (the error table's ``superseded_key`` column) is the
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

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import TableConfig
from engine.errors import InvalidRecordError
from engine.layout.keygen import record_keys

__all__ = ["later_written", "value_keys"]


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
