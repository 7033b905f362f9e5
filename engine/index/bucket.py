"""Bucket index: the bucket of a record key and bucket file ids (Hudi's ``BucketIdentifier``).

A table with ``hoodie.index.type=BUCKET`` (simple engine) keeps ``numBuckets`` file groups per
partition; a record's bucket is fixed by its key, so writers find its file group without any
lookup (docs/engine.md, "Record keys and the index type"). To agree with Java writers and with Spark
bucket pruning, the bucket must be computed exactly as Java does:

1. hash keys (``BucketIdentifier.getHashKeys`` → ``KeyGenUtils.extractRecordKeysByFields``,
   Hudi 1.x): a record key without ``,`` or without ``:`` is one value, the whole key.
   Otherwise it is parsed as ``field:value`` pairs — a ``,`` ends a value only if it is the
   last ``,`` before the next ``:``, so values may hold ``,`` and ``:`` — and the values of
   the hash fields are kept **in the order they appear in the key**. ``__null__`` stands for
   null and ``__empty__`` for ``""``. If no pair matches, the whole key is the one value.
   The hash fields default to the record key fields (``hoodie.bucket.index.hash.field``),
   i.e. every pair;
2. ``h = List<String>.hashCode()`` of those values: ``h = 1``, then ``h = 31 * h +
   String.hashCode(v)`` (0 for null), where ``String.hashCode`` runs over UTF-16 code
   units, all with 32-bit wraparound;
3. ``bucket = (h & 0x7fffffff) % numBuckets``.

Hudi 0.x split complex keys naively on ``,`` then ``:`` and also parsed single-pair keys such
as ``id:1``; 1.x hashes ``id:1`` whole. Tables written by 0.x with such keys (or with values
holding ``,`` or ``:``) may place them in other buckets; this module follows 1.x.

File ids of bucket file groups are ``<8-digit bucket><rest of a UUID>-0``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NULL_RECORDKEY_PLACEHOLDER = "__null__"
"""Stands for a null value inside a complex record key."""
EMPTY_RECORDKEY_PLACEHOLDER = "__empty__"
"""Stands for an empty value inside a complex record key."""
NBCC_FILE_ID_SUFFIX = "-0000-0000-0000-000000000000"
"""Fixed file id tail used under non-blocking concurrency control (Hudi 1.x)."""

_MASK32 = 0xFFFFFFFF
_MAX_BUCKET = 99_999_999  # eight decimal digits in a file id


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()``: over UTF-16 code units, as a signed 32-bit int.

    Characters outside the BMP count as two units (a surrogate pair); unpaired surrogates,
    which Java strings may hold, count as themselves.
    """
    h = _string_hash_u32(s)
    return h - (1 << 32) if h & 0x80000000 else h


def _string_hash_u32(s: str) -> int:
    h = 0
    if s.isascii():
        for b in s.encode("ascii"):
            h = (31 * h + b) & _MASK32
        return h
    units = s.encode("utf-16-be", errors="surrogatepass")
    for (u,) in struct.iter_unpack(">H", units):
        h = (31 * h + u) & _MASK32
    return h


