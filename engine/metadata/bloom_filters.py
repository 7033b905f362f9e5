"""The metadata table's ``bloom_filters`` partition: every base file's bloom filter.

Keys and payloads (``hudi-metadata-table.md`` §4.5): key = B64(XXH64(partition identifier))
‖ B64(MD5(base file name)); payload ``HoodieMetadataBloomFilter`` = the filter's type code
(``DYNAMIC_V0``, or ``SIMPLE`` for a filter without one), ``timestamp`` = the instant that
wrote the file, the bytes of the filter's Base64 text (what the footer holds), ``isDeleted``.
Only base files have entries (log files have no filter). Routing: ``abs(hashCode(key)) % N``
over the partition's ``hoodie.metadata.index.bloom.filter.file.group.count`` groups (4).

* An action writing base files (commit, deltacommit, replacecommit, compaction) adds one
  entry per file; the write task that wrote the file makes it from the filter it put in the
  footer (:func:`file_update`, carried by ``WriteStat.metadata``), never by reading it again.
* A clean, rollback or restore marks the base files it deleted: type ``""``, empty bytes,
  ``isDeleted`` (Java ``createBloomFilterMetadataRecord(..., isDeleted=true)``); MDT
  compaction drops them (:func:`engine.metadata.writer._compacted`).
* Building the partition for an existing table reads each committed base file's footer.

Readers (:func:`read_filters`) look the files' keys up through the HFile block index of each
file group's base file (:func:`engine.metadata.reader.lookup_slice`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from engine.format.base_file import BaseFileWriteResult, read_footer_keys
from engine.format.bloom import BloomFilter
from engine.metadata.indexes import IndexPartition
from engine.metadata.keys import BLOOM_FILTERS as BLOOM_FILTERS_TYPE
from engine.metadata.records import MetadataRecord, bloom_filter_record
from engine.metadata.table import declared_partitions
from engine.metadata.update import MetadataUpdate
from engine.storage import Storage

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.timeline.active import Timeline
    from engine.timeline.instant import Instant

BLOOM_FILTERS = BLOOM_FILTERS_TYPE.name


def file_record(partition_path: str, file_name: str, instant_time: str,
                bloom: BloomFilter) -> MetadataRecord:
    """The entry of one base file with filter ``bloom``."""
    return bloom_filter_record(partition_path, file_name, instant_time, bloom.serialize(),
                               bloom.type_code.value)


def file_update(metadata_partitions: Iterable[str], partition_path: str, file_name: str,
                instant_time: str, result: BaseFileWriteResult) -> MetadataUpdate | None:
    """What a newly written base file adds to ``bloom_filters`` when the table keeps it
    (``metadata_partitions``: the index partitions a write task was told the table keeps):
    the filter :func:`~engine.format.base_file.write_base_file` put in its footer, as
    written. None when the table does not keep the partition or the file has no filter."""
    if result.bloom_filter is None or BLOOM_FILTERS not in metadata_partitions:
        return None
    update = MetadataUpdate()
    update.add(BLOOM_FILTERS, [bloom_filter_record(
        partition_path, file_name, instant_time, result.bloom_filter,
        result.bloom_type_code or "SIMPLE")])
    return update


def removed_update(removed: Mapping[str, Iterable[str]], instant_time: str) -> MetadataUpdate:
    """Deleted entries for the base files a clean, rollback or restore removed
    (``removed``: data partition → file names; log files are skipped)."""
    from engine.format.naming import parse_base_file

    records = [bloom_filter_record(partition, name, instant_time, None)
               for partition, names in sorted(removed.items()) for name in sorted(names)
               if parse_base_file(name) is not None]
    update = MetadataUpdate()
    if records:
        update.add(BLOOM_FILTERS, records)
    return update


def _sync(_data_timeline: Timeline, instant: Instant, content: bytes,
          _update: MetadataUpdate) -> MetadataUpdate | None:
    """What a data action changes beyond its write stats' entries: deleted entries for the
    base files a clean, rollback or restore removed."""
    from engine.metadata.files import change_of

    removed = change_of(instant, content).removed
    return removed_update(removed, instant.requested_time) if removed else None


def _build(view: TableView, write_config: WriteConfig) -> Iterator[MetadataRecord]:
    """An entry for every committed base file the listing holds (replaced ones too, until
    cleaned, as the partition's incremental updates keep them), from its footer."""
    for base in view.list_table_files().base_files:
        if base.instant_time not in view.visible:
            continue
        try:
            with view.storage.open_input(base.path, whole=False) as source:
                bloom = read_footer_keys(source).bloom
        except (OSError, ValueError):
            bloom = None
        if bloom is not None:
            yield file_record(base.partition_path, base.name, base.instant_time, bloom)


PARTITION = IndexPartition(
    name=BLOOM_FILTERS,
    wanted=lambda c: c.metadata_bloom_filter_enable,
    file_groups=lambda _view, c: c.metadata_bloom_filter_file_groups,
    build=_build,
    sync=_sync,
)


# -- reading ---------------------------------------------------------------------------------

def keeps(storage: Storage) -> bool:
    """Whether the data table declares a complete ``bloom_filters`` partition."""
    return BLOOM_FILTERS in declared_partitions(storage)


__all__ = ["BLOOM_FILTERS", "PARTITION", "file_record", "file_update", "keeps",
           "removed_update"]
