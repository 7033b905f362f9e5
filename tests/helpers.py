"""Helpers shared by the test modules: hudi-rs as the external reader, rows in comparable shapes,
and the oracle that says what a table must hold.

The oracle is independent of the code under test: a dict of the latest row per key, written
from Hudi's rules (below) without any of the engine's merge code, so that a test comparing a
read with it checks the engine against the rules and not against itself.
"""

from __future__ import annotations

import shutil
import struct
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import pyarrow as pa
from hudi import HudiQueryType, HudiReadOptions, HudiTableBuilder

__all__ = ["COMMIT_TIME", "Oracle", "assert_hudi_rs_uses_metadata", "assert_metadata_in_step",
           "hudi_rs_read", "hudi_rs_read_custom_keygen", "java_compare",
           "java_custom_keygen_table", "row_tuples", "rows_by_key", "sorted_rows"]

COMMIT_TIME = "_hoodie_commit_time"

Rows: TypeAlias = "pa.Table | Sequence[Mapping[str, Any]]"
"""What the row helpers take: a table read (ours or hudi-rs's), or rows such as
:meth:`Oracle.snapshot`'s."""


# --- hudi-rs, the external reader -------------------------------------------------------------


def hudi_rs_read(path: str | Path, *, storage_options: Mapping[str, str] | None = None,
                 **read_options: Any) -> pa.Table:
    """Read a table with hudi-rs (PyPI ``hudi``), the external judge.

    ``as_of``, ``start``/``end`` (incremental) and ``read_optimized`` map to hudi-rs
    read options; ``storage_options`` are its object store options (an ``s3://`` table).
    An empty result is a table without columns.
    """
    builder = HudiTableBuilder.from_base_uri(str(path))
    if storage_options:
        builder = builder.with_storage_options(dict(storage_options))
    table = builder.build()
    options = HudiReadOptions()
    if read_options.get("as_of"):
        options = options.with_as_of_timestamp(read_options["as_of"])
    if read_options.get("start") is not None:
        options = options.with_query_type(HudiQueryType.Incremental).with_start_timestamp(
            read_options["start"])
        if read_options.get("end"):
            options = options.with_end_timestamp(read_options["end"])
    if read_options.get("read_optimized"):
        options = options.with_hudi_option("hoodie.read.use.read_optimized.mode", "true")
    batches = table.read(options)
    if not batches:
        return pa.table({})
    return pa.Table.from_batches(batches)


PARTITION_FIELDS = "hoodie.table.partition.fields"
KEYGEN_TYPE = "hoodie.table.keygenerator.type"
KEYGEN_CLASS = "hoodie.table.keygenerator.class"


def java_custom_keygen_table(path: Path, *, record_key: str | list[str], partition_fields: str,
                             hive_style: bool, url_encode: bool,
                             table_type: str = "COPY_ON_WRITE",
                             keygen: tuple[str, str] = (KEYGEN_TYPE, "CUSTOM"),
                             options: Mapping[str, str] | None = None) -> Path:
    """An empty table (ordering field ``ts``) whose ``hoodie.properties`` are what Hudi
    1.x's writer records for its custom key generator: ``partition_fields`` as Hudi stores
    ``hoodie.table.partition.fields`` from table version 8 on, types included
    (``region:SIMPLE,day:simple``: the writer's ``hoodie.datasource.write.partitionpath.field``
    as given, ``SparkKeyGenUtils.getPartitionColumnsForKeyGenerator``), and ``keygen``, the
    key generator's key and value: the type alone by default, ``CUSTOM``, as 1.x records it
    (``KeyGeneratorType.fromClassName``; no ``.class``, as Hudi's v8/v9 samples show)."""
    from engine import Table
    from engine.layout.properties import dumps, loads

    names = [part.split(":")[0] for part in partition_fields.split(",") if part]
    Table.create(str(path), name=path.name, table_type=table_type, record_key=record_key,
                 precombine="ts", partition_by=names or None,
                 options={"hoodie.datasource.write.hive_style_partitioning":
                          str(hive_style).lower(),
                          "hoodie.datasource.write.partitionpath.urlencode":
                          str(url_encode).lower(), **(options or {})})
    props_path = path / ".hoodie" / "hoodie.properties"
    props = {k: v for k, v in loads(props_path.read_text("latin-1")).items()
             if k not in (KEYGEN_TYPE, KEYGEN_CLASS)}
    props[PARTITION_FIELDS] = partition_fields
    props[keygen[0]] = keygen[1]
    props_path.write_text(dumps(props, last_key="hoodie.table.checksum"), "latin-1")
    return path


