"""A file group's write in an instant: which task writes it, and a write task's whole work on it.

:class:`TaskRule` decides a file group's task — its kind (create, append or merge), the slice it
writes on, what it carries; :class:`GroupWriter` is a write task's work on one file group:
resolve the batch's versions against what the group stores, decide the task, run its write
handle. :class:`~engine.write.write_client.WriteClient` plans with the first and makes the
second (:meth:`~engine.write.write_client.WriteClient.group_writer`); the streaming job's Spark
write tasks (``ingest/spark_write.py``) run it. Both are picklable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.layout.file_group import FileSlice
from engine.layout.view import TableView
from engine.merge.policy import DeletePolicy
from engine.merge.resolve import (
    VersionColumns,
    field_ordering,
    ordering_column,
    resolve,
    tombstone_keys,
)
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.timeline.commit_metadata import WriteStat
from engine.write.write_handle import execute
from engine.write.write_task import APPEND, CREATE, MERGE, WriteContext, WriteTask

# The write operations (Hudi's WriteOperationType names); the task of a group depends on them.
UPSERT = "UPSERT"
INSERT = "INSERT"
BULK_INSERT = "BULK_INSERT"
DELETE = "DELETE"


@dataclass(frozen=True)
class TaskRule:
    """Decides each file group's write task of an instant: its kind (create, append or
    merge), the slice it writes on, what it carries. The write client plans with it, and
    the streaming job's write tasks ask the same (picklable; :meth:`WriteClient.task_rule`)."""

    is_mor: bool
    log_only_inserts: bool
    """New file groups get a log file, not a base file (non-blocking concurrency)."""

    def task(self, view: TableView, partition: str, file_id: str, records: pa.Table | None,
             deletes: pa.Table | None, *, operation: str = UPSERT, task_partition: int = 0,
             stage: int = 0, attempt: int = 0, num_updates: int = 0,
             located_keys: pa.Array | None = None) -> WriteTask | None:
        """The task writing ``records`` and ``deletes`` to one file group of ``view``; None
        if it has nothing to write (a group the view does not have takes no deletes,
        unless new groups start with a log file)."""
        existing = view.latest_slice(partition, file_id)
        if existing is None:
            # bulk_insert writes base files even here: its commit is then checked as
            # under optimistic concurrency (finish), which keeps two base files from
            # starting one group twice. Deletes alone are always a log file.
            kind = (APPEND if self.log_only_inserts
                    and (operation != BULK_INSERT or records is None) else CREATE)
        elif self.is_mor:
            kind = APPEND
        else:
            kind = MERGE
        if kind == CREATE:
            deletes = None
        if records is None and deletes is None:
            return None
        base_file = existing.base_file.path if existing and existing.base_file else None
        return WriteTask(
            kind=kind, partition_path=partition, file_id=file_id, records=records,
            deletes=deletes, base_file=base_file,
            base_instant=existing.base_instant if existing else None,
            task_partition=task_partition, stage=stage, attempt=attempt,
            num_updates=num_updates, located_keys=located_keys,
            log_files=tuple(log.name for log in existing.log_files) if existing else (),
            partition_exists=existing is not None or bool(view.latest_in_partition(partition)))


