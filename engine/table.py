"""The public face of the engine: :class:`Table`.

Example::

    import pyarrow as pa
    from engine import Table

    t = Table.create("/tmp/trips", name="trips", table_type="MERGE_ON_READ",
                     record_key="uuid", precombine="ts", partition_by=["city"])
    t.upsert(pa.table({"uuid": ["a"], "ts": [1], "city": ["paris"], "fare": [9.5]}))
    t.read().to_pylist()
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.config import (
    CREATE_KEYS,
    P_BUCKET_ENGINE,
    P_INDEX_TYPE,
    P_MERGE_MODE,
    BucketEngine,
    IndexType,
    KeyGeneratorType,
    MergeMode,
    TableConfig,
    TableType,
    WriteConfig,
    parse_options,
    refuse_unwritable,
)
from engine.errors import InvalidOptionError, TableExistsError, TableNotFoundError
from engine.layout.file_group import FileSlice
from engine.layout.keygen import check_field_types
from engine.layout.partition import PARTITION_METAFILE
from engine.layout.properties import dumps, loads
from engine.metadata.validate import Validation
from engine.read.reader import READ_THREADS, Filters, ReadSpec, TableReader
from engine.read.scan import Scan
from engine.schema import (
    avro_data_schema,
    check_avro_names,
    check_recorded_names,
    normalize_input_schema,
)
from engine.services.base import ServiceRun, TaskRunner, local_runner
from engine.storage import Storage, normalize_location
from engine.timeline.active import HOODIE, Timeline
from engine.timeline.heartbeat import HEARTBEAT_FOLDER
from engine.timeline.instant import parse_instant_time
from engine.timeline.version import WRITE_TABLE_VERSION, WRITE_VERSIONS
from engine.write.write_client import (
    BULK_INSERT,
    DELETE,
    INSERT,
    UPSERT,
    WriteClient,
    concurrency_mode,
)

if TYPE_CHECKING:
    from engine.read.options import ReadOptions

PROPERTIES = f"{HOODIE}/hoodie.properties"
_CREATE_KEYS = tuple(key for spec in CREATE_KEYS for key in (spec.key, *spec.aliases))
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class TimelineEntry:
    """One instant as :meth:`Table.timeline` reports it."""

    instant_time: str
    action: str
    state: str
    completion_time: str | None


def _fields(arg: str, value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, Sequence):
        items = [str(v).strip() for v in value]
    else:
        raise ValueError(f"{arg}: expected a column name or a list of names, got {value!r}")
    if any(not v for v in items):
        raise ValueError(f"{arg}: empty column name in {value!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"{arg}: column named twice in {value!r}")
    nested = next((v for v in items if "." in v), None)
    if nested and arg in ("record_key", "partition_by"):
        raise ValueError(f"{arg}: {nested!r} names a nested field; tidelake makes record keys "
                         "and partition paths of top-level columns only (docs/engine.md, "
                         "\"Record keys and the index type\")")
    return tuple(items)


def _check_bucket_engine(config: TableConfig) -> None:
    """Consistent hashing is for MERGE_ON_READ tables only (Java's copy-on-write path
    rejects it: a resize would have to rewrite base files under every writer)."""
    if config.consistent_hashing and not config.is_mor:
        raise InvalidOptionError(
            P_BUCKET_ENGINE, "CONSISTENT_HASHING needs a MERGE_ON_READ table (as in Hudi)")
    if config.consistent_hashing and not config.table_version.clustering_action:
        raise InvalidOptionError(
            P_BUCKET_ENGINE, "CONSISTENT_HASHING resizes buckets by clustering, which "
            f"tidelake writes on table version 8 only ({WRITE_TABLE_VERSION})")


def _check_instant_arg(arg: str, value: str | None) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise ValueError(f"{arg}: expected an instant time string, got {value!r}")
    try:
        parse_instant_time(value)
    except ValueError:
        raise ValueError(f"{arg}: {value!r} is not an instant time yyyyMMddHHmmss[SSS]") \
            from None


class Table:
    """A Hudi table (version 8, or 6 with ``hoodie.write.table.version=6``) on local disk or
    an object store: create or open it, write, read.

    ``storage_options`` (every constructor) are the object store's settings and credentials
    (object_store keys such as ``aws_endpoint_url``, ``aws_region``, ``aws_access_key_id``,
    ``aws_secret_access_key``, ``aws_allow_http``; see :mod:`engine.storage`); they override
    the store's environment and are never logged nor written to the table.
    """

    def __init__(self, path: str, config: TableConfig, write_config: WriteConfig,
                 storage_options: Mapping[str, str] | None = None) -> None:
        self.path = normalize_location(path)
        """The table's location: a local folder (a ``file://`` location given to
        create/open, decoded) or an object store URI (``s3://bucket/path``)."""
        self.storage = Storage(self.path, storage_options,
                               write_config.allow_unsafe_single_writer)
        self.storage_options: Mapping[str, str] = dict(storage_options or {})
        self.config = config
        self.write_config = write_config
        concurrency_mode(config, write_config, self.storage)  # a bad mode fails here

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str, *, name: str, record_key: str | Sequence[str],
               table_type: str = "MERGE_ON_READ", precombine: str | None = None,
               partition_by: str | Sequence[str] | None = None,
               options: Mapping[str, Any] | None = None,
               schema: pa.Schema | None = None,
               storage_options: Mapping[str, str] | None = None) -> Table:
        """Create a new table at ``path`` (a folder, ``file://``, ``s3://``, ``gs://``,
        ``az://`` or ``abfs[s]://`` URI); raises if one exists there already, and
        :class:`~engine.errors.UnsupportedStorageError` for other URIs."""
        table = cls.define(path, name=name, record_key=record_key, table_type=table_type,
                           precombine=precombine, partition_by=partition_by, options=options,
                           schema=schema, storage_options=storage_options)
        table.materialize()
        return table

    @classmethod
    def define(cls, path: str, *, name: str, record_key: str | Sequence[str],
               table_type: str = "MERGE_ON_READ", precombine: str | None = None,
               partition_by: str | Sequence[str] | None = None,
               options: Mapping[str, Any] | None = None,
               schema: pa.Schema | None = None,
               storage_options: Mapping[str, str] | None = None) -> Table:
        """A new table at ``path`` that exists only in memory until :meth:`materialize`.

        Arguments are checked as :meth:`create` checks them; raises
        :class:`~engine.errors.TableExistsError` if a table exists at ``path`` already. A
        writer that must not leave a table behind unless its first commit succeeds (the
        streaming sink) defines it first and materializes it just before that commit.
        """
        if not isinstance(path, str) or not path:
            raise ValueError(f"path: expected a folder path, got {path!r}")
        path = normalize_location(path)
        if not isinstance(name, str) or not name or not set(name) <= _NAME_OK:
            raise ValueError(f"name: {name!r} must be letters, digits and underscores only")
        try:
            ttype = TableType(str(table_type).upper())
        except ValueError:
            raise ValueError(f"table_type: expected MERGE_ON_READ or COPY_ON_WRITE, "
                             f"got {table_type!r}") from None
        keys = _fields("record_key", record_key)
        if not keys:
            raise ValueError("record_key: at least one record key column is required")
        parts = _fields("partition_by", partition_by)
        if precombine is not None and (not isinstance(precombine, str) or not precombine
                                       or "," in precombine):
            raise ValueError(f"precombine: expected one column name, got {precombine!r}")
        write_config = WriteConfig.from_options(options, allow=_CREATE_KEYS)
        # url_encode: Java escaping (plus a leading '.'); see engine/layout/partition.py
        created = parse_options(CREATE_KEYS, write_config.extra)
        mode = created["merge_mode"] or (MergeMode.EVENT_TIME_ORDERING if precombine
                                         else MergeMode.COMMIT_TIME_ORDERING)
        if mode is MergeMode.EVENT_TIME_ORDERING and not precombine:
            raise InvalidOptionError(P_MERGE_MODE, "EVENT_TIME_ORDERING needs a precombine field")
        if not parts:
            keygen = KeyGeneratorType.NON_PARTITION
        elif len(keys) > 1 or len(parts) > 1:
            keygen = KeyGeneratorType.COMPLEX
        else:
            keygen = KeyGeneratorType.SIMPLE
        storage = Storage(path, storage_options)
        if storage.exists(PROPERTIES):
            raise TableExistsError(f"a table already exists at {path}")
        create_schema = None
        if schema is not None:
            check_avro_names(schema)
            check_field_types(normalize_input_schema(schema), (*keys, *parts))
            create_schema = json.dumps(avro_data_schema(normalize_input_schema(schema), name),
                                       separators=(",", ":"))
        config = TableConfig(
            name=name, table_type=ttype, version=write_config.write_table_version,
            record_key_fields=keys,
            partition_fields=parts, precombine_field=precombine, merge_mode=mode,
            hive_style=created["hive_style"], url_encode=created["url_encode"],
            populate_meta_fields=True, create_schema=create_schema,
            database=created["database"],
            keygen_type=keygen,
            index_type=write_config.index_type,
            num_buckets=(write_config.num_buckets
                         if write_config.index_type is IndexType.BUCKET else None),
            bucket_engine=(write_config.bucket_engine
                           if write_config.index_type is IndexType.BUCKET else None),
        )
        _check_bucket_engine(config)
        return cls(path, config, write_config, storage_options)

    def materialize(self) -> None:
        """Write the table's folders and ``hoodie.properties`` (the table exists from then
        on); :class:`~engine.errors.TableExistsError` if another writer created it first."""
        storage = self.storage
        timeline = Timeline.folder_for(self.config)
        history = [f"{timeline}/history"] if self.config.table_version.lsm_history else []
        for folder in (HOODIE, timeline, *history, f"{HOODIE}/.temp", f"{HOODIE}/.aux",
                       f"{HOODIE}/.aux/.bootstrap", f"{HOODIE}/.schema",
                       f"{HOODIE}/archived"):
            storage.makedirs(folder)
        text = dumps(self.config.to_properties(), last_key="hoodie.table.checksum")
        try:
            storage.write_new(PROPERTIES, text.encode("latin-1"))
        except FileExistsError:
            raise TableExistsError(f"a table already exists at {self.path}") from None

    def discard_uncreated(self, *, remove_folder: bool = False) -> bool:
        """Remove what writes left in the folder of a table that does not exist yet (no
        ``hoodie.properties``): the timeline and scratch files, partition folders that hold
        nothing but their partition metadata file, and with ``remove_folder`` the table
        folder if empty. Nothing is removed, and False returned, once the table exists or
        while another writer's first instant is in flight (it has a heartbeat)."""
        storage = self.storage
        if storage.exists(PROPERTIES) or storage.list_dir(HEARTBEAT_FOLDER):
            return False
        storage.delete_tree(HOODIE)
        for folder, files in reversed(list(storage.walk_files())):
            if not folder or any(f.name != PARTITION_METAFILE for f in files):
                continue
            storage.delete(f"{folder}/{PARTITION_METAFILE}")
            storage.remove_empty_folder(folder)  # not empty (a subfolder with data): kept
        if remove_folder:
            storage.remove_empty_folder("")  # not empty: kept
        return True

    @property
    def exists(self) -> bool:
        """True once the table is on storage (``hoodie.properties`` written)."""
        return self.storage.exists(PROPERTIES)

    @classmethod
    def open(cls, path: str, options: Mapping[str, Any] | None = None, *,
             storage_options: Mapping[str, str] | None = None) -> Table:
        """Open an existing table at ``path`` (a folder or a URI, as :meth:`create`);
        ``options`` are writer options (see docs), ``storage_options`` the store's."""
        path = normalize_location(path)
        storage = Storage(path, storage_options)
        try:
            text = storage.read(PROPERTIES).decode("latin-1")
        except FileNotFoundError:
            raise TableNotFoundError(f"no Hudi table at {path} (no {PROPERTIES})") from None
        config = TableConfig.from_properties(loads(text))
        merged: dict[str, Any] = {}
        if config.index_type is not None:
            merged["hoodie.index.type"] = config.index_type.value
        if config.num_buckets is not None:
            merged["hoodie.bucket.index.num.buckets"] = str(config.num_buckets)
        recorded_engine = config.bucket_engine or (
            BucketEngine.SIMPLE if config.index_type is IndexType.BUCKET else None)
        if recorded_engine is not None:
            merged[P_BUCKET_ENGINE] = recorded_engine.value
        for key, value in (options or {}).items():
            if key == WRITE_TABLE_VERSION and str(value).strip() != str(config.version):
                WriteConfig.from_options({key: value})  # a malformed value: its own message
                raise InvalidOptionError(
                    key, f"the table at {path} is version {config.version}; writing it as "
                    f"version {str(value).strip()} would change its format for every reader "
                    "(tidelake neither upgrades nor downgrades tables: leave the option out "
                    f"or set it to {config.version})")
            if (key == P_BUCKET_ENGINE and recorded_engine is not None
                    and str(value).strip().upper() != recorded_engine.value):
                raise InvalidOptionError(
                    key, f"the table records {key}={recorded_engine.value}; the engine "
                    "decides where every key lives and cannot change")
            if (key == "hoodie.bucket.index.num.buckets" and config.num_buckets is not None
                    and str(value) != str(config.num_buckets)):
                raise InvalidOptionError(
                    key, f"the table was created with {config.num_buckets} buckets; "
                    "the bucket count cannot change")
            merged[key] = value
        if config.table_version.writable:
            merged[WRITE_TABLE_VERSION] = str(config.version)
        write_config = WriteConfig.from_options(merged)
        if (config.index_type is not None
                and write_config.index_type.placement is not config.index_type.placement):
            # The index decides where a key lives; another one would not find the keys the
            # recorded one placed (e.g. BUCKET on a SIMPLE table writes a second copy).
            # BLOOM finds what SIMPLE finds (GLOBAL_ alike): either writes the other's tables.
            raise InvalidOptionError(
                P_INDEX_TYPE, f"the table records {P_INDEX_TYPE}={config.index_type.value}; "
                f"writing it with {write_config.index_type.value} would break its key "
                "placement (the index type of a table cannot change)")
        return cls(path, config, write_config, storage_options)

    # -- writes ----------------------------------------------------------------------------

    def check_writable(self, timeline: Timeline | None = None) -> None:
        """Refuse, before anything is written, a table tidelake reads but does not write: a
        read-only table version, what :func:`~engine.config.refuse_unwritable` names (a key
        encoding or key generator tidelake would write wrongly), a recorded schema with a
        name Hudi's readers refuse (:func:`~engine.schema.check_recorded_names`):
        :class:`~engine.errors.UnsupportedTableError`. ``timeline``: the snapshot the write
        starts from (loaded if not given)."""
        if not self.config.table_version.writable:
            from engine.errors import UnsupportedTableError
            raise UnsupportedTableError(
                f"table version {self.config.version} is read-only here; tidelake writes "
                f"table versions {', '.join(str(v) for v in WRITE_VERSIONS)}")
        refuse_unwritable(self.config.raw)
        check_recorded_names(timeline if timeline is not None
                             else Timeline.load(self.storage, self.config))

    def _client(self, timeline: Timeline | None = None) -> WriteClient:
        self.check_writable(timeline)
        return WriteClient(self.storage, self.config, self.write_config)

    def _write(self, operation: str, data: pa.Table,
               extra_metadata: Mapping[str, str] | None) -> str:
        timeline = Timeline.load(self.storage, self.config)
        client = self._client(timeline)
        if operation == DELETE:
            deletes = client.prepare_deletes(data, timeline)
            instant = client.write(DELETE, None, deletes, extra_metadata=extra_metadata,
                                   seen=timeline)
        else:
            records, deletes = client.prepare(data, timeline, dedupe=True)
            instant = client.write(operation, records, deletes, extra_metadata=extra_metadata,
                                   seen=timeline)
        from engine.services.table_services import run_inline
        run_inline(client)  # compaction, clustering, cleaning, archival, as options say
        return instant

    def upsert(self, data: pa.Table, *, extra_metadata: Mapping[str, str] | None = None) -> str:
        """Insert new records and update existing ones; returns the instant time."""
        return self._write(UPSERT, data, extra_metadata)

    def insert(self, data: pa.Table, *, extra_metadata: Mapping[str, str] | None = None) -> str:
        """Insert records without looking up existing keys (faster than upsert).

        As in Hudi, a key that already exists may then be stored twice (except with the
        BUCKET index, where a key always lands in the same file group). Use
        :meth:`upsert` when the keys may exist.
        """
        return self._write(INSERT, data, extra_metadata)

    def bulk_insert(self, data: pa.Table, *,
                    extra_metadata: Mapping[str, str] | None = None) -> str:
        """Like :meth:`insert`, into new file groups only (for initial loads)."""
        return self._write(BULK_INSERT, data, extra_metadata)

    def delete(self, data: pa.Table, *, extra_metadata: Mapping[str, str] | None = None) -> str:
        """Delete the records whose keys ``data`` holds; returns the instant time.

        ``data`` needs the record key columns; partition columns speed the lookup up (else
        every partition is searched); an ordering column makes each delete conditional
        (it only removes versions whose ordering value is not greater).
        """
        return self._write(DELETE, data, extra_metadata)

    # -- reads -----------------------------------------------------------------------------

    def _reader(self, *, as_of: str | None = None, start: str | None = None) -> TableReader:
        timeline = Timeline.load(self.storage, self.config)
        if as_of is not None or start is not None:
            from engine.read.retention import check_readable
            check_readable(timeline, as_of=as_of, start=start)
        return TableReader(self.storage, timeline)

    def read(self, columns: Sequence[str] | None = None, filters: Filters = None,
             as_of: str | None = None, read_optimized: bool = False) -> pa.Table:
        """Snapshot read (meta fields included), or time travel ``as_of`` an instant time."""
        return self.scan(columns, filters, as_of, read_optimized).to_table(READ_THREADS)

    def scan(self, columns: Sequence[str] | None = None, filters: Filters = None,
             as_of: str | None = None, read_optimized: bool = False) -> Scan:
        """Plan the :meth:`read` with these arguments without reading it: its file slices,
        each read apart by ``scan.slice_scan.read(slice)`` (picklable: Spark tasks read
        them), and ``scan.to_table()`` the whole read (:mod:`engine.read.scan`)."""
        if columns is not None and (isinstance(columns, str)
                                    or not all(isinstance(c, str) for c in columns)):
            raise ValueError(f"columns: expected a list of column names, got {columns!r}")
        _check_instant_arg("as_of", as_of)
        spec = ReadSpec(list(columns) if columns is not None else None, filters,
                        bool(read_optimized))
        reader = self._reader(as_of=as_of)
        from engine.layout.view import TableView

        view = TableView(self.storage, reader.timeline, as_of=as_of)
        scan = reader.scan(spec, view, latest=as_of is None)
        # A planned file gone at read time (a clean ran): plan once more on the new timeline.
        scan.replan = lambda: self.scan(columns, filters, as_of, read_optimized)
        return scan

    def read_schema(self) -> pa.Schema:
        """The columns :meth:`read` returns and their types (meta fields first, as plain
        strings), from the schema the latest commit recorded."""
        from engine.read.scan import read_schema
        from engine.schema import table_schema

        timeline = Timeline.load(self.storage, self.config)
        return read_schema(table_schema(timeline), self.config.populate_meta_fields)

    def explain(self, filters: Filters = None, as_of: str | None = None,
                read_optimized: bool = False) -> dict[str, Any]:
        """What a :meth:`read` with these arguments would read: partitions and file slices
        before pruning, slices pruned by the record index (key-equality filters), by bucket
        id or base-file footers, partitions pruned by ``partition_stats`` and slices by
        ``column_stats``, the slices read (also logged at DEBUG by ``engine.read``)."""
        _check_instant_arg("as_of", as_of)
        reader = self._reader(as_of=as_of)
        from engine.layout.view import TableView

        view = TableView(self.storage, reader.timeline, as_of=as_of)
        spec = ReadSpec(None, filters, bool(read_optimized))
        _, _, report = reader.plan(spec, view, latest=as_of is None)
        return report.as_dict()

    def read_incremental(self, start: str, end: str | None = None,
                         columns: Sequence[str] | None = None,
                         filters: Filters = None) -> pa.Table:
        """Records written by commits that completed after ``start`` and up to ``end``."""
        _check_instant_arg("start", start)
        return self.scan_incremental(start, end, columns, filters).to_table(READ_THREADS)

    def scan_incremental(self, start: str | None, end: str | None = None,
                         columns: Sequence[str] | None = None, filters: Filters = None, *,
                         start_inclusive: bool = False) -> Scan:
        """Plan :meth:`read_incremental` without reading it (as :meth:`scan`); ``start``
        None reads from the first commit on (every record of the view at ``end``);
        ``start_inclusive`` counts a commit completed at ``start`` too (Hudi 1.x's
        ``hoodie.datasource.read.begin.instanttime``: completion time >= begin)."""
        _check_instant_arg("start", start)
        _check_instant_arg("end", end)
        spec = ReadSpec(list(columns) if columns is not None else None, filters)
        scan = self._reader(start=start).incremental_scan(start, end, spec,
                                                          start_inclusive=start_inclusive)
        scan.replan = lambda: self.scan_incremental(start, end, columns, filters,
                                                    start_inclusive=start_inclusive)
        return scan

    def read_changes(self, start: str | None, end: str | None = None, *,
                     start_inclusive: bool = False) -> pa.Table:
        """The change feed of the commits completed after ``start`` and up to ``end``
        (completion times; ``start_inclusive``: from ``start`` on, as Hudi 1.x's begin
        instant time): one row per record a commit inserted, updated or deleted, as Hudi's
        CDC query returns them — ``op`` (``i``/``u``/``d``), ``ts_ms`` (the commit's instant
        time), ``before`` and ``after`` (the data columns as JSON text). ``start`` None: the
        table as of ``end`` as inserts. See :mod:`engine.read.changes`."""
        _check_instant_arg("start", start)
        _check_instant_arg("end", end)
        from engine.read.changes import read_changes

        reader = self._reader(start=start)
        return read_changes(self.storage, reader.timeline, start, end,
                            start_inclusive=start_inclusive)

    # -- table services --------------------------------------------------------------------

    def rollback_failed_writes(self) -> list[str]:
        """Roll back pending writes whose writer is gone (heartbeat expired, or its process
        provably ended); returns their instant times. Every write does this first."""
        return self._client().rollback_failed_writes()

    def validate_metadata(self) -> Validation:
        """Compare the metadata table with storage and report every difference (see
        :mod:`engine.metadata.validate`); reads only."""
        from engine.metadata.validate import validate
        return validate(self.storage, Timeline.load(self.storage, self.config))

    def rebuild_metadata(self) -> None:
        """Drop the metadata table and build it from the committed files, under the table
        lock (``hoodie.metadata.enable=false`` in the options: drop it only)."""
        from engine.metadata import sync
        client = self._client()
        with client.lock:
            timeline = Timeline.load(self.storage, self.config)
            if client.keeps_metadata:
                sync.rebuild(self.storage, timeline, self.write_config)
            else:
                sync.disable(self.storage)

    def clean(self, *, schedule_only: bool = False) -> ServiceRun:
        """Delete file slices outside retention (``hoodie.cleaner.*``); see docs/engine.md."""
        from engine.services.clean import run_clean
        return run_clean(self._client(), schedule_only=schedule_only)

    def savepoint(self, instant: str | None = None, *, comment: str = "") -> str:
        """Savepoint a completed commit (default: the latest); returns its instant time."""
        from engine.services.savepoint import create_savepoint
        return create_savepoint(self._client(), instant, comment)

    def delete_savepoint(self, instant: str) -> None:
        """Remove the savepoint at ``instant``."""
        from engine.services.savepoint import delete_savepoint
        delete_savepoint(self._client(), instant)

    def savepoints(self) -> list[str]:
        """Instant times of the table's savepoints, oldest first."""
        from engine.services.savepoint import savepoints
        return savepoints(Timeline.load(self.storage, self.config))

    def compact(self, *, schedule_only: bool = False, instant: str | None = None,
                runner: TaskRunner | None = None) -> ServiceRun:
        """Compact now (MERGE_ON_READ): plan every file slice with logs, whatever the trigger
        says (unless ``instant`` names a plan to execute), then execute pending plans
        (:mod:`engine.services.compaction`); raises
        :class:`~engine.errors.UnsupportedTableError` on a copy-on-write table."""
        from engine.services.compaction import compact
        _check_instant_arg("instant", instant)
        return compact(self._client(), schedule_only=schedule_only, instant=instant,
                       runner=runner)

    def cluster(self, *, schedule_only: bool = False, instant: str | None = None,
                runner: TaskRunner | None = None) -> ServiceRun:
        """Schedule a clustering plan if one qualifies (not with ``instant``), then execute
        ``instant`` or every pending plan (not with ``schedule_only``)."""
        from engine.services.clustering import run_clustering, schedule_clustering
        _check_instant_arg("instant", instant)
        client = self._client()
        scheduled = schedule_clustering(client) if instant is None else None
        if schedule_only:
            return ServiceRun("clustering", scheduled)
        run = run_clustering(client, instant, runner=runner or local_runner)
        return ServiceRun(run.service, scheduled, run.completed, run.details)

    def archive(self) -> ServiceRun:
        """Move old instants of the active timeline into the LSM history if due
        (``hoodie.keep.min.commits`` / ``hoodie.keep.max.commits``); see docs/engine.md."""
        from engine.services.archive import run_archive
        return run_archive(self._client())

    def timeline(self, include_archived: bool = False) -> list[TimelineEntry]:
        """Every instant on the active timeline, oldest first; with ``include_archived``,
        the archived instants of the LSM history too (state ``completed``)."""
        timeline = Timeline.load(self.storage, self.config)
        entries = [TimelineEntry(i.requested_time, i.action.value, i.state.value,
                                 i.completion_time) for i in timeline.instants]
        if include_archived:
            entries += [TimelineEntry(r.requested_time, r.action, "completed", r.completion_time)
                        for r in timeline.archived() if r.requested_time not in
                        timeline.active_times]
            entries.sort(key=lambda e: e.instant_time)
        return entries

    def file_slices(self) -> list[FileSlice]:
        """The latest file slice of every live file group."""
        from engine.layout.view import TableView

        reader = self._reader()
        return TableView(reader.storage, reader.timeline).latest_file_slices()

    def __repr__(self) -> str:
        return (f"Table({self.path!r}, name={self.config.name!r}, "
                f"type={self.config.table_type.value})")

    # -- what the streaming job (ingest/) asks of the table beyond reads and writes --------

    def write_client(self) -> WriteClient:
        """The table's write client, as its writers and table services run with it (the
        streaming job's service thread schedules and executes plans through it,
        :mod:`engine.services.table_services`)."""
        return WriteClient(self.storage, self.config, self.write_config)

    @property
    def archives_automatically(self) -> bool:
        """Whether writers archive after their commits (``hoodie.archive.automatic``; never
        on a table version whose history tidelake does not write)."""
        from engine.services.archive import archives_automatically
        return archives_automatically(self.config, self.write_config)

    def plan_read(self, options: ReadOptions) -> Scan:
        """The read Hudi's read ``options`` ask for (:class:`~engine.read.options.ReadOptions`):
        an incremental read from ``begin_instant`` (inclusive, as Hudi 1.x) to
        ``end_instant``, else a snapshot or read-optimized read, as of ``as_of_instant`` if
        given; of the options' ``columns`` and ``filters`` (JSON values typed by their
        columns: :func:`~engine.read.options.typed_filters`), pruned by them as
        :meth:`scan` prunes. A Spark read source plans with it on the driver and reads each
        slice in a task (:mod:`engine.read.distributed`)."""
        from engine.read.options import QueryType, check_columns, typed_filters

        columns = list(options.columns) if options.columns is not None else None
        filters = None
        if columns is not None or options.filters is not None:
            schema = self.read_schema()
            if columns is not None:
                check_columns(columns, schema)
            if options.filters is not None:
                filters = typed_filters(options.filters, schema)
        if options.query_type is QueryType.INCREMENTAL:
            return self.scan_incremental(options.begin_instant, options.end_instant, columns,
                                         filters, start_inclusive=True)
        return self.scan(columns, filters, options.as_of_instant,
                         read_optimized=options.query_type is QueryType.READ_OPTIMIZED)