def hudi_rs_read_custom_keygen(path: str | Path, scratch: str | Path) -> pa.Table:
    """hudi-rs's read of a table of Hudi's ``CustomKeyGenerator``, whose
    ``hoodie.table.partition.fields`` entries carry their type (``region:SIMPLE``, what Hudi
    records from table version 8 on). hudi-rs 0.5.0 takes each entry for a column name and
    refuses every read of such a table (``Partition field `region\\:SIMPLE` declared in
    `hoodie.table.partition.fields` is not present in the table schema``), so it reads a copy
    (made under ``scratch``) whose entries lack the type, as Hudi records the same table's
    fields before version 8 (``HoodieTableConfig.getPartitionFieldProp``): the same files and
    folders, read as a table of the equivalent simple or complex key generator."""
    from engine.layout.properties import dumps, loads

    copy = Path(scratch) / f"{Path(path).name}-untyped-partition-fields"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy)
    props_path = copy / ".hoodie" / "hoodie.properties"
    props = loads(props_path.read_text("latin-1"))
    props[PARTITION_FIELDS] = ",".join(
        part.split(":")[0] for part in props.get(PARTITION_FIELDS, "").split(",") if part)
    props_path.write_text(dumps(props, last_key="hoodie.table.checksum"), "latin-1")
    return hudi_rs_read(copy)


def assert_hudi_rs_uses_metadata(path: str | Path, scratch: str | Path) -> None:
    """Prove hudi-rs lists the table through our metadata table (``hudi-metadata-table.md``
    §6.4): in a copy of the table, a committed base file copied into a new partition folder
    (a decoy) leaves hudi-rs's row count unchanged while ``files`` is declared, and adds
    its rows once the MDT is undeclared (so the decoy would be seen by a storage listing)."""
    from engine.layout.file_group import list_table_files
    from engine.layout.partition import write_partition_metadata
    from engine.metadata.table import set_declared_partitions
    from engine.storage import Storage

    copy = Path(scratch)
    shutil.copytree(path, copy)
    before = hudi_rs_read(copy).num_rows
    storage = Storage(str(copy))
    base = max(list_table_files(storage).base_files, key=lambda f: f.size)
    decoy = "decoy=1" if base.partition_path else ""
    name = base.name.replace(base.file_id, "99999999-9999-4999-9999-999999999999-0")
    if decoy:
        write_partition_metadata(storage, decoy, base.instant_time)
    shutil.copy(copy / base.path, copy / decoy / name)
    assert hudi_rs_read(copy).num_rows == before, "hudi-rs listed storage, not our MDT"
    set_declared_partitions(storage, ())
    assert hudi_rs_read(copy).num_rows > before, "the decoy proves nothing: it holds no rows"
    shutil.rmtree(copy)


def assert_metadata_in_step(table: Any) -> bool:
    """If ``table`` (an ``engine.Table``) keeps a metadata table, it agrees with storage
    (``tidelake table metadata validate``); returns whether it keeps one."""
    result = table.validate_metadata()
    if "files" not in result.declared:
        return False
    assert result.ok, [str(d) for d in result.differences]
    return True


# --- rows in comparable shapes ----------------------------------------------------------------