def java_list_hash(values: Sequence[str | None]) -> int:
    """Java ``List<String>.hashCode()`` (null elements hash to 0), as a signed 32-bit int."""
    h = 1
    for v in values:
        h = (31 * h + (0 if v is None else _string_hash_u32(v))) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def hash_keys(record_key: str, hash_fields: Sequence[str] | str | None = None) -> list[str | None]:
    """The values Hudi hashes for ``record_key`` (``KeyGenUtils.extractRecordKeysByFields``).

    ``hash_fields`` None, empty or ``[""]`` keeps every pair (the default, where the hash
    fields are the record key fields); a ``str`` is split on ``,`` like the config value.
    Raises ``ValueError`` for the keys on which Java's parser never terminates (a skipped
    pair whose value holds ``:`` but no later ``,``), which no Java writer can have written.
    """
    fields = _normalize_fields(hash_fields)
    key = record_key
    if "," not in key or ":" not in key:
        return [key]
    n = len(key)
    values: list[str | None] = []
    processed = 0
    while processed < n:
        sep1 = key.find(":", processed)
        if sep1 < 0:  # cannot happen: a ':' always follows `processed` (see Java's loop)
            raise ValueError(f"cannot parse record key {record_key!r}")
        field = key[processed:sep1]
        sep2 = key.find(":", sep1 + 1)
        if not fields or field in fields:
            if sep2 < 0:
                value = key[sep1 + 1:]
                processed = n
            else:
                comma = _last_index_of(key, ",", sep2)
                while comma < sep1 and sep2 > 0:
                    sep2 = key.find(":", sep2 + 1)
                    comma = _last_index_of(key, ",", sep2)
                if comma > 0:
                    value = key[sep1 + 1:comma]
                    processed = comma + 1
                else:
                    value = key[sep1 + 1:]
                    processed = n
            if value == NULL_RECORDKEY_PLACEHOLDER:
                values.append(None)
            elif value == EMPTY_RECORDKEY_PLACEHOLDER:
                values.append("")
            else:
                values.append(value)
        elif sep2 < 0:
            processed = n
        else:
            comma = _last_index_of(key, ",", sep2)
            while comma < sep1:
                sep2 = key.find(":", sep2 + 1)
                if sep2 < 0:
                    # Java's indexOf wraps around to the first ':' here and loops forever.
                    raise ValueError(
                        f"record key {record_key!r}: Hudi's hash-key parser does not "
                        f"terminate on it (pair {field!r} has no following ',')")
                comma = _last_index_of(key, ",", sep2)
            processed = n if comma < 0 else comma + 1
    return values if values else [key]


def _last_index_of(s: str, ch: str, from_index: int) -> int:
    """Java ``String.lastIndexOf(ch, fromIndex)``."""
    if from_index < 0:
        return -1
    return s.rfind(ch, 0, from_index + 1)


def _normalize_fields(hash_fields: Sequence[str] | str | None) -> frozenset[str]:
    """The hash fields as a set; empty means "every pair"."""
    if hash_fields is None:
        return frozenset()
    if isinstance(hash_fields, str):
        parts = hash_fields.split(",")
        while parts and parts[-1] == "":  # Java's String.split drops trailing empties
            parts.pop()
        hash_fields = parts
    fields = list(hash_fields)
    if len(fields) == 1 and fields[0] == "":
        return frozenset()
    return frozenset(fields)


def bucket_id(
    record_key: str, num_buckets: int, hash_fields: Sequence[str] | str | None = None
) -> int:
    """The bucket (0 ≤ id < ``num_buckets``) Java's bucket index gives ``record_key``."""
    _check_num_buckets(num_buckets)
    h = java_list_hash(hash_keys(record_key, hash_fields))
    return (h & 0x7FFFFFFF) % num_buckets


def bucket_ids(
    keys: pa.Array | pa.ChunkedArray,
    num_buckets: int,
    hash_fields: Sequence[str] | str | None = None,
) -> np.ndarray:
    """:func:`bucket_id` of every key of a pyarrow string array, as ``int32`` in key order.

    ASCII keys are hashed with numpy, complex keys too when every ``,``-separated part
    holds exactly one ``:`` (then Java's parser reads exactly those parts); other keys fall
    back to the scalar definition. Null keys, and keys Java's parser cannot read (see
    :func:`hash_keys`), raise ``ValueError``.
    """
    _check_num_buckets(num_buckets)
    fields = _normalize_fields(hash_fields)
    arr = _as_string_array(keys)
    if arr.null_count:
        raise ValueError(f"{arr.null_count} record key(s) are null")
    out = np.empty(len(arr), dtype=np.int32)
    for begin in range(0, len(arr), _BATCH):  # bounds the per-byte temporaries
        chunk = arr.slice(begin, _BATCH)
        out[begin:begin + len(chunk)] = _bucket_ids_batch(chunk, num_buckets, fields)
    return out


_BATCH = 1 << 18


