"""The metadata table's index partitions: which ones a writer keeps, and how each is built
from the table when it is first enabled.

Each index partition registers an :class:`IndexPartition` here: its MDT partition name, its
file group count for a table, and a builder that yields every record of the partition for
the committed table (read through a :class:`~engine.layout.view.TableView` of the timeline
loaded under the lock). :func:`engine.metadata.sync.prepare` builds the partitions a writer
wants and the table does not declare, and drops the declared ones it does not want (as
Hudi's ``deleteMetadataIndexIfNecessary``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

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
    """One index partition of the MDT (``files`` is not one: it is always kept)."""

    name: str
    wanted: Callable[[WriteConfig], bool | None]
    """Whether a writer with this config keeps the partition: True builds it if missing,
    False drops it (Hudi's rule for a writer that disables an index), None (the option left
    unset) keeps what the table has — so a second writer that does not mention an index
    does not drop it from under the first."""
    file_groups: Callable[[TableView, WriteConfig], int]
    """How many file groups the partition gets when built for this table."""
    build: Callable[[TableView, WriteConfig], Iterable[MetadataRecord]]
    """Every record of the partition for the committed table the view sees."""
    sync: Callable[[Timeline, Instant, bytes, MetadataUpdate], MetadataUpdate | None] | None \
        = None
    """What a data action adds to the partition beyond its write stats' records, given the
    data timeline, the instant about to complete, its content and the update so far
    (earlier partitions' additions included); called by
    :func:`engine.metadata.sync.sync_instant` under the lock, for declared partitions."""
    removed: Callable[[Mapping[str, set[str]], str], MetadataUpdate] | None = None
    """What a clean, rollback or restore at an instant changes in the partition, from the
    files it deleted (data partition → file names); None: nothing."""


INDEX_PARTITIONS: dict[str, IndexPartition] = {}
"""Registered index partitions by MDT partition name, in Hudi's initialization order (all of
them once :mod:`engine.metadata.index_partitions` is imported: read them from there)."""


def register(partition: IndexPartition) -> IndexPartition:
    """Add an index partition to :data:`INDEX_PARTITIONS` (at import of its module)."""
    INDEX_PARTITIONS[partition.name] = partition
    return partition


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