def _dicts(data: Rows, columns: Sequence[str]) -> list[dict[str, Any]]:
    """``columns`` of every row; none for a table without rows (hudi-rs: without columns)."""
    if not isinstance(data, pa.Table):
        return [{c: row[c] for c in columns} for row in data]
    if not data.num_rows:
        return []
    data = data.select(list(columns))
    if COMMIT_TIME in columns:  # a string column in every reader's output
        data = data.set_column(data.column_names.index(COMMIT_TIME), COMMIT_TIME,
                               data.column(COMMIT_TIME).cast(pa.string()))
    return data.to_pylist()


def sorted_rows(data: Rows, columns: Sequence[str], key: str = "key") -> list[dict[str, Any]]:
    """``columns`` of every row as dicts, sorted by ``key`` (a key read twice shows twice)."""
    return sorted(_dicts(data, columns), key=lambda row: row[key])


def row_tuples(data: Rows, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """``columns`` of every row as tuples, sorted (a key read twice shows twice)."""
    return sorted(tuple(row[c] for c in columns) for row in _dicts(data, columns))


def rows_by_key(data: Rows, key: str, columns: str | Sequence[str], *,
                once: bool = False) -> dict[Any, Any]:
    """key → the row's ``columns`` as a tuple (the value itself for one column name).

    A key read twice keeps its last row; ``once`` fails the test instead, naming the keys.
    """
    names = [columns] if isinstance(columns, str) else list(columns)
    rows = _dicts(data, list(dict.fromkeys([key, *names])))
    if once:
        twice = sorted(k for k, n in Counter(row[key] for row in rows).items() if n > 1)
        assert not twice, f"keys read more than once: {twice}"
    if isinstance(columns, str):
        return {row[key]: row[columns] for row in rows}
    return {row[key]: tuple(row[c] for c in names) for row in rows}


# --- the oracle -------------------------------------------------------------------------------


def java_compare(a: Any, b: Any) -> int:
    """-1, 0 or 1 as ``a`` is below, equal to or above ``b`` in Java's ``compareTo``, which
    Hudi's merge compares ordering values with. Two floats compare as ``Double.compare``
    does: numerically, then by ``doubleToLongBits`` (every NaN one bit pattern), so -0.0 is
    below 0.0 and NaN above +inf and equal to NaN (a float32 value compares as its double
    does, as ``Float.compare``). Other values compare as Python compares them."""
    if isinstance(a, float) and isinstance(b, float):
        if a < b:
            return -1
        if a > b:
            return 1
        a, b = _double_to_long_bits(a), _double_to_long_bits(b)
    return (a > b) - (a < b)


def _double_to_long_bits(value: float) -> int:
    """Java's ``Double.doubleToLongBits``: the IEEE bits as a signed long, NaN canonical."""
    if value != value:
        return 0x7FF8_0000_0000_0000
    return int(struct.unpack(">q", struct.pack(">d", value))[0])


class Oracle:
    """The rows a table must hold: key → latest row, by Hudi's rules written plainly.

    - ``ordering`` names the ordering (precombine) field. A written row replaces the held one
      unless the held row's ordering value is greater (:func:`java_compare`: -0.0 below 0.0,
      NaN the greatest; on a tie the later write wins); within
      one batch the row with the greatest value stands for its key (the later row on a tie).
      ``ordering=None``: commit-time ordering, the later write always wins.
    - A delete removes its keys; an *ordered* delete (with an ordering value) leaves a key
      whose held ordering value is greater, and is remembered in :attr:`tombstones`.
    - With an ``instant``, a write records the commit time of the keys it wrote and the rows
      after it (:meth:`snapshot` of that instant); a batch row that loses to a held row marks
      its instant in :attr:`stale_commits`.
    """

    def __init__(self, key: str = "key", ordering: str | None = "ts") -> None:
        self.key = key
        self.ordering = ordering
        self.rows: dict[Any, dict[str, Any]] = {}
        """key → the latest row, as written (without commit time)."""
        self.commit_time: dict[Any, str] = {}
        self.tombstones: dict[Any, Any] = {}
        """key → greatest ordering value of an ordered delete that took effect."""
        self.stale_commits: set[str] = set()
        self.instants: list[str] = []
        self._after: dict[str, tuple[dict[Any, dict[str, Any]], dict[Any, str]]] = {}

    def _wins(self, row: Mapping[str, Any], held: Mapping[str, Any]) -> bool:
        return self.ordering is None or java_compare(row[self.ordering],
                                                     held[self.ordering]) >= 0

    def upsert(self, rows: Iterable[Mapping[str, Any]] | pa.Table,
               instant: str | None = None) -> None:
        """Apply one batch of upserts (committed as ``instant``, if given)."""
        batch = rows.to_pylist() if isinstance(rows, pa.Table) else rows
        latest: dict[Any, dict[str, Any]] = {}
        for row in batch:
            seen = latest.get(row[self.key])
            if seen is None or self._wins(row, seen):
                latest[row[self.key]] = dict(row)
        for key, row in latest.items():
            held = self.rows.get(key)
            if held is not None and not self._wins(row, held):
                if instant is not None:
                    self.stale_commits.add(instant)
                continue
            self.rows[key] = row
            if instant is not None:
                self.commit_time[key] = instant
        self._record(instant)

    def delete(self, keys: Iterable[Any], ordering: Any = None,
               instant: str | None = None) -> None:
        """Delete ``keys``; with ``ordering``, an ordered delete at that ordering value."""
        for key in keys:
            held = self.rows.get(key)
            if ordering is not None and held is not None and self.ordering is not None \
                    and java_compare(held[self.ordering], ordering) > 0:
                continue
            self.rows.pop(key, None)
            self.commit_time.pop(key, None)
            if ordering is not None:
                before = self.tombstones.get(key, ordering)
                self.tombstones[key] = before if java_compare(before, ordering) > 0 \
                    else ordering
        self._record(instant)

    def _record(self, instant: str | None) -> None:
        if instant is not None:
            self.instants.append(instant)
            self._after[instant] = (dict(self.rows), dict(self.commit_time))

    def row(self, key: Any) -> dict[str, Any]:
        """The held row of ``key``, with its commit time when it was written with one."""
        row = self.rows[key]
        return dict(row, **{COMMIT_TIME: self.commit_time[key]}) \
            if key in self.commit_time else dict(row)

    def snapshot(self, instant: str | None = None) -> list[dict[str, Any]]:
        """The rows (with their commit time where known), sorted by key: now, or right after
        ``instant``."""
        rows, times = (self.rows, self.commit_time) if instant is None else self._after[instant]
        return [dict(rows[k], **{COMMIT_TIME: times[k]}) if k in times else dict(rows[k])
                for k in sorted(rows)]


def apply_change_feed(table: Any, changes: pa.Table, schema: pa.Schema, *, key: str = "key",
                      partition: str = "region") -> None:
    """What a consumer of a change feed (``op``/``ts_ms``/``before``/``after``, Hudi's CDC
    rows) does to keep ``table`` equal to the source: per (key, partition), in ``ts_ms``
    order, a key deleted at any point is deleted first (by key and partition, without an
    ordering value), then its last insert or update is upserted (``schema``: the columns)."""
    import json

    deleted: dict[tuple[Any, Any], dict[str, Any]] = {}
    last: dict[tuple[Any, Any], dict[str, Any]] = {}
    for change in sorted(changes.to_pylist(), key=lambda r: r["ts_ms"]):
        image = json.loads(change["before"] if change["op"] == "d" else change["after"])
        ident = (image[key], image[partition])
        if change["op"] == "d":
            deleted[ident] = image
            last.pop(ident, None)
        else:
            last[ident] = image
    if deleted:
        table.delete(pa.table({key: [k for k, _ in deleted], partition: [p for _, p in deleted]}))
    if last:
        table.upsert(pa.Table.from_pylist([{c: r.get(c) for c in schema.names}
                                           for r in last.values()], schema=schema))
