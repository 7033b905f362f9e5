"""The shape every index partition of the metadata table has (:class:`IndexPartition`), and
the runner its builders split their work over.

An index partition is one module (:mod:`engine.metadata.bloom_filters`,
:mod:`~engine.metadata.column_stats`, :mod:`~engine.metadata.partition_stats`,
:mod:`~engine.metadata.record_index`) that defines one ``PARTITION``: its MDT partition name,
whether a writer keeps it, its file group count, how it is **initialised from the table**
(every record for the committed table a :class:`~engine.layout.view.TableView` sees), and the
**records a commit's metadata adds** beyond its write stats' (``sync``: for a clean, rollback
or restore, what the files it removed take away). Its **lookup** is the read side's, keyed by
the partition's name (:func:`engine.metadata.lookups.lookup`, below the view, with the payload
decoded on top: ``read_filters``, ``record_index_lookup.lookup_locations``, data skipping's
stats), so a reader never imports a writer's module. ``files`` has the same shape
(:mod:`engine.metadata.files_partition`). The partitions are registered in one place,
:mod:`engine.metadata.index_partitions`; :mod:`engine.metadata.sync` iterates them:
:func:`~engine.metadata.sync.prepare` builds the partitions a writer wants and the table does
not declare and drops the declared ones it does not want (as Hudi's
``deleteMetadataIndexIfNecessary``), :func:`~engine.metadata.sync.sync_instant` asks every
declared one, ``files`` first, for a commit's records. A new partition (the secondary index)
is one module and one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from engine.metadata.records import MetadataRecord
from engine.tasks import TaskRunner

T = TypeVar("T")
R = TypeVar("R")

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.metadata.update import MetadataUpdate
    from engine.timeline.active import Timeline
    from engine.timeline.instant import Instant


@dataclass(frozen=True)
class IndexPartition:
    """One partition of the MDT, as the writer keeps it (module docstring): ``files``, the
    listing every table with an MDT keeps, has the same shape."""

    name: str
    wanted: Callable[[WriteConfig], bool | None]
    """Whether a writer with this config keeps the partition: True builds it if missing,
    False drops it (Hudi's rule for a writer that disables an index), None (the option left
    unset) keeps what the table has — so a second writer that does not mention an index
    does not drop it from under the first."""
    file_groups: Callable[[TableView, WriteConfig], int]
    """How many file groups the partition gets when built for this table."""
    build: Callable[[TableView, WriteConfig], Iterable[MetadataRecord]]
    """Initialising from the table: every record of the partition for the committed table
    the view sees."""
    sync: Callable[[Timeline, Instant, bytes, MetadataUpdate], MetadataUpdate | None] | None \
        = None
    """The records a data action (a commit, or a clean, rollback or restore: what it
    removed) adds to the partition beyond its write stats' records, given the data
    timeline, the instant about to complete, its content and the update so far (earlier
    partitions' additions included); called by :func:`engine.metadata.sync.sync_instant`
    under the lock, for declared partitions; None: nothing beyond the write stats'."""
    definition: Callable[[TableView, WriteConfig], dict[str, Any] | None] | None = None
    """The partition's entry in ``.hoodie/.index_defs/index.json`` when built for this
    table (:mod:`engine.metadata.index_defs`); None (or a None answer): it has none."""


_RUNNER: ContextVar[TaskRunner | None] = ContextVar("metadata_build_runner", default=None)


@contextmanager
def build_runner(runner: TaskRunner | None) -> Iterator[None]:
    """Run the index builds started inside the block with ``runner`` (a
    :data:`~engine.services.base.TaskRunner`: Spark tasks when a SparkSession drives the
    writer; None: this process)."""
    token = _RUNNER.set(runner)
    try:
        yield
    finally:
        _RUNNER.reset(token)


def run_tasks(fn: Callable[[T], R], tasks: Sequence[T]) -> list[R]:
    """``fn`` over ``tasks`` (picklable, executor-safe) with the runner of
    :func:`build_runner`, in order: a builder splits its work (one task per file slice or
    file) and calls this, so initializing an index over a large table runs in Spark tasks
    when a SparkSession drives the writer."""
    runner = _RUNNER.get()
    if runner is None or len(tasks) < 2:
        return [fn(task) for task in tasks]
    return list(runner(fn, tasks))