def _bucket_ids_batch(arr: pa.Array, num_buckets: int, fields: frozenset[str]) -> np.ndarray:
    offsets, data = _buffers(arr)
    lengths = np.diff(offsets)
    fallback = ~_to_bool(pc.string_is_ascii(arr))
    hasher: _RangeHasher | None = None
    if len(lengths) and int(lengths.min()) == int(lengths.max()):
        whole = equal_length_hashes(offsets, data)
    else:
        hasher = _RangeHasher(offsets, data)
        whole = hasher.hash(offsets[:-1], offsets[1:], offsets[1:])
    # Java: a key without ',' or without ':' hashes as the one-element list [key].
    list_hash = whole + np.uint32(31)

    lo, hi = int(offsets[0]), int(offsets[-1])
    region = data[lo:hi]
    seps = np.flatnonzero((region == ord(",")) | (region == ord(":"))) + lo
    if len(seps):
        owner = np.searchsorted(offsets, seps, side="right") - 1
        is_colon = data[seps] == ord(":")
        has_colon = np.zeros(len(lengths), dtype=np.bool_)
        has_colon[owner[is_colon]] = True
        has_comma = np.zeros(len(lengths), dtype=np.bool_)
        has_comma[owner[~is_colon]] = True
        complex_keys = np.flatnonzero(~fallback & has_comma & has_colon)
        hasher = hasher or _RangeHasher(offsets, data)
        handled, matched, hashes = _complex_list_hashes(
            offsets, data, seps, owner, complex_keys, fields, hasher)
        list_hash[complex_keys[matched]] = hashes[matched]
        fallback[complex_keys[~handled]] = True

    buckets = ((list_hash & np.uint32(0x7FFFFFFF)) % np.uint32(num_buckets)).astype(np.int32)
    slow = np.flatnonzero(fallback)
    if len(slow):
        field_arg = sorted(fields) if fields else None
        py_keys = arr.take(pa.array(slow)).to_pylist()
        buckets[slow] = [bucket_id(k, num_buckets, field_arg) for k in py_keys]
    return buckets


