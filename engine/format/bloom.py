"""Hudi bloom filters (``SIMPLE`` and ``DYNAMIC_V0``), bit for bit as Java writes them.

A base file's footer carries a bloom filter of its record keys (Java
``HoodieBloomFilterWriteSupport``); Java's BLOOM index reads it to skip files that cannot hold a
key. This module builds, serializes, deserializes and queries those filters so that the Base64
string equals what ``HoodieDynamicBoundedBloomFilter`` / ``SimpleBloomFilter`` write for the same
keys added in the same order.

Facts the code relies on (``org.apache.hudi.common.bloom``):

* a key is hashed as its UTF-8 bytes with Hadoop's MurmurHash (MurmurHash2, 32 bit, tail
  bytes sign-extended); ``nbHash`` positions are chained: ``seed_0 = 0``,
  ``seed_{i+1} = murmur(key, seed_i)``, ``pos_i = abs(seed_{i+1} % vectorSize)`` (Java ``%``);
* sizes: ``bitSize = ceil(n * -ln(fpp) / ln(2)^2)``, ``nbHash = ceil(ln(2) * bitSize / n)``;
* ``SIMPLE`` is one bit vector; ``DYNAMIC_V0`` is a matrix of bit vectors of ``nr`` keys each
  that grows a row when the last one holds ``nr`` keys, until ``rows * nr >= maxEntries``;
  after that keys go to rows round robin (``InternalDynamicBloomFilter.add``);
* layout, all big-endian: ``int -1, int nbHash, byte hashType, int vectorSize``, then for
  ``DYNAMIC_V0`` ``int nr, int currentNbRecord, int rows`` followed by each row (same header
  plus the bits), bits packed LSB first, ``ceil(vectorSize / 8)`` bytes per vector.

Hashing is vectorized with numpy over all keys of a batch; :func:`hadoop_murmur2` is the
scalar form, used for single-key queries.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pyarrow as pa

DEFAULT_NUM_ENTRIES = 60_000
"""``hoodie.index.bloom.num_entries`` default: keys per filter row."""
DEFAULT_FPP = 1e-9
"""``hoodie.index.bloom.fpp`` default: target false positive probability."""
DEFAULT_MAX_ENTRIES = 100_000
"""``hoodie.bloom.index.filter.dynamic.max.entries`` default (not serialized)."""

HASH_TYPE_JENKINS = 0
HASH_TYPE_MURMUR = 1

_VERSION_MARKER = -1
_HEADER = struct.Struct(">iibi")  # version marker, nbHash, hashType, vectorSize
_DYNAMIC = struct.Struct(">iii")  # nr, currentNbRecord, matrix length
_MASK32 = 0xFFFFFFFF
_M = 0x5BD1E995
_M32 = np.uint32(_M)


class BloomFilterTypeCode(str, Enum):
    """Filter kinds, as named in the ``hoodie_bloom_filter_type_code`` footer value."""

    SIMPLE = "SIMPLE"
    DYNAMIC_V0 = "DYNAMIC_V0"


def hadoop_murmur2(data: bytes, seed: int) -> int:
    """Hadoop ``MurmurHash.hash(data, seed)``: MurmurHash2 of ``data``, as a signed 32-bit int.

    ``seed`` is taken modulo 2**32 (a Java ``int``). Tail bytes are sign-extended like
    Java ``byte`` values, which matters for non-ASCII keys.
    """
    length = len(data)
    h = (seed ^ length) & _MASK32
    body = length & ~3
    for (k,) in struct.iter_unpack("<I", data[:body]):
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length - body
    if tail:
        if tail >= 3:
            h ^= (_sign_extend(data[length - 3]) << 16) & _MASK32
        if tail >= 2:
            h ^= (_sign_extend(data[length - 2]) << 8) & _MASK32
        h ^= _sign_extend(data[length - 1]) & _MASK32
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _sign_extend(byte: int) -> int:
    return byte - 256 if byte >= 128 else byte


def bit_size(num_entries: int, fpp: float) -> int:
    """Bits per filter row for ``num_entries`` keys at ``fpp`` (``BloomFilterUtils``)."""
    log2_squared = math.log(2) * math.log(2)
    return math.ceil(num_entries * (-math.log(fpp) / log2_squared))


def num_hashes(bits: int, num_entries: int) -> int:
    """Hash functions per key for a row of ``bits`` bits (``BloomFilterUtils``)."""
    return math.ceil(math.log(2) * bits / num_entries)


class BloomFilter:
    """A Hudi bloom filter of record keys, ``SIMPLE`` or ``DYNAMIC_V0``.

    Build one with :meth:`create`, read one with :meth:`deserialize`. Adding keys mutates
    the filter; the serialized form (:meth:`serialize`) equals Java's for the same keys
    added in the same order. Only the Murmur hash type (the one Hudi writes) can be
    queried or extended. Instances are not thread-safe.
    """

    def __init__(
        self,
        type_code: BloomFilterTypeCode,
        vector_size: int,
        nb_hash: int,
        rows: np.ndarray,
        *,
        hash_type: int = HASH_TYPE_MURMUR,
        num_entries: int = 0,
        max_entries: int = 0,
        current_nb_record: int = 0,
    ) -> None:
        """Low-level constructor; ``rows`` is a C-contiguous bool array (rows, vector_size).

        ``num_entries`` (Java ``nr``), ``max_entries`` and ``current_nb_record`` only matter
        for ``DYNAMIC_V0``. Prefer :meth:`create` or :meth:`deserialize`.
        """
        if vector_size <= 0 or nb_hash <= 0:
            raise ValueError(
                f"vector_size and nb_hash must be positive, got {vector_size}, {nb_hash}")
        if rows.dtype != np.bool_ or rows.ndim != 2 or rows.shape[1] != vector_size:
            raise ValueError(f"rows must be a bool array of shape (n, {vector_size})")
        if rows.shape[0] < 1:
            raise ValueError("a bloom filter needs at least one row")
        if type_code is BloomFilterTypeCode.SIMPLE and rows.shape[0] != 1:
            raise ValueError("a SIMPLE bloom filter has exactly one row")
        self._type_code = type_code
        self._vector_size = vector_size
        self._nb_hash = nb_hash
        self._hash_type = hash_type
        self._rows = np.ascontiguousarray(rows)
        self._nr = num_entries
        self._max_nr = max_entries
        self._current_nb_record = current_nb_record
        # Java keeps these two in memory only; a deserialized filter starts without them.
        self._reached_max = False
        self._cur_matrix_index = 0

    @classmethod
    def create(
        cls,
        num_entries: int = DEFAULT_NUM_ENTRIES,
        fpp: float = DEFAULT_FPP,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        dynamic: bool = True,
    ) -> BloomFilter:
        """An empty filter sized like ``BloomFilterFactory.createBloomFilter``.

        ``dynamic=True`` gives ``DYNAMIC_V0`` (Hudi's default) with rows of ``num_entries``
        keys, growing up to ``max_entries``; ``dynamic=False`` gives ``SIMPLE``.
        """
        if num_entries <= 0:
            raise ValueError(f"num_entries must be positive, got {num_entries}")
        if not 0.0 < fpp < 1.0:
            raise ValueError(f"fpp must be in (0, 1), got {fpp}")
        if dynamic and max_entries <= 0:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        bits = bit_size(num_entries, fpp)
        if bits >= 2**31:
            raise ValueError(f"filter of {bits} bits exceeds Java's int range")
        type_code = BloomFilterTypeCode.DYNAMIC_V0 if dynamic else BloomFilterTypeCode.SIMPLE
        return cls(
            type_code,
            bits,
            num_hashes(bits, num_entries),
            np.zeros((1, bits), dtype=np.bool_),
            num_entries=num_entries if dynamic else 0,
            max_entries=max_entries if dynamic else 0,
        )

    @property
    def type_code(self) -> BloomFilterTypeCode:
        """``SIMPLE`` or ``DYNAMIC_V0``."""
        return self._type_code

    @property
    def vector_size(self) -> int:
        """Bits per row."""
        return self._vector_size

    @property
    def nb_hash(self) -> int:
        """Hash positions per key."""
        return self._nb_hash

    @property
    def num_rows(self) -> int:
        """Rows (bit vectors); always 1 for ``SIMPLE``."""
        return int(self._rows.shape[0])

    @property
    def hash_type(self) -> int:
        """``HASH_TYPE_MURMUR`` (what Hudi writes) or ``HASH_TYPE_JENKINS``."""
        return self._hash_type

    @property
    def num_entries(self) -> int:
        """``DYNAMIC_V0``: keys per row (Java's ``nr``, what the row was sized for); 0 for
        ``SIMPLE``."""
        return self._nr

    @property
    def current_nb_record(self) -> int:
        """``DYNAMIC_V0``: keys added since the last row was started (Java's counter)."""
        return self._current_nb_record

    def grow_up_to(self, max_entries: int) -> None:
        """Let a ``DYNAMIC_V0`` filter add rows until ``rows * num_entries >= max_entries``
        (the limit is not serialized: a deserialized filter starts without one)."""
        self._max_nr = max_entries

    def bit_count(self) -> int:
        """Number of set bits over all rows."""
        return int(np.count_nonzero(self._rows))

    def add(self, key: str) -> None:
        """Add one record key (its UTF-8 bytes); ``ValueError`` if it is empty."""
        self.add_many([key])

    def add_many(self, keys: Iterable[str] | pa.Array | pa.ChunkedArray) -> None:
        """Add keys in order, as Java's ``add`` called once per key would.

        ``keys`` may be a pyarrow string array (fastest) or any iterable of ``str``.
        Null or empty keys raise ``ValueError`` and leave the filter unchanged.
        """
        self._require_murmur()
        offsets, data = _utf8_buffers(keys)
        n = len(offsets) - 1
        if n == 0:
            return
        row_of_key = self._assign_rows(n)
        first = int(row_of_key[0])
        if bool((row_of_key == first).all()):  # the common case: every key in one row
            row = self._rows[first]
            for positions in _hash_positions(offsets, data, self._nb_hash, self._vector_size):
                row[positions] = True
            return
        flat = self._rows.reshape(-1)
        base = row_of_key * self._vector_size
        for positions in _hash_positions(offsets, data, self._nb_hash, self._vector_size):
            flat[base + positions] = True

    def might_contain(self, key: str) -> bool:
        """False if ``key`` was certainly never added; True if it may have been."""
        self._require_murmur()
        data = _encode_key(key)
        if not data:
            raise ValueError("record key must not be empty")
        positions = []
        seed = 0
        for _ in range(self._nb_hash):
            seed = hadoop_murmur2(data, seed)
            positions.append(abs(seed) % self._vector_size)
        return bool(self._rows[:, positions].all(axis=1).any())

    def might_contain_many(self, keys: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
        """:meth:`might_contain` for many keys at once: a bool array in input order."""
        self._require_murmur()
        offsets, data = _utf8_buffers(keys)
        n = len(offsets) - 1
        hit = np.ones((self.num_rows, n), dtype=np.bool_)
        for positions in _hash_positions(offsets, data, self._nb_hash, self._vector_size):
            for row, row_hit in zip(self._rows, hit, strict=True):
                row_hit &= row.take(positions)
        return np.asarray(hit.any(axis=0))

    def serialize(self) -> str:
        """Base64 (standard alphabet, padded) of Java's ``write`` output: the footer value."""
        return base64.b64encode(self.to_bytes()).decode("ascii")

    def to_bytes(self) -> bytes:
        """The serialized bytes before Base64."""
        header = _HEADER.pack(_VERSION_MARKER, self._nb_hash, self._hash_type, self._vector_size)
        packed = np.packbits(self._rows, axis=1, bitorder="little")
        if self._type_code is BloomFilterTypeCode.SIMPLE:
            return header + packed[0].tobytes()
        parts = [header, _DYNAMIC.pack(self._nr, self._current_nb_record, self.num_rows)]
        for row in packed:
            parts.append(header)
            parts.append(row.tobytes())
        return b"".join(parts)

    @classmethod
    def deserialize(
        cls, s: str, type_code: str | None, *, max_entries: int = 0
    ) -> BloomFilter:
        """Read a footer value; ``type_code`` None (footer key absent) means ``SIMPLE``.

        ``max_entries`` is not serialized; like Java, a deserialized ``DYNAMIC_V0`` filter
        has 0 unless given, which only matters if more keys are added to it.
        Malformed input raises ``ValueError``.
        """
        try:
            code = BloomFilterTypeCode(type_code or BloomFilterTypeCode.SIMPLE.value)
        except ValueError:
            raise ValueError(f"unknown bloom filter type code {type_code!r}") from None
        try:
            raw = base64.b64decode(s, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"bloom filter is not valid Base64: {exc}") from None
        return cls.from_bytes(raw, code, max_entries=max_entries)

    @classmethod
    def from_bytes(
        cls, raw: bytes, type_code: BloomFilterTypeCode, *, max_entries: int = 0
    ) -> BloomFilter:
        """Read the serialized bytes (after Base64 decoding) of a filter of ``type_code``."""
        reader = _Reader(raw)
        nb_hash, hash_type, vector_size = reader.filter_header()
        if type_code is BloomFilterTypeCode.SIMPLE:
            rows = reader.bits(vector_size)[None, :]
            reader.expect_end()
            return cls(type_code, vector_size, nb_hash, rows, hash_type=hash_type)
        nr, current, length = reader.unpack(_DYNAMIC)
        if length < 1:
            raise ValueError(f"DYNAMIC_V0 bloom filter has {length} rows")
        matrix = np.empty((length, vector_size), dtype=np.bool_)
        for i in range(length):
            row_header = reader.filter_header()
            if row_header != (nb_hash, hash_type, vector_size):
                raise ValueError(f"bloom filter row {i} header {row_header} differs from "
                                 f"the filter's {(nb_hash, hash_type, vector_size)}")
            matrix[i] = reader.bits(vector_size)
        reader.expect_end()
        return cls(type_code, vector_size, nb_hash, matrix, hash_type=hash_type,
                   num_entries=nr, max_entries=max_entries, current_nb_record=current)

    def _require_murmur(self) -> None:
        if self._hash_type != HASH_TYPE_MURMUR:
            raise ValueError(f"bloom filter hash type {self._hash_type} is not supported "
                             f"(only Murmur, {HASH_TYPE_MURMUR}, which Hudi writes)")

    def _assign_rows(self, n: int) -> np.ndarray:
        """Row index for each of ``n`` keys about to be added, advancing Java's state."""
        if self._type_code is BloomFilterTypeCode.SIMPLE:
            return np.zeros(n, dtype=np.int64)
        if self._nr <= 0:
            raise ValueError(f"DYNAMIC_V0 bloom filter has {self._nr} entries per row; "
                             f"keys cannot be added")
        out = np.empty(n, dtype=np.int64)
        done = 0
        while done < n and not self._reached_max:
            if self._current_nb_record >= self._nr:
                if self.num_rows * self._nr < self._max_nr:
                    self._add_row()
                    self._current_nb_record = 0
                else:
                    # getActiveStandardBF: switch to round robin, this key goes to row 0
                    # without advancing the round-robin index.
                    self._reached_max = True
                    out[done] = 0
                    self._current_nb_record += 1
                    done += 1
                    break
            take = min(n - done, self._nr - self._current_nb_record)
            out[done:done + take] = self.num_rows - 1
            self._current_nb_record += take
            done += take
        if done < n:
            rest = n - done
            out[done:] = (self._cur_matrix_index + np.arange(rest, dtype=np.int64)) % self.num_rows
            self._cur_matrix_index += rest
            self._current_nb_record += rest
        return out

    def _add_row(self) -> None:
        grown = np.zeros((self.num_rows + 1, self._vector_size), dtype=np.bool_)
        grown[:-1] = self._rows
        self._rows = grown

    def __repr__(self) -> str:
        return (f"BloomFilter({self._type_code.value}, vector_size={self._vector_size}, "
                f"nb_hash={self._nb_hash}, rows={self.num_rows}, "
                f"current_nb_record={self._current_nb_record})")


@dataclass(frozen=True)
class BloomSizing:
    """How a base file's ``DYNAMIC_V0`` filter is sized: rows of as many keys as the file
    holds, at most ``num_entries`` (``hoodie.index.bloom.num_entries``), at ``fpp``
    (``hoodie.index.bloom.fpp``), growing by rows up to ``max_entries``
    (``hoodie.bloom.index.filter.dynamic.max.entries``) as Java's filter grows.

    Java sizes every filter for ``num_entries`` keys (323 KB at Hudi's defaults, whatever the
    file holds); a reader takes the size from the serialized filter, so a row sized for the
    file's own keys is as valid and keeps the false-positive rate of each row at ``fpp``.
    Files of more than ``num_entries`` keys get exactly Java's filter. Picklable.
    """

    num_entries: int = DEFAULT_NUM_ENTRIES
    fpp: float = DEFAULT_FPP
    max_entries: int = DEFAULT_MAX_ENTRIES

    def entries_for(self, num_keys: int) -> int:
        """Keys per row of the filter of a file of ``num_keys`` keys."""
        return max(1, min(num_keys, self.num_entries))

    def filter_for(self, keys: pa.Array | pa.ChunkedArray, room: float = 1.0) -> BloomFilter:
        """A filter of ``keys`` (added in order), sized for them, or with ``room`` (> 1) for
        ``room`` times as many: a file that will be rewritten with more keys (copy-on-write
        merges) can then keep it (:meth:`extend`) instead of hashing every key again."""
        wanted = max(len(keys), math.ceil(len(keys) * room))
        bloom = BloomFilter.create(self.entries_for(wanted), self.fpp, self.max_entries)
        bloom.add_many(keys)
        return bloom

    def extend(self, old: BloomFilter, new_keys: pa.Array | pa.ChunkedArray,
               num_keys: int) -> BloomFilter | None:
        """``old`` with ``new_keys`` added, for a rewritten file of ``num_keys`` keys, or None
        when a filter built from the file's keys is due instead.

        The old filter is kept (a superset of the file's keys: as valid) while its rows are
        sized within 2x of what :meth:`filter_for` would pick and the new keys fit its last
        row, or, for a filter sized at ``num_entries``, by growing rows as Java's does. A
        file that outgrew its filter, or shrank to under half of it (or a ``SIMPLE`` or
        non-Murmur filter), gets a fresh one.
        """
        if (old.type_code is not BloomFilterTypeCode.DYNAMIC_V0
                or old.hash_type != HASH_TYPE_MURMUR):
            return None
        target = self.entries_for(num_keys)
        if not target <= old.num_entries <= 2 * target:
            return None
        if len(new_keys) == 0:
            return old
        if old.num_entries >= self.num_entries:
            old.grow_up_to(self.max_entries)  # not serialized: grow as Java's filter does
        elif old.num_rows > 1 or old.current_nb_record + len(new_keys) > old.num_entries:
            return None
        old.add_many(new_keys)
        return old


class _Reader:
    """Big-endian reader over serialized filter bytes; errors are ``ValueError``."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._pos = 0

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        end = self._pos + fmt.size
        if end > len(self._raw):
            raise ValueError(f"bloom filter truncated at byte {self._pos} of {len(self._raw)}")
        values = fmt.unpack_from(self._raw, self._pos)
        self._pos = end
        return tuple(int(v) for v in values)

    def filter_header(self) -> tuple[int, int, int]:
        version, nb_hash, hash_type, vector_size = self.unpack(_HEADER)
        if version != _VERSION_MARKER:
            # A positive first int is Hadoop's pre-versioned layout (Jenkins hash).
            raise ValueError(f"unsupported bloom filter version {version}")
        if nb_hash <= 0 or vector_size <= 0:
            raise ValueError(f"bad bloom filter header: nbHash={nb_hash}, "
                             f"vectorSize={vector_size}")
        return nb_hash, hash_type, vector_size

    def bits(self, vector_size: int) -> np.ndarray:
        nbytes = (vector_size + 7) // 8
        end = self._pos + nbytes
        if end > len(self._raw):
            raise ValueError(f"bloom filter truncated: {nbytes} bit bytes expected at byte "
                             f"{self._pos}, {len(self._raw) - self._pos} left")
        packed = np.frombuffer(self._raw, dtype=np.uint8, count=nbytes, offset=self._pos)
        self._pos = end
        # unpackbits yields 0/1 bytes: a bool view of them needs no copy (astype compared
        # every byte again: ~0.9 ms of a 1.4 ms read of a 15,000-key file's filter).
        return np.unpackbits(packed, bitorder="little", count=vector_size).view(np.bool_)

    def expect_end(self) -> None:
        if self._pos != len(self._raw):
            raise ValueError(f"{len(self._raw) - self._pos} unexpected bytes after the "
                             f"bloom filter")


def _encode_key(key: str) -> bytes:
    # Java's String.getBytes(UTF_8) turns an unpaired surrogate into '?', as 'replace' does.
    return key.encode("utf-8", errors="replace")


def _utf8_buffers(
    keys: Iterable[str] | pa.Array | pa.ChunkedArray,
) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64[n+1] from 0, data uint8) of the keys' UTF-8 bytes.

    Null or empty keys raise ``ValueError``.
    """
    if isinstance(keys, pa.ChunkedArray):
        arr = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    elif isinstance(keys, pa.Array):
        arr = keys
    else:
        arr = pa.array([_encode_key(k) for k in keys], type=pa.binary())
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)
            or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)):
        if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):
            arr = arr.cast(pa.large_binary())
        else:
            raise ValueError(f"record keys must be strings, got {arr.type}")
    if arr.null_count:
        raise ValueError(f"{arr.null_count} record key(s) are null")
    n = len(arr)
    _, offsets_buf, data_buf = arr.buffers()
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    off_dtype = np.int64 if large else np.int32
    if offsets_buf is None:
        offsets = np.zeros(n + 1, dtype=np.int64)
    else:
        offsets = np.frombuffer(offsets_buf, dtype=off_dtype, count=arr.offset + n + 1)
        offsets = offsets[arr.offset:].astype(np.int64)
    if n and np.any(offsets[1:] == offsets[:-1]):
        raise ValueError("record keys must not be empty (Java rejects zero-length keys)")
    if data_buf is None:
        return offsets, np.zeros(0, dtype=np.uint8)
    # Only the bytes of these keys: a slice of a large array must not drag its whole buffer.
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buf, dtype=np.uint8, count=hi - lo, offset=lo)
    return offsets - lo, data


