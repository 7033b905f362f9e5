"""One shard of the GLOBAL_STATE index: its state-store layout and its in-memory image.

The global index keeps record key → (partition, file group, ordering value) in the streaming
query's RocksDB state. Spark's state API costs 50-100 µs per call (``bench/state_api.py``), so
a state entry per key — a lookup and an update per key and batch — caps tagging below 10,000
keys/s. Instead keys are grouped into a fixed number of *shards* (a hash of the key), the state
operator is entered once per shard and batch, and a shard's state is a handful of blobs:

* ``base`` chunks (Arrow IPC, at most :data:`CHUNK_ROWS` entries each): the shard's entries
  as of some batch;
* ``delta`` blobs: the entries each later batch changed (a removed key as ``present=false``);
* a meta value naming the chunks, the deltas in order and a *token* (a random id) for each.

A batch reads only the meta value and the deltas this Python worker has not seen: every
worker keeps an image of the shards it served (:class:`ShardImage`, sorted 16-byte key
digests plus their locations), tagged with the token of the last blob applied to it. An image
whose token the meta value does not list — the worker served a batch whose state version Spark
then discarded (a failed or replayed batch), or the image belongs to another query — is
rebuilt from the blobs. So the state store stays the one source of truth, versioned with the
micro-batch, and the image is only ever a copy of a committed (or the current) version.

When the deltas hold a quarter of the base's entries (or :data:`MAX_DELTAS` deltas), the
batch folds them: the image is written as the new base and the deltas are removed. Each
entry is then written a bounded number of times, so a batch's state cost is proportional to
the batch, not to the state.

Keys are kept as MD5 digests (16 bytes): at 10^10 keys the chance that two share one is
about 10^-19, far below any storage error rate, and a digest is less than half the bytes of
a typical key.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

__all__ = ["CHUNK_ROWS", "FOLD_MIN_ROWS", "MAX_DELTAS", "Meta", "ShardImage", "base_slot",
           "decode_blob", "delta_slot", "encode_blob", "entries_table", "entry_schema",
           "key_digests", "key_shards", "live_entries_table", "new_token"]

CHUNK_ROWS = 65_536
"""Entries per base chunk blob (about 2.5 MB)."""
MAX_DELTAS = 256
"""Deltas kept before a fold, however small they are (bounds a rebuild's state calls)."""
FOLD_FRACTION = 4
"""Fold when the deltas hold at least 1/FOLD_FRACTION of the base's entries..."""
FOLD_MIN_ROWS = 4_096
"""... and at least this many."""

DIGEST = "digest"
PARTITION = "partition_path"
FILE_ID = "file_id"
ORDERING = "ordering"
PRESENT = "present"

Entry = tuple[str | None, str | None, Any]
"""A key's state: (partition, file id, ordering value); (None, None, o): deleted at ``o``
(event time keeps the ordering value of a deleted key)."""


def new_token() -> str:
    """A fresh blob token (unique across workers, attempts and queries)."""
    return uuid.uuid4().hex


def key_digests(keys: Iterable[str]) -> list[bytes]:
    """The 16-byte MD5 digest of every key's UTF-8 bytes."""
    md5 = hashlib.md5
    return [md5(k.encode()).digest() for k in keys]


SHARD_SEED = 42
_TWO_63, _TWO_64 = 1 << 63, 1 << 64


def key_shards(keys: pa.Array | pa.ChunkedArray, shards: int) -> pa.Array:
    """Every key's shard: Spark's ``pmod(xxhash64(key), shards)`` (XXH64 of the UTF-8
    bytes, seed 42, as a signed long), computed in Python so that a task can group its rows
    (and the bootstrap its keys) by shard before they reach the JVM. Earlier versions
    grouped the bootstrap with Spark's own ``xxhash64``, so a test holds the two equal:
    their checkpoints keep working. Null keys (error rows) get a null shard."""
    digest = xxhash.xxh64_intdigest
    out: list[int | None] = []
    for key in keys.to_pylist():
        if key is None:
            out.append(None)
            continue
        unsigned = digest(key.encode(), SHARD_SEED)
        out.append((unsigned - _TWO_64 if unsigned >= _TWO_63 else unsigned) % shards)
    return pa.array(out, pa.int32())


def entry_schema(ordering_type: pa.DataType) -> pa.Schema:
    """Schema of a blob: one row per key digest."""
    return pa.schema([pa.field(DIGEST, pa.binary(16), nullable=False),
                      pa.field(PARTITION, pa.string()), pa.field(FILE_ID, pa.string()),
                      pa.field(ORDERING, ordering_type),
                      pa.field(PRESENT, pa.bool_(), nullable=False)])


def encode_blob(table: pa.Table) -> bytes:
    """A blob: ``table`` as an Arrow IPC stream (LZ4 buffers; locations repeat a lot)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_blob(data: bytes) -> pa.Table:
    """The table of a blob written by :func:`encode_blob`."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


@dataclass
class Meta:
    """A shard's meta value: its base chunks and deltas, each blob with its token."""

    base_token: str | None = None
    base_chunks: int = 0
    base_rows: int = 0
    next_delta: int = 0
    deltas: list[tuple[int, str, int]] = field(default_factory=list)
    """(sequence number, token, entries) of each delta, oldest first."""

    @property
    def token(self) -> str | None:
        """The token of the state's newest blob: an image with it is up to date."""
        return self.deltas[-1][1] if self.deltas else self.base_token

    @property
    def delta_rows(self) -> int:
        return sum(rows for _, _, rows in self.deltas)

    def due_for_fold(self, min_rows: int = FOLD_MIN_ROWS, max_deltas: int = MAX_DELTAS) -> bool:
        """Whether the deltas are to be folded into a new base (see the module doc)."""
        rows = self.delta_rows
        return bool(self.deltas) and (
            len(self.deltas) >= max_deltas
            or (rows >= min_rows and rows * FOLD_FRACTION >= self.base_rows))

    def to_row(self) -> tuple[Any, ...]:
        deltas = ";".join(f"{seq}:{token}:{rows}" for seq, token, rows in self.deltas)
        return (self.base_token, self.base_chunks, self.base_rows, self.next_delta, deltas)

    @classmethod
    def from_row(cls, row: Sequence[Any] | None) -> Meta:
        if row is None:
            return cls()
        deltas = []
        for item in str(row[4] or "").split(";"):
            if item:
                seq, token, rows = item.split(":")
                deltas.append((int(seq), token, int(rows)))
        return cls(row[0], int(row[1]), int(row[2]), int(row[3]), deltas)


def base_slot(chunk: int) -> int:
    """The blob map's key of base chunk ``chunk``."""
    return chunk


def delta_slot(seq: int) -> int:
    """The blob map's key of delta ``seq`` (negative: never a base chunk's)."""
    return -1 - seq


_UNKNOWN = object()


class ShardImage:
    """A shard's entries in memory: sorted digests with their rows, plus recent changes.

    ``token`` is the token of the last blob applied (None: empty and never written).
    Changes are added as tables (later ones win); they are merged into the sorted arrays when
    they grow past a sixteenth of them (or 8,192), else looked up through a dict.
    """

    def __init__(self, ordering_type: pa.DataType) -> None:
        self.schema = entry_schema(ordering_type)
        self.token: str | None = None
        self._digests = np.empty(0, dtype="S16")
        self._rows = self.schema.empty_table()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._recent: dict[bytes, Entry | None] = {}

    def __len__(self) -> int:
        """Keys in the shard (merges what is pending)."""
        self._merge()
        return len(self._digests)

    @property
    def nbytes(self) -> int:
        """Memory held by the sorted arrays (the dict of recent changes not counted)."""
        return int(self._digests.nbytes) + self._rows.nbytes

    def add(self, changes: pa.Table) -> None:
        """Apply a blob's entries (later tables and rows win; ``present=false`` removes)."""
        if changes.num_rows:
            self._pending.append(changes.select(self.schema.names).cast(self.schema))
            self._pending_rows += changes.num_rows

    def lookup(self, digests: Sequence[bytes]) -> list[Entry | None]:
        """The entry of every digest (None: the shard does not know the key)."""
        self._settle()
        n = len(digests)
        if n == 0:
            return []
        out: list[Any]
        need: list[int] | None = None  # None: every digest is looked up in the arrays
        if self._recent:
            out = [self._recent.get(d, _UNKNOWN) for d in digests]
            need = [i for i, e in enumerate(out) if e is _UNKNOWN]
            for i in need:
                out[i] = None
        else:
            out = [None] * n
        if not len(self._digests) or need == []:
            return out
        wanted = np.array(digests if need is None else [digests[i] for i in need], dtype="S16")
        pos = np.minimum(np.searchsorted(self._digests, wanted), len(self._digests) - 1)
        hit = self._digests[pos] == wanted
        if not hit.any():
            return out
        found = self._rows.take(pa.array(pos[hit]))
        at = np.flatnonzero(hit) if need is None else np.asarray(need)[hit]
        for i, entry in zip(at.tolist(), zip(_values(found.column(PARTITION)),
                                             _values(found.column(FILE_ID)),
                                             found.column(ORDERING).to_pylist(), strict=True),
                            strict=True):
            out[i] = entry
        return out

    def snapshot(self) -> pa.Table:
        """Every live entry, sorted by digest (what a fold writes as the new base)."""
        self._merge()
        return self._rows.cast(self.schema)

    def _settle(self) -> None:
        """Make pending changes visible: into the dict if few, else merged into the arrays."""
        if not self._pending:
            return
        if self._pending_rows + len(self._recent) > max(8_192, len(self._digests) // 16):
            self._merge()
            return
        for table in self._pending:
            digests = table.column(DIGEST).to_pylist()
            parts = table.column(PARTITION).to_pylist()
            fids = table.column(FILE_ID).to_pylist()
            ords = table.column(ORDERING).to_pylist()
            present = table.column(PRESENT).to_pylist()
            for d, p, f, o, keep in zip(digests, parts, fids, ords, present, strict=True):
                self._recent[d] = (p, f, o) if keep else None
        self._pending, self._pending_rows = [], 0

    def _merge(self) -> None:
        """Fold the dict and the pending tables into the sorted arrays (later rows win)."""
        parts = [self._rows.cast(self.schema)]  # locations dictionary-encoded in memory
        if self._recent:
            items = list(self._recent.items())
            parts.append(pa.table({
                DIGEST: pa.array([d for d, _ in items], pa.binary(16)),
                PARTITION: pa.array([e[0] if e else None for _, e in items], pa.string()),
                FILE_ID: pa.array([e[1] if e else None for _, e in items], pa.string()),
                ORDERING: pa.array([e[2] if e else None for _, e in items],
                                   self.schema.field(ORDERING).type),
                PRESENT: pa.array([e is not None for _, e in items], pa.bool_()),
            }, schema=self.schema))
        parts.extend(self._pending)
        self._recent, self._pending, self._pending_rows = {}, [], 0
        if len(parts) == 1:
            return
        merged = pa.concat_tables(parts).combine_chunks()
        digests = _digest_array(merged)
        order = np.argsort(digests, kind="stable")
        digests = digests[order]
        # later rows win: keep the last of every run of equal digests
        last = np.ones(len(digests), dtype=bool)
        if len(digests) > 1:
            last[:-1] = digests[:-1] != digests[1:]
        present = np.asarray(merged.column(PRESENT).to_numpy(zero_copy_only=False), dtype=bool)
        keep = last & present[order]
        rows = merged.take(pa.array(order[keep]))
        for name in (PARTITION, FILE_ID):  # few distinct values: 4 bytes a key, not ~40
            i = rows.schema.get_field_index(name)
            rows = rows.set_column(i, name, rows.column(i).dictionary_encode().combine_chunks())
        self._rows = rows
        self._digests = digests[keep]


def _values(column: pa.ChunkedArray) -> list[Any]:
    """A column's Python values; a dictionary column decoded through its few distinct values
    (pyarrow's ``to_pylist`` takes ~1.5 µs a value there, ~20x this)."""
    array = column.combine_chunks()
    if not pa.types.is_dictionary(array.type):
        return array.to_pylist()
    distinct = np.array([*array.dictionary.to_pylist(), None], dtype=object)
    indices = pc.fill_null(array.indices, len(distinct) - 1)
    return distinct[indices.to_numpy(zero_copy_only=False)].tolist()


def _digest_array(table: pa.Table) -> np.ndarray:
    """The digest column as a numpy ``S16`` array (zero-copy from the Arrow buffer)."""
    column = table.column(DIGEST)
    array = column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks)
    if len(array) == 0:
        return np.empty(0, dtype="S16")
    data = array.buffers()[1]
    start = array.offset * 16
    return np.frombuffer(data, dtype="S16", count=len(array), offset=start)


def live_entries_table(schema: pa.Schema, keys: pa.Array | pa.ChunkedArray,
                       partitions: pa.Array | pa.ChunkedArray,
                       file_ids: pa.Array | pa.ChunkedArray,
                       orderings: pa.Array | pa.ChunkedArray) -> pa.Table:
    """A blob table of live keys from columns (the bootstrap's keys; :func:`entries_table`
    takes a batch's changes one by one)."""
    return pa.table({
        DIGEST: pa.array(key_digests(keys.to_pylist()), pa.binary(16)),
        PARTITION: partitions, FILE_ID: file_ids,
        ORDERING: orderings.cast(schema.field(ORDERING).type),
        PRESENT: pa.array(np.ones(len(keys), dtype=bool)),
    }, schema=schema)


def entries_table(schema: pa.Schema, digests: Sequence[bytes],
                  entries: Sequence[Entry | None]) -> pa.Table:
    """A blob table from digests and their entries (None: the key was removed)."""
    return pa.table({
        DIGEST: pa.array(digests, pa.binary(16)),
        PARTITION: pa.array([e[0] if e else None for e in entries], pa.string()),
        FILE_ID: pa.array([e[1] if e else None for e in entries], pa.string()),
        ORDERING: pa.array([e[2] if e else None for e in entries], schema.field(ORDERING).type),
        PRESENT: pa.array([e is not None for e in entries], pa.bool_()),
    }, schema=schema)