@dataclass(frozen=True)
class GroupWriter:
    """Writes one file group's versions of a key batch in a write task (executor side;
    picklable, the same for every task of an instant): resolves them against what the group
    stores (:func:`engine.merge.resolve.resolve` under :attr:`policy`), decides the task
    (:class:`TaskRule`) and runs its write handle. The streaming job's Spark tasks call
    :meth:`write`; :meth:`WriteClient.group_writer` makes one."""

    context: WriteContext
    rule: TaskRule
    columns: VersionColumns
    """Where the versions keep their operation and ordering value."""
    event_time: bool
    policy: DeletePolicy

    def write(self, view: TableView, partition: str, file_id: str, rows: pa.Table, *,
              decided: bool = False, located_keys: pa.Array | None = None,
              task_partition: int = 0, stage: int = 0, attempt: int = 0) -> WriteStat | None:
        """Resolve ``rows`` (versions in arrival order, data columns plus the record key,
        partition path and :attr:`columns`) and write the winners to the group; None if
        nothing is to be written. ``decided``: an index applied the rules already (one row
        per key). ``located_keys``: the keys of ``rows`` a key lookup found in this group
        (updates in place; every other upserted key is new to the group), as the write
        client's plan tells its tasks (:attr:`~engine.write.write_task.WriteTask.
        located_keys`); None when not known. The task fsyncs the files it publishes (a
        driver's sync reaches only its own host)."""
        existing = view.latest_slice(partition, file_id)
        if decided:
            resolved = resolve(rows, columns=self.columns, event_time=self.event_time,
                               policy=self.policy, decided=True)
        else:
            stored = (self._stored_orderings(
                view, existing, tombstone_keys(rows, self.columns, event_time=self.event_time))
                if existing is not None else {})
            resolved = resolve(rows, columns=self.columns, event_time=self.event_time,
                               policy=self.policy, stored=stored)
        ctx = self.context
        data_names = [f.name for f in ctx.data_schema] + [RECORD_KEY, PARTITION_PATH]
        records = resolved.upserts.select(data_names) if resolved.upserts.num_rows else None
        deletes = self._deletes(resolved.deletes) if resolved.deletes.num_rows else None
        num_updates = 0
        if located_keys is not None:
            located_keys = located_keys.cast(pa.string())
            if records is not None:
                num_updates = int(pc.sum(pc.is_in(records.column(RECORD_KEY).cast(pa.string()),
                                                  value_set=located_keys)).as_py() or 0)
        task = self.rule.task(view, partition, file_id, records, deletes,
                              task_partition=task_partition, stage=stage, attempt=attempt,
                              num_updates=num_updates, located_keys=located_keys)
        if task is None:
            return None
        return execute(ctx, task, sync=True)

    def _deletes(self, rows: pa.Table) -> pa.Table:
        """Delete entries for the write handle: key, partition and, under event time, the
        ordering value (null for natural-order deletes)."""
        ordering_field = self.context.ordering_field
        columns: dict[str, pa.Array] = {
            RECORD_KEY: rows.column(RECORD_KEY).combine_chunks(),
            PARTITION_PATH: rows.column(PARTITION_PATH).combine_chunks(),
        }
        names = self.columns
        if ordering_field and self.event_time and names.ordering in rows.column_names:
            ordering = field_ordering(rows.column(names.ordering).combine_chunks(),
                                      self.context.data_schema.field(ordering_field).type)
            columns[ordering_field] = pc.if_else(
                rows.column(names.ordering_null).combine_chunks(),
                pa.nulls(len(ordering), ordering.type), ordering)
        return pa.table(columns)

    def _stored_orderings(self, view: TableView, slc: FileSlice, keys: pa.Array
                          ) -> dict[str, Any]:
        """The keys among ``keys`` the group stores live → their ordering values (in the
        comparable form, :func:`engine.merge.resolve.ordering_column`; None without event
        time). Reads the group's latest slice in ``view``, key and ordering columns of those
        keys only."""
        if not len(keys):
            return {}
        reader = view.slice_reader()
        ordering = self.context.ordering_field if self.event_time else None
        columns = [RECORD_KEY] + ([ordering] if ordering else [])
        found = reader.read_slice(slc, columns=columns, keys=keys.cast(pa.string()))
        stored_keys = found.column(RECORD_KEY).combine_chunks().cast(pa.string()).to_pylist()
        if not ordering:
            return dict.fromkeys(stored_keys)
        values = found.column(ordering).combine_chunks()
        values = ordering_column(values, values.type).to_pylist()
        return dict(zip(stored_keys, values, strict=True))