def _complex_list_hashes(
    offsets: np.ndarray,
    data: np.ndarray,
    seps: np.ndarray,
    owner: np.ndarray,
    keys: np.ndarray,
    fields: frozenset[str],
    hasher: _RangeHasher,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """List hashes of the ASCII ``f:v,f:v`` keys at indices ``keys``.

    ``seps`` are the positions of every ``,`` and ``:`` in the batch, ``owner`` their key.
    Returns (handled, matched, hashes), aligned with ``keys``: ``handled`` is False where a
    ``,``-separated part does not hold exactly one ``:`` (left to the scalar path);
    ``matched`` is True where some pair is a hash field, and ``hashes`` is then the list
    hash of the selected values. A handled key without a match hashes whole, as ``[key]``.
    """
    n_keys = len(offsets) - 1
    wanted = np.zeros(n_keys, dtype=np.bool_)
    wanted[keys] = True
    keep = wanted[owner]
    seps, owner = seps[keep], owner[keep]
    is_colon = data[seps] == ord(":")
    per_key = np.bincount(owner, minlength=n_keys)
    run_len = per_key[keys]
    run_start = (np.cumsum(per_key) - per_key)[keys]
    # Clean keys read colon, comma, colon, ..., colon: one ':' in every part.
    rank = np.arange(len(seps)) - np.repeat(run_start, run_len)
    bad = (is_colon != (rank % 2 == 0)).astype(np.int64)
    bad_cum = np.concatenate(([0], np.cumsum(bad)))
    handled = ((bad_cum[run_start + run_len] - bad_cum[run_start]) == 0) & (run_len % 2 == 1)

    clean = keys[handled]
    c_start, c_len = run_start[handled], run_len[handled]
    n_parts = (c_len + 1) // 2
    part_base = np.concatenate(([0], np.cumsum(n_parts)[:-1])) if len(n_parts) else n_parts
    part_key = np.repeat(np.arange(len(clean)), n_parts)
    part_no = np.arange(int(n_parts.sum())) - np.repeat(part_base, n_parts)
    colon = seps[c_start[part_key] + 2 * part_no]
    key_begin, key_end = offsets[clean][part_key], offsets[clean + 1][part_key]
    last = part_no == n_parts[part_key] - 1
    first = part_no == 0
    part_end = np.where(last, key_end, seps[np.minimum(c_start[part_key] + 2 * part_no + 1,
                                                        len(seps) - 1)])
    part_begin = np.where(first, key_begin,
                          seps[np.maximum(c_start[part_key] + 2 * part_no - 1, 0)] + 1)

    value_hash = hasher.hash(colon + 1, part_end, key_end)
    for placeholder in (NULL_RECORDKEY_PLACEHOLDER, EMPTY_RECORDKEY_PLACEHOLDER):
        hit = _ranges_equal(data, colon + 1, part_end, value_hash, placeholder)
        value_hash[hit] = 0  # String.hashCode("") == 0, and null counts as 0
    if fields:
        field_hash = hasher.hash(part_begin, colon, key_end)
        selected = np.zeros(len(colon), dtype=np.bool_)
        for name in fields:
            selected |= _ranges_equal(data, part_begin, colon, field_hash, name)
    else:
        selected = np.ones(len(colon), dtype=np.bool_)

    h = np.ones(len(clean), dtype=np.uint32)
    matched = np.zeros(len(clean), dtype=np.bool_)
    for i in range(int(n_parts.max()) if len(n_parts) else 0):
        live = np.flatnonzero(n_parts > i)
        part = part_base[live] + i
        take = selected[part]
        live, part = live[take], part[take]
        h[live] = h[live] * np.uint32(31) + value_hash[part]
        matched[live] = True
    handled_at = np.flatnonzero(handled)
    hashes = np.zeros(len(keys), dtype=np.uint32)
    hashes[handled_at] = h
    any_match = np.zeros(len(keys), dtype=np.bool_)
    any_match[handled_at] = matched
    return handled, any_match, hashes


def _ranges_equal(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray, hashes: np.ndarray, text: str
) -> np.ndarray:
    """Which ASCII byte ranges ``[starts, ends)`` (with their string ``hashes``) equal ``text``.

    Ranges are first matched on length and hash, then compared byte by byte.
    """
    want = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    result = ((ends - starts) == len(want)) & (hashes == np.uint32(_string_hash_u32(text)))
    idx = np.flatnonzero(result)
    if len(idx) and len(want):
        window = data[starts[idx, None] + np.arange(len(want))]
        result[idx] = (window == want).all(axis=1)
    return result


class _RangeHasher:
    """``String.hashCode`` of byte ranges inside the keys of one string array (ASCII).

    Each byte ``j`` of a key ending at ``e`` is weighted ``31**(e-1-j)``; with ``S`` the
    wrapping prefix sums, a range ``[a, b)`` of that key hashes to
    ``(S[b] - S[a]) * 31**-(e-b)`` — 31 is odd, so it has an inverse modulo 2**32, and
    all power tables stay as small as the longest key.
    """

    def __init__(self, offsets: np.ndarray, data: np.ndarray) -> None:
        lo, hi = int(offsets[0]), int(offsets[-1])
        lengths = np.diff(offsets)
        longest = int(lengths.max()) if len(lengths) else 0
        index_type = np.int32 if hi < 2**31 else np.int64
        exponent = np.repeat((offsets[1:] - 1).astype(index_type), lengths)
        exponent -= np.arange(lo, hi, dtype=index_type)
        weighted = _powers(31, longest)[exponent]
        weighted *= data[lo:hi]
        self._lo = lo
        self._cum = np.zeros(hi - lo + 1, dtype=np.uint32)
        np.cumsum(weighted, dtype=np.uint32, out=self._cum[1:])
        self._inverse = _powers(_INV31, longest + 1)

    def hash(self, starts: np.ndarray, ends: np.ndarray, key_ends: np.ndarray) -> np.ndarray:
        """uint32 hashes of ``[starts, ends)``, each inside a key ending at ``key_ends``."""
        total = self._cum[ends - self._lo] - self._cum[starts - self._lo]
        return np.asarray(total * self._inverse[key_ends - ends], dtype=np.uint32)


_INV31 = pow(31, -1, 1 << 32)


def ascii_string_hashes(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """``String.hashCode`` (uint32) of every ASCII string of a string array's ``offsets``
    and ``data``: a matrix when they all have one length, else prefix sums
    (:class:`_RangeHasher`)."""
    lengths = np.diff(offsets)
    if not len(lengths) or int(lengths.min()) == int(lengths.max()):
        return equal_length_hashes(offsets, data)
    return _RangeHasher(offsets, data).hash(offsets[:-1], offsets[1:], offsets[1:])


def equal_length_hashes(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """``String.hashCode`` (uint32) of ASCII strings that all have the same length."""
    n = len(offsets) - 1
    lo, hi = int(offsets[0]), int(offsets[-1])
    if n == 0 or hi == lo:
        return np.zeros(n, dtype=np.uint32)
    width = (hi - lo) // n
    matrix = data[lo:hi].reshape(n, width)
    return np.asarray((matrix * _powers(31, width)[::-1]).sum(axis=1, dtype=np.uint32))


def _powers(base: int, count: int) -> np.ndarray:
    """``base**k mod 2**32`` for k in ``[0, count)``, as uint32."""
    powers = np.full(max(count, 1), base, dtype=np.uint32)
    powers[0] = 1
    return np.cumprod(powers, dtype=np.uint32)


def _as_string_array(keys: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray):
        arr = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    elif isinstance(keys, pa.Array):
        arr = keys
    else:
        raise ValueError(f"keys must be a pyarrow string array, got {type(keys).__name__}")
    if isinstance(arr, pa.DictionaryArray):
        arr = arr.dictionary_decode()
    if pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.string())
    if not pa.types.is_string(arr.type):
        raise ValueError(f"record keys must be strings, got {arr.type}")
    return arr


def _buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets[n+1], uint8 data) of a ``string`` array, honouring its slice offset."""
    n = len(arr)
    _, offsets_buf, data_buf = arr.buffers()
    if offsets_buf is None:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=arr.offset + n + 1)
    offsets = offsets[arr.offset:].astype(np.int64)
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, dtype=np.uint8))
    return offsets, data


def _to_bool(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _check_num_buckets(num_buckets: int) -> None:
    if num_buckets <= 0:
        raise ValueError(f"num_buckets must be positive, got {num_buckets}")


def bucket_file_id(bucket: int, uuid_str: str | None = None) -> str:
    """File id of a bucket's file group: ``<8-digit bucket><uuid[8:]>-0``.

    ``uuid_str`` (default: a random UUID4) must be a UUID; it is used in canonical
    lowercase form. ``BucketIdentifier.newBucketFileIdPrefix`` + ``FSUtils.createNewFileId``.
    """
    _check_bucket(bucket)
    if uuid_str is None:
        text = str(uuid.uuid4())
    else:
        try:
            text = str(uuid.UUID(uuid_str))
        except ValueError:
            raise ValueError(f"uuid_str {uuid_str!r} is not a UUID") from None
    return f"{bucket:08d}{text[8:]}-0"


def bucket_file_id_nbcc(bucket: int) -> str:
    """Fixed file id of a bucket under non-blocking concurrency control (Hudi 1.x)."""
    _check_bucket(bucket)
    return f"{bucket:08d}{NBCC_FILE_ID_SUFFIX}-0"


def bucket_from_file_id(file_id: str) -> int:
    """The bucket encoded in the first 8 characters of a bucket file id."""
    prefix = file_id[:8]
    if len(prefix) != 8 or not (prefix.isascii() and prefix.isdigit()):
        raise ValueError(f"file id {file_id!r} does not start with an 8-digit bucket id")
    return int(prefix)


def _check_bucket(bucket: int) -> None:
    if not 0 <= bucket <= _MAX_BUCKET:
        raise ValueError(f"bucket must be in [0, {_MAX_BUCKET}], got {bucket}")
