"""Table versions (Hudi's ``HoodieTableVersion``): what each one means on disk, decided here.

tidelake writes table version 8 by default, version 6 on request
(``hoodie.write.table.version=6``, as Hudi 1.x does for readers that only know 0.14/0.15:
Athena, older Trino, daft) and version 9 on request (``=9``, what Hudi 1.1 and 1.2 write;
``docs/table-version-9.md``). It reads 6, 8 and 9. Every rule that differs between the
versions is a field of :class:`TableVersion`, so a module asks the table's version object
(``TableConfig.table_version``) instead of comparing version numbers itself.

======================  ==========================================  ==============================
                        version 6 (0.14/0.15, timeline layout 1)    version 8 (1.0, layout 2)
======================  ==========================================  ==============================
timeline folder         ``.hoodie``                                 ``.hoodie/timeline``
completed instant       ``T.<action>`` (no completion time: order   ``T_C.<action>`` (ordered by
                        by requested time)                          completion time ``C``)
commit metadata         JSON (``HoodieCommitMetadata`` via Jackson)  Avro object container file
log file name           ``.F_<slice base instant>.log.<N>_<tok>``,  ``.F_<instant>.log.1_<tok>``,
                        ``N`` the next version of the slice         one file per deltacommit
compaction              under the table lock, writers wait          beside writers
                        (:attr:`compaction_holds_lock`)
archived instants       ``.hoodie/archived`` (not written here)     LSM history
metadata table          not kept by tidelake (see below)            kept (``files`` and indexes)
clustering              a ``replacecommit`` (not written here)      its own ``clustering`` action
non-blocking writers    no (Hudi 1.x: v8 only)                      yes
======================  ==========================================  ==============================

Version 9 is version 8 with these differences (``docs/table-version-9.md``): the ordering
field is recorded as ``hoodie.table.ordering.fields`` (:attr:`TableVersion.ordering_fields_key`),
the merge mode alone says how records merge (no payload class, no merge strategy id:
:attr:`TableVersion.writes_payload_and_strategy`), ``hoodie.table.format=native`` is recorded,
and the metadata table's column and partition stats carry a ``valueType`` (V2 layout, Hudi
1.1's record schema: :attr:`TableVersion.column_stats_value_types`).

The metadata table on version 6: Hudi 1.x writes a version-6 MDT there (without
``partition_stats``, secondary and expression indexes), but the readers that need version 6
do not depend on it (hudi-rs never reads the MDT of a v6 table, daft lists the folders,
Java readers list when ``hoodie.table.metadata.partitions`` declares none), and a v6 MDT
is a merge-on-read table of its own with the v6 log rules. tidelake therefore keeps no MDT
on a version-6 table (one Java wrote is deleted at the first write), and refuses the
options that need one.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import UnsupportedTableError

WRITE_TABLE_VERSION = "hoodie.write.table.version"


@dataclass(frozen=True)
class TableVersion:
    """What one table version means on disk (Hudi's ``HoodieTableVersion``)."""

    code: int
    timeline_layout: int
    """``hoodie.timeline.layout.version``: 1 for versions before 8, 2 from 8 on."""
    writable: bool
    """tidelake writes tables of this version (and runs their services)."""

    @property
    def completion_times(self) -> bool:
        """Completed instants carry a completion time in their file name and are ordered by
        it (layout 2); before, they are ordered by their requested time."""
        return self.timeline_layout >= 2

    @property
    def timeline_in_subfolder(self) -> bool:
        """The active timeline lives in ``.hoodie/<hoodie.timeline.path>`` (layout 2), not
        directly in ``.hoodie``."""
        return self.timeline_layout >= 2

    @property
    def json_commit_metadata(self) -> bool:
        """Completed (and inflight) commit, deltacommit and replacecommit files hold JSON;
        from version 8 on they are Avro object container files."""
        return self.code < 8

    @property
    def logs_named_by_slice(self) -> bool:
        """A log file carries the base instant of the file slice it belongs to, and a new
        write to the slice adds the next log version; from version 8 on a log file carries
        the instant that wrote it and belongs to the slice by completion time."""
        return self.code < 8

    @property
    def keeps_metadata_table(self) -> bool:
        """tidelake keeps the metadata table on tables of this version (module doc)."""
        return self.code >= 8

    @property
    def lsm_history(self) -> bool:
        """Archived instants go to the LSM history (``.hoodie/timeline/history``); before
        version 8 they go to ``.hoodie/archived`` log files, which tidelake does not write."""
        return self.timeline_layout >= 2

    @property
    def clustering_action(self) -> bool:
        """Clustering has its own ``clustering`` action (before: a ``replacecommit``, which
        tidelake does not write)."""
        return self.code >= 8

    @property
    def compaction_holds_lock(self) -> bool:
        """A compaction is planned and executed within one hold of the table lock, only
        when no write is in flight, and no write begins while a plan is pending (a plan
        left by a dead executor is dropped first): before version 8 a log written while a
        plan is pending would have to go into the slice the plan starts (named by its
        instant), which readers other than Java's (hudi-rs) do not merge with the slice
        before it. From version 8 on, slicing by completion time lets writers go on."""
        return self.code < 8

    @property
    def non_blocking_concurrency(self) -> bool:
        """``NON_BLOCKING_CONCURRENCY_CONTROL`` is possible (Hudi 1.x: version 8 on)."""
        return self.code >= 8

    @property
    def ordering_fields_key(self) -> str:
        """The ``hoodie.properties`` key of the ordering field: ``hoodie.table.ordering.fields``
        from version 9 on (Hudi 1.1 allows several fields; tidelake one), before it
        ``hoodie.table.precombine.field``."""
        return ("hoodie.table.ordering.fields" if self.code >= 9
                else "hoodie.table.precombine.field")

    @property
    def writes_payload_and_strategy(self) -> bool:
        """``hoodie.properties`` records the payload class and merge strategy id of the merge
        mode; from version 9 on the merge mode alone (RFC-97: payloads deprecated)."""
        return self.code < 9

    @property
    def records_table_format(self) -> bool:
        """``hoodie.properties`` records ``hoodie.table.format=native`` (version 9 on)."""
        return self.code >= 9

    @property
    def column_stats_value_types(self) -> bool:
        """Metadata-table files carry Hudi 1.1's record schema and column / partition stats
        carry a ``valueType`` with bounds in the V2 wrappers (version 9 on)."""
        return self.code >= 9

    @property
    def versioned_index_definitions(self) -> bool:
        """``.hoodie/.index_defs/index.json`` gives every definition a ``version`` (column
        stats ``V2``) and the record index a definition of its own, as Hudi 1.1 writes
        (version 9 on); Hudi 1.0 (version 8) writes column stats' without a version and
        none for the record index (``docs/table-version-9.md`` §4)."""
        return self.code >= 9

    @property
    def initial_version_property(self) -> bool:
        """``hoodie.properties`` records ``hoodie.table.initial.version`` and the layout-2
        folders (``hoodie.timeline.path``, ``hoodie.timeline.history.path``), as 1.x does."""
        return self.code >= 8


SIX = TableVersion(6, timeline_layout=1, writable=True)
EIGHT = TableVersion(8, timeline_layout=2, writable=True)
NINE = TableVersion(9, timeline_layout=2, writable=True)

_BY_CODE = {v.code: v for v in (SIX, EIGHT, NINE)}
WRITE_VERSIONS = tuple(v.code for v in _BY_CODE.values() if v.writable)
"""The versions ``hoodie.write.table.version`` accepts."""


def table_version(code: int) -> TableVersion:
    """The :class:`TableVersion` of ``hoodie.table.version`` ``code``; raises
    :class:`~engine.errors.UnsupportedTableError` for versions tidelake cannot read."""
    found = _BY_CODE.get(code)
    if found is None:
        raise UnsupportedTableError(
            f"table version {code} is not supported (only "
            f"{', '.join(str(c) for c in _BY_CODE)})")
    return found
