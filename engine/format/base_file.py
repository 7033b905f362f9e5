"""Parquet base files: write them with Hudi's footer keys, read them back.

A base file holds the five meta columns followed by the data columns. Its footer carries,
as Java's ``HoodieBloomFilterWriteSupport`` writes them:

* ``org.apache.hudi.bloomfilter``: the Base64 bloom filter of the record keys, added in row
  order (:mod:`engine.format.bloom`), and ``hoodie_bloom_filter_type_code`` for dynamic filters;
* ``hoodie_min_record_key`` / ``hoodie_max_record_key`` in Java ``String.compareTo`` order
  (UTF-16 code units; it differs from UTF-8 byte order when a key holds characters above
  U+FFFF next to characters in U+E000..U+FFFF).

pyarrow's own ``ARROW:schema`` key is kept; hudi-rs reads such files. Readers do not need the
Hudi keys, Java's BLOOM/SIMPLE index and some table services do.

Publishing goes through :meth:`engine.storage.Storage.write_new_with`: on local disk the
file is written under a hidden temporary name (``.tmp.`` prefix) in the target folder,
fsynced, then linked to its final name, which must not exist yet; on an object store it is
written to memory and put with a conditional create. A crash leaves at most a temporary
file that no Hudi reader lists; no half-written file ever carries the final name. Readers
take a path or an open file (:meth:`engine.storage.Storage.open_input`). A file open in
parts on an object store (:class:`~engine.storage.RangedInput`) is read by its footer, from
the bytes its open fetched, then only the column chunks a read needs
(:func:`chunk_ranges`, fetched together before pyarrow decodes them): a one-column read of
a file fetches that column's chunks and the footer, not the file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.format.bloom import BloomFilter, BloomFilterTypeCode, BloomSizing
from engine.storage import LocalStorage, RangedInput, Storage

META_COLUMNS = (
    "_hoodie_commit_time",
    "_hoodie_commit_seqno",
    "_hoodie_record_key",
    "_hoodie_partition_path",
    "_hoodie_file_name",
)
"""The five meta columns every base file starts with, in order (Java
``HoodieRecord.HOODIE_META_COLUMNS``)."""

BLOOM_FILTER_KEY = "org.apache.hudi.bloomfilter"
LEGACY_BLOOM_FILTER_KEY = "com.uber.hoodie.bloomfilter"
BLOOM_FILTER_TYPE_CODE_KEY = "hoodie_bloom_filter_type_code"
MIN_RECORD_KEY_KEY = "hoodie_min_record_key"
MAX_RECORD_KEY_KEY = "hoodie_max_record_key"

_RECORD_KEY = "_hoodie_record_key"
_FILE_NAME = "_hoodie_file_name"


ROW_GROUP_ROWS = 16_384
"""Most rows in one row group of a base file. A key lookup (:func:`read_base_file_keys`)
decodes the record key column, then only the row groups holding the keys: with one row group
per file (pyarrow's default up to a million rows) a lookup decoded every column of the whole
file (67 ms for a 122,880-row file; 18-37 ms with groups of 8,192-16,384 rows, and a full scan
as fast, measured in ``docs/benchmarks.md``). Hudi's ``hoodie.parquet.block.size`` (120 MB)
caps row groups by bytes; no base file we write comes near it."""

DICTIONARY_SAMPLE_ROWS = 8192
"""Rows of a string column :func:`parquet_dictionary_columns` looks at to judge its repeats."""

_NEVER_DICTIONARY = ("_hoodie_commit_seqno", _RECORD_KEY)
_ALWAYS_DICTIONARY = ("_hoodie_commit_time", "_hoodie_partition_path", _FILE_NAME)


def parquet_dictionary_columns(table: pa.Table,
                               previous: Mapping[str, bool] | None = None) -> list[str]:
    """The columns of ``table`` worth Parquet dictionary encoding, for base files and parquet
    log blocks alike.

    Dictionary-typed columns and the meta columns with one value per file or block always;
    the commit sequence numbers and record keys (unique by construction) never; any other
    string column when at most half the values of its first :data:`DICTIONARY_SAMPLE_ROWS`
    rows are distinct — the test parquet-mr makes after its first page (a dictionary must
    beat plain encoding), made up front: on a column of unique strings a dictionary writes
    ~30% more bytes and costs ~35% more write time, on categories it writes several times fewer.
    Numeric columns are left plain (pyarrow would try a dictionary for every column).
    ``previous`` (:func:`dictionary_encoded`) gives the choice the file being rewritten made
    for its string columns: a copy-on-write merge keeps it (same encodings as the old file,
    no sample to judge); columns it lacks are judged as above.
    """
    names = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name in _NEVER_DICTIONARY:
            continue
        if pa.types.is_dictionary(field.type) or field.name in _ALWAYS_DICTIONARY:
            names.append(field.name)
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            if previous is not None and field.name in previous:
                if previous[field.name]:
                    names.append(field.name)
                continue
            sample = column.slice(0, DICTIONARY_SAMPLE_ROWS)
            if len(sample) and len(pc.unique(sample)) * 2 <= len(sample):
                names.append(field.name)
    return names


_DICTIONARY_ENCODINGS = frozenset({"RLE_DICTIONARY", "PLAIN_DICTIONARY"})


def dictionary_encoded(metadata: pq.FileMetaData) -> dict[str, bool]:
    """For each top-level column of a Parquet file, whether its first row group's chunk is
    dictionary encoded (what :func:`parquet_dictionary_columns` takes as ``previous``); an
    empty mapping for a file without row groups."""
    if metadata.num_row_groups == 0:
        return {}
    group = metadata.row_group(0)
    found: dict[str, bool] = {}
    for i in range(group.num_columns):
        chunk = group.column(i)
        top = chunk.path_in_schema.split(".", 1)[0]
        found[top] = found.get(top, False) or bool(_DICTIONARY_ENCODINGS & set(chunk.encodings))
    return found


@dataclass(frozen=True)
class BaseFileWriteResult:
    """What :func:`write_base_file` wrote; min/max keys are None for a file without keys."""

    path: str
    file_size: int
    num_rows: int
    min_key: str | None
    max_key: str | None
    bloom_filter: str | None = dataclasses.field(default=None, repr=False, compare=False)
    """The footer's bloom filter as written (its Base64 text), None without one."""
    bloom_type_code: str | None = dataclasses.field(default=None, compare=False)
    """Its type code (``DYNAMIC_V0`` or ``SIMPLE``)."""


@dataclass(frozen=True)
class FooterKeys:
    """Hudi's index keys from a base file footer; each is None where the footer lacks it."""

    min_key: str | None
    max_key: str | None
    bloom: BloomFilter | None


def write_base_file(
    path: str,
    table: pa.Table,
    *,
    bloom: bool = True,
    compression: str = "snappy",
    row_group_size: int | None = ROW_GROUP_ROWS,
    bloom_filter: BloomFilter | None = None,
    bloom_sizing: BloomSizing | None = None,
    fsync: bool = True,
    storage: Storage | None = None,
    dictionary_hint: Mapping[str, bool] | None = None,
) -> BaseFileWriteResult:
    """Write ``table`` as the Parquet base file ``path`` and publish it atomically.

    ``path`` is relative to ``storage`` when given (the engine's writers), else a local
    file path (tools and tests).

    ``table`` must start with the five meta columns (strings) in Hudi's order; every
    non-null ``_hoodie_file_name`` must equal the file's name. With ``bloom`` (Hudi's
    default) the footer gets a ``DYNAMIC_V0`` bloom filter of the record keys, sized for
    them by ``bloom_sizing`` (Hudi's defaults when None, :class:`BloomSizing`), and the
    min/max record key; record keys must then be non-null and non-empty.
    Raises ``ValueError`` for such bad input and ``FileExistsError`` if ``path`` exists;
    on any error nothing is left under ``path`` or its temporary name.

    ``bloom_filter``, when given, is written as is instead of one built from the keys: a
    copy-on-write merge passes the old file's filter with the new keys added (a superset of
    this file's keys, as valid for Java's index as an exact one). Dictionary encoding goes
    to the columns :func:`parquet_dictionary_columns` picks; meta columns may be given as
    ``dictionary<string>`` arrays. ``fsync=False`` leaves flushing to the caller (a writer
    that syncs the file system once before its commit, see :meth:`Storage.sync`).
    ``dictionary_hint``: the rewritten file's choice of dictionary columns
    (:func:`dictionary_encoded`), kept for the columns it names.
    """
    _check_meta_columns(table)
    if storage is None:
        folder, name = os.path.split(os.path.abspath(path))
        storage, rel = LocalStorage(folder), name
    else:
        rel, name = path, path.rsplit("/", 1)[-1]
    _check_file_names(table, name)
    keys = table.column(_RECORD_KEY)
    footer: dict[str, str] = {}
    min_key = max_key = None
    if bloom:
        if keys.null_count:
            raise ValueError(f"{keys.null_count} row(s) have a null {_RECORD_KEY}; "
                             f"a bloom filter needs every record key")
        if bloom_filter is None:
            bloom_filter = (bloom_sizing or BloomSizing()).filter_for(keys)
        footer[BLOOM_FILTER_KEY] = bloom_filter.serialize()
        if bloom_filter.type_code is BloomFilterTypeCode.DYNAMIC_V0:
            # Java writes the code for dynamic filters only; without it readers assume SIMPLE.
            footer[BLOOM_FILTER_TYPE_CODE_KEY] = bloom_filter.type_code.value
        min_key, max_key = java_min_max(keys)
        if min_key is not None and max_key is not None:
            footer[MIN_RECORD_KEY_KEY] = min_key
            footer[MAX_RECORD_KEY_KEY] = max_key

    def produce(sink: pa.NativeFile) -> None:
        with pq.ParquetWriter(sink, table.schema, compression=compression,
                              use_dictionary=parquet_dictionary_columns(
                                  table, dictionary_hint)) as writer:
            writer.write_table(table, row_group_size=row_group_size)
            if footer:
                writer.add_key_value_metadata(footer)

    size = storage.write_new_with(rel, produce, fsync=fsync)
    return BaseFileWriteResult(
        path=storage.full(rel),
        file_size=size,
        num_rows=table.num_rows,
        min_key=min_key,
        max_key=max_key,
        bloom_filter=footer.get(BLOOM_FILTER_KEY),
        bloom_type_code=bloom_filter.type_code.value if bloom_filter is not None else None,
    )


def read_base_file(
    path: str | pa.NativeFile,
    columns: Sequence[str] | None = None,
    filters: pc.Expression | list[Any] | None = None,
    dictionary_columns: Sequence[str] | None = None,
    use_threads: bool = True,
) -> pa.Table:
    """Read a base file (all columns or ``columns``), optionally filtered.

    ``filters`` is a pyarrow expression or a DNF list as :func:`pyarrow.parquet.read_table`
    takes it. No partition columns are inferred from the file's folder names.
    A column of ``columns`` the file lacks (one added to the table after the file was
    written) is left out: :func:`engine.schema.evolve_columns` adds it as nulls.
    ``dictionary_columns`` come back as ``dictionary<string>`` (much faster for columns
    with few distinct values, such as the commit time or file name). ``use_threads=False``
    decodes on the calling thread alone, for callers that read several files at once
    (pyarrow's column threads would contend with theirs and leave cores idle while a
    caller merges).
    """
    dictionary = list(dictionary_columns) if dictionary_columns else None
    if filters is None or isinstance(path, RangedInput):
        # One file, no filter: ParquetFile skips the dataset layer (~20% faster on a
        # 25,000-row file). A file read in parts too: the dataset layer would read its
        # footer again, and the filter's columns are read here as asked.
        with parquet_file(path, dictionary) as file:
            names = set(file.schema_arrow.names)
            wanted = [c for c in columns if c in names] if columns is not None else None
            if filters is None:
                return read_row_groups(file, path, None, wanted, use_threads)
            expression = filters if isinstance(filters, pc.Expression) \
                else pq.filters_to_expression(filters)
            rows = read_row_groups(file, path, None, wanted, use_threads)
            try:
                rows = rows.filter(expression)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                # the filter reads columns beyond ``columns`` (no API names them): all
                rows = read_row_groups(file, path, None, None, use_threads).filter(expression)
            return rows if wanted is None else rows.select(wanted)
    try:
        return pq.read_table(path, columns=list(columns) if columns is not None else None,
                             filters=filters, partitioning=None, read_dictionary=dictionary,
                             use_threads=use_threads)
    except pa.ArrowInvalid:
        if columns is None:
            raise
        # A column the file lacks (the table's schema gained it since): read without it.
        names = set(pq.read_schema(path).names)
        if all(c in names for c in columns):
            raise
    return pq.read_table(path, columns=[c for c in columns if c in names], filters=filters,
                         partitioning=None, read_dictionary=dictionary,
                         use_threads=use_threads)


def parquet_file(source: str | pa.NativeFile,
                 dictionary_columns: Sequence[str] | None = None) -> pq.ParquetFile:
    """The parquet file ``source`` (a path or an open file), its footer parsed: a file open
    in parts (:class:`~engine.storage.RangedInput`) has its footer taken from the bytes its
    open fetched (one more request when it is larger), not from pyarrow's own 64 KiB tail
    read."""
    dictionary = list(dictionary_columns) if dictionary_columns else None
    if not isinstance(source, RangedInput):
        return pq.ParquetFile(source, read_dictionary=dictionary)
    tail = source.tail()
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        # not a plain parquet file (or an encrypted footer): pyarrow's own reading and errors
        return pq.ParquetFile(source, read_dictionary=dictionary)
    needed = int.from_bytes(tail[-8:-4], "little") + 8
    footer = tail[-needed:] if needed <= len(tail) else source.footer(needed)
    source.remember_footer(needed)
    metadata = pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
    return pq.ParquetFile(source, metadata=metadata, read_dictionary=dictionary)


def chunk_ranges(metadata: pq.FileMetaData, row_groups: Sequence[int] | None,
                 columns: Sequence[str] | None) -> list[tuple[int, int]]:
    """Byte ranges ``(start, end)`` of the column chunks of ``columns`` (None: all; a name
    takes every leaf below it, as pyarrow's ``columns`` do: ``s`` the leaves ``s.x`` and
    ``s.y``, ``s.x`` the leaf ``s.x``) in ``row_groups`` (None: all): a chunk's dictionary
    page and data pages."""
    schema = metadata.schema
    leaves = [i for i in range(metadata.num_columns)
              if columns is None or any(_below(schema.column(i).path, c) for c in columns)]
    groups = range(metadata.num_row_groups) if row_groups is None else row_groups
    found = []
    for group in groups:
        row_group = metadata.row_group(group)
        for leaf in leaves:
            chunk = row_group.column(leaf)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
            found.append((start, start + chunk.total_compressed_size))
    return found


def _below(path: str, column: str) -> bool:
    return path == column or path.startswith(column + ".")


def read_row_groups(file: pq.ParquetFile, source: object, row_groups: Sequence[int] | None,
                    columns: Sequence[str] | None, use_threads: bool) -> pa.Table:
    """``file.read_row_groups`` (``row_groups`` None: the whole file), the chunks it needs
    fetched first in as few requests as they allow when ``source`` is open in parts."""
    if isinstance(source, RangedInput):
        source.prefetch(chunk_ranges(file.metadata, row_groups, columns))
    if row_groups is None:
        return file.read(columns=columns, use_threads=use_threads)
    return file.read_row_groups(row_groups, columns=columns, use_threads=use_threads)


def read_base_file_and_footer(
    path: str | pa.NativeFile, dictionary_columns: Sequence[str] | None = None,
) -> tuple[pa.Table, pq.FileMetaData]:
    """Every row and column of a base file (as :func:`read_base_file`) and its footer, from
    one open of the file (a copy-on-write merge needs both)."""
    with parquet_file(path, dictionary_columns) as file:
        return read_row_groups(file, path, None, None, True), file.metadata


def read_base_file_keys(
    path: str | pa.NativeFile,
    keys: pa.Array,
    columns: Sequence[str] | None = None,
    dictionary_columns: Sequence[str] | None = None,
    use_threads: bool = True,
) -> pa.Table:
    """The rows of a base file whose record key is one of ``keys`` (all columns or
    ``columns``, which must then include ``_hoodie_record_key``).

    Two passes: the record key column of the row groups whose statistics may hold a key,
    then every wanted column of only the row groups that do hold one. A file of one row
    group is read in one pass with the filter (a first pass would save nothing).
    """
    value_set = keys if keys.type == pa.string() else keys.cast(pa.string())
    if columns is not None and _RECORD_KEY not in columns:
        raise ValueError(f"columns must include {_RECORD_KEY} to read by key")
    with parquet_file(path, dictionary_columns) as file:
        names = file.schema_arrow.names
        if file.metadata.num_row_groups > 1 and _RECORD_KEY in names:
            holding = _row_groups_holding(file, path, names.index(_RECORD_KEY), value_set,
                                          use_threads)
            # a column the file lacks is left out (as read_base_file leaves it out)
            wanted = [c for c in columns if c in names] if columns is not None else None
            if not holding:
                schema = file.schema_arrow
                if wanted is not None:
                    schema = pa.schema([schema.field(c) for c in wanted])
                return schema.empty_table()
            part = read_row_groups(file, path, holding, wanted, use_threads)
            return part.filter(pc.is_in(part.column(_RECORD_KEY), value_set=value_set))
    return read_base_file(path, columns=columns, filters=pc.field(_RECORD_KEY).isin(value_set),
                          dictionary_columns=dictionary_columns, use_threads=use_threads)


FEW_KEYS = 8
"""Up to this many keys, a read by key looks for them a row group at a time and stops once
every key was seen."""


def _row_groups_holding(file: pq.ParquetFile, source: object, key_index: int,
                        keys: pa.Array, use_threads: bool) -> list[int]:
    """Row groups of ``file`` holding one of ``keys``: those whose key statistics may hold
    one (parquet orders strings as UTF-8 bytes, as pyarrow compares them), checked on their
    decoded record key column."""
    meta = file.metadata
    low, high = pc.min(keys).as_py(), pc.max(keys).as_py()
    candidates = []
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(key_index).statistics
        if (low is not None and stats is not None and stats.has_min_max
                and (stats.max < low or stats.min > high)):
            continue
        candidates.append(group)
    if not candidates:
        return []
    if len(keys) <= FEW_KEYS:
        # A key lives once in a base file: read the groups' keys one group at a time and
        # stop once every key was seen (a point lookup decodes half the groups on average).
        wanted = set(keys.to_pylist())
        holding = []
        for group in candidates:
            found = read_row_groups(file, source, [group], [_RECORD_KEY],
                                    use_threads).column(0)
            hit = pc.filter(found, pc.is_in(found, value_set=keys))
            if len(hit):
                holding.append(group)
                wanted.difference_update(hit.to_pylist())
                if not wanted:
                    break
        return holding
    found = read_row_groups(file, source, candidates, [_RECORD_KEY], use_threads).column(0)
    hits = np.flatnonzero(pc.is_in(found, value_set=keys).to_numpy(zero_copy_only=False))
    ends = np.cumsum([meta.row_group(g).num_rows for g in candidates])
    return sorted({candidates[i] for i in np.searchsorted(ends, hits, side="right")})


def read_footer_keys(path: str | pa.NativeFile, *, with_bloom: bool = True) -> FooterKeys:
    """Min/max record key and bloom filter from the footer only (no data pages are read;
    ``with_bloom=False``: the filter is not decoded, ``bloom`` is None).

    The bloom filter is read from ``org.apache.hudi.bloomfilter`` (or the legacy
    ``com.uber.hoodie.bloomfilter``); without ``hoodie_bloom_filter_type_code`` it is
    ``SIMPLE``, as Java assumes. A malformed filter raises ``ValueError``.
    """
    with parquet_file(path) as file:
        return footer_keys(file.metadata, path, with_bloom=with_bloom)


def footer_keys(metadata: pq.FileMetaData, path: object,
                *, with_bloom: bool = True) -> FooterKeys:
    """:func:`read_footer_keys` from a footer already read (``path`` names it in errors)."""
    raw = metadata.metadata or {}

    def value(key: str) -> str | None:
        found = raw.get(key.encode("utf-8"))
        return None if found is None else found.decode("utf-8")

    serialized = (value(BLOOM_FILTER_KEY) or value(LEGACY_BLOOM_FILTER_KEY)
                  if with_bloom else None)
    bloom = None
    if serialized:
        try:
            bloom = BloomFilter.deserialize(serialized, value(BLOOM_FILTER_TYPE_CODE_KEY))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: bad bloom filter footer: {exc}") from None
    return FooterKeys(
        min_key=value(MIN_RECORD_KEY_KEY),
        max_key=value(MAX_RECORD_KEY_KEY),
        bloom=bloom,
    )


def java_min_max(keys: pa.Array | pa.ChunkedArray) -> tuple[str | None, str | None]:
    """Smallest and largest non-null string in Java ``String.compareTo`` order.

    UTF-8 byte order (what pyarrow compares) equals UTF-16 code unit order unless some
    string holds a 4-byte UTF-8 character (lead byte F0..F4) and some holds a character
    in U+E000..U+FFFF (lead byte EE or EF); only then are the strings compared in Python.
    """
    if len(keys) == keys.null_count:
        return None, None
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    has_astral = has_high_bmp = False
    for chunk in chunks:
        data = _data_bytes(chunk)
        # One reduction settles the common case (no byte from EE up: neither kind of
        # character); the two scans run only when one may be there.
        if not len(data) or int(data.max()) < 0xEE:
            continue
        has_astral = has_astral or bool(np.any(data >= 0xF0))
        has_high_bmp = has_high_bmp or bool(np.any((data == 0xEE) | (data == 0xEF)))
    if has_astral and has_high_bmp:
        values = [v for v in keys.to_pylist() if v is not None]

        def utf16(s: str) -> bytes:
            return s.encode("utf-16-be", errors="surrogatepass")

        return min(values, key=utf16), max(values, key=utf16)
    bounds = pc.min_max(keys)
    return bounds["min"].as_py(), bounds["max"].as_py()


def _data_bytes(arr: pa.Array) -> np.ndarray:
    """The value bytes of a string array (possibly beyond its slice: only used as a hint)."""
    buffers = arr.buffers()
    data = buffers[2] if len(buffers) > 2 else None
    if data is None:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _check_meta_columns(table: pa.Table) -> None:
    names = table.column_names[:len(META_COLUMNS)]
    if tuple(names) != META_COLUMNS:
        raise ValueError(f"a base file must start with the meta columns {list(META_COLUMNS)}, "
                         f"got {names}")
    for field in (table.schema.field(i) for i in range(len(META_COLUMNS))):
        t = field.type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_string_view(t)):
            raise ValueError(f"meta column {field.name!r} must be a string, got {t}")


def _check_file_names(table: pa.Table, name: str) -> None:
    column = table.column(_FILE_NAME)
    if len(column) == column.null_count:
        return
    if pa.types.is_dictionary(column.type) and all(
            chunk.dictionary.to_pylist() in ([name], []) for chunk in column.chunks):
        return  # every value is one of the dictionaries' values: the name alone
    distinct = pc.unique(column.combine_chunks())
    if pa.types.is_dictionary(distinct.type):
        distinct = distinct.cast(distinct.type.value_type)
    wrong = [v for v in distinct.to_pylist() if v is not None and v != name]
    if wrong:
        raise ValueError(f"row(s) have a {_FILE_NAME} other than {name!r}: {wrong[0]!r}")
