"""The MDT's partitions, registered in one place: ``files`` (the listing, kept by every table
with an MDT, built first) and the index partitions a writer may enable or drop
(:data:`INDEX_PARTITIONS`), and what a writer asks of them all. :mod:`engine.metadata.sync`
reads them from here; the shape they share (:class:`~engine.metadata.indexes.IndexPartition`)
is :mod:`engine.metadata.indexes`'s, which imports none of them. A new partition is its
module and one line below."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.metadata import (
    bloom_filters,
    column_stats,
    files_partition,
    partition_stats,
    record_index,
)
from engine.metadata.indexes import IndexPartition

if TYPE_CHECKING:
    from engine.config import WriteConfig

__all__ = ["FILES_PARTITION", "INDEX_PARTITIONS", "METADATA_PARTITIONS", "wanted_partitions"]

FILES_PARTITION = files_partition.PARTITION
"""``files``: always kept while the table keeps an MDT (its initialisation creates the MDT)."""

INDEX_PARTITIONS: dict[str, IndexPartition] = {p.name: p for p in (
    bloom_filters.PARTITION,
    column_stats.PARTITION,
    partition_stats.PARTITION,
    record_index.PARTITION,
)}
"""The index partitions by MDT partition name, in the order a writer builds them."""

METADATA_PARTITIONS: dict[str, IndexPartition] = {FILES_PARTITION.name: FILES_PARTITION,
                                                  **INDEX_PARTITIONS}
"""Every partition, ``files`` first: what a commit's sync asks."""


def wanted_partitions(write_config: WriteConfig) -> dict[str, bool | None]:
    """Index partition name → what a writer with ``write_config`` wants of it (see
    :attr:`~engine.metadata.indexes.IndexPartition.wanted`)."""
    return {p.name: p.wanted(write_config) for p in INDEX_PARTITIONS.values()}
