"""The MDT's index partitions, registered in one place (:data:`INDEX_PARTITIONS`: ``files``
is always kept and is none of them), and what a writer asks of them all.
:mod:`engine.metadata.sync` reads them from here; the shape they share
(:class:`~engine.metadata.indexes.IndexPartition`) is :mod:`engine.metadata.indexes`'s,
which imports none of them. A new partition is its module and one line below."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from engine.metadata import bloom_filters, column_stats, partition_stats, record_index
from engine.metadata.indexes import IndexPartition

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.metadata.writer import MetadataUpdate

__all__ = ["INDEX_PARTITIONS", "removal_updates", "wanted_partitions"]

INDEX_PARTITIONS: dict[str, IndexPartition] = {p.name: p for p in (
    bloom_filters.PARTITION,
    column_stats.PARTITION,
    partition_stats.PARTITION,
    record_index.PARTITION,
)}
"""The index partitions by MDT partition name, in the order a writer builds them."""


def wanted_partitions(write_config: WriteConfig) -> dict[str, bool | None]:
    """Index partition name → what a writer with ``write_config`` wants of it (see
    :attr:`~engine.metadata.indexes.IndexPartition.wanted`)."""
    return {p.name: p.wanted(write_config) for p in INDEX_PARTITIONS.values()}


def removal_updates(removed: Mapping[str, set[str]], instant_time: str) -> MetadataUpdate:
    """What deleting these data files (a clean, rollback or restore at ``instant_time``)
    changes in the index partitions (the writer keeps only the declared ones)."""
    from engine.metadata.writer import MetadataUpdate

    update = MetadataUpdate()
    if removed:
        for partition in INDEX_PARTITIONS.values():
            if partition.removed is not None:
                update.extend(partition.removed(removed, instant_time))
    return update