def _hash_positions(
    offsets: np.ndarray, data: np.ndarray, nb_hash: int, vector_size: int
) -> Iterator[np.ndarray]:
    """Yield, for each of the ``nb_hash`` chained hashes, every key's bit position.

    Keys are given as UTF-8 ``data`` and ``offsets``; each yielded array is an unsigned
    integer array (uint32, or intp when keys of different lengths are reordered) in key
    order. The 4-byte body chunks are mixed once (that part does not depend on the seed),
    then every round folds them column by column, over keys sorted by chunk count so that
    the keys still having a chunk ``i`` form a prefix.
    """
    n = len(offsets) - 1
    if n == 0:
        for _ in range(nb_hash):
            yield np.zeros(0, dtype=np.int64)
        return
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    chunks = lengths >> 2
    same_shape = bool(chunks.min() == chunks.max())
    order = None if same_shape else np.argsort(-chunks, kind="stable")
    if order is not None:
        starts, lengths, chunks = starts[order], lengths[order], chunks[order]

    # words[s, j] is the little-endian uint32 at byte 4*j + s: one gather per chunk column.
    n4 = len(data) // 4 + 1
    padded = np.zeros(4 * n4 + 4, dtype=np.uint8)
    padded[:len(data)] = data
    words = np.stack([padded[s:s + 4 * n4].view("<u4") for s in range(4)])
    columns = []
    max_chunks = int(chunks[0]) if order is not None else int(chunks.max())
    active = n
    for i in range(max_chunks):
        if order is not None:
            active = int(np.searchsorted(-chunks, -i, side="left"))
        p = starts[:active] + 4 * i
        k = words[p & 3, p >> 2]
        k *= _M32
        k ^= k >> np.uint32(24)
        k *= _M32
        columns.append(k)

    # Tail bytes, sign-extended like Java bytes and pre-XORed together: seed independent.
    tail_len = lengths & 3
    tail_idx = np.flatnonzero(tail_len)
    tail = np.zeros(len(tail_idx), dtype=np.uint32)
    if len(tail_idx):
        ends = starts[tail_idx] + lengths[tail_idx]
        tl = tail_len[tail_idx]
        signed = data.view(np.int8)
        for back, shift in ((3, 16), (2, 8), (1, 0)):
            sel = tl >= back
            byte = signed[ends[sel] - back].astype(np.int32).view(np.uint32)
            tail[sel] ^= byte << np.uint32(shift)

    seed_len = lengths.astype(np.uint32)
    seed = np.zeros(n, dtype=np.uint32)
    # Every key has tail bytes (or none has): whole-array operations, no gather/scatter.
    all_tails = len(tail_idx) == n
    vs = np.uint32(vector_size)
    shifted = np.empty(n, dtype=np.uint32)
    for _ in range(nb_hash):
        h = seed ^ seed_len
        for k in columns:
            a = len(k)
            if a == n:
                h *= _M32
                h ^= k
            else:
                part = h[:a]
                part *= _M32
                part ^= k
        if all_tails:
            h ^= tail
            h *= _M32
        elif len(tail_idx):
            h[tail_idx] = (h[tail_idx] ^ tail) * _M32
        np.right_shift(h, np.uint32(13), out=shifted)
        h ^= shifted
        h *= _M32
        np.right_shift(h, np.uint32(15), out=shifted)
        h ^= shifted
        seed = h
        # Java's abs(h % vectorSize) == |h| % vectorSize; |h| as uint32 is exact even for
        # Integer.MIN_VALUE (np.abs wraps it to itself, whose uint32 view is 2**31).
        pos = np.abs(h.view(np.int32)).view(np.uint32) % vs
        if order is None:
            yield pos
        else:
            unsorted = np.empty(n, dtype=np.intp)
            unsorted[order] = pos
            yield unsorted
