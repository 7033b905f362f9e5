"""The MDT's index partitions, every one registered: importing this module imports each module
that registers one (``files`` is always kept and is none of them), in Hudi's initialization
order, and what a writer asks of them all. :mod:`engine.metadata.sync` reads them from here;
the shape they share, and the registration, are :mod:`engine.metadata.indexes`'s, which
imports none of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import engine.metadata.bloom_filters
import engine.metadata.column_stats
import engine.metadata.record_index  # noqa: F401
from engine.metadata.indexes import INDEX_PARTITIONS

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.metadata.update import MetadataUpdate

__all__ = ["INDEX_PARTITIONS", "removal_updates", "wanted_partitions"]


def wanted_partitions(write_config: WriteConfig) -> dict[str, bool | None]:
    """Index partition name → what a writer with ``write_config`` wants of it (see
    :attr:`~engine.metadata.indexes.IndexPartition.wanted`)."""
    return {p.name: p.wanted(write_config) for p in INDEX_PARTITIONS.values()}


def removal_updates(removed: Mapping[str, set[str]], instant_time: str) -> MetadataUpdate:
    """What deleting these data files (a clean, rollback or restore at ``instant_time``)
    changes in the index partitions (the writer keeps only the declared ones)."""
    from engine.metadata.update import MetadataUpdate

    update = MetadataUpdate()
    if removed:
        for partition in INDEX_PARTITIONS.values():
            if partition.removed is not None:
                update.extend(partition.removed(removed, instant_time))
    return update
