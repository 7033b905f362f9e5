"""Write markers: the data files an instant's write tasks began, recorded before each file.

Hudi's direct markers (``DirectWriteMarkers``): before a write task creates a data file it
creates an empty marker ``.hoodie/.temp/<instant>/<partition>/<file name>.marker.<IOType>``
(``CREATE`` a new base file, ``MERGE`` a base file rewritten from an older one, ``APPEND`` a
log file). A task attempt that dies after that — its file half-written, whole, or not begun —
is still named by its marker, so the instant's files are found by listing the one prefix
``.hoodie/.temp/<instant>/`` instead of every partition the instant wrote:

* before the commit point the writer deletes the marked files that no write stat names
  (:func:`reconcile`: Java's ``HoodieTable.reconcileAgainstMarkers`` in ``finalizeWrite``);
* a rollback of a failed instant deletes the marked files when the instant has markers, and
  lists the table when it has none (:func:`marked_files` returns None; Java's marker-based
  rollback strategy and its listing fallback);
* the commit and the rollback delete the marker folder afterwards (Java's
  ``quietDeleteMarkerDir`` after a commit).

Java's default on object stores is timeline-server-based markers (the driver's timeline
service batches them into a few ``MARKERS<n>`` files); tidelake has no timeline server and
uses direct markers everywhere — which Java's ``MarkerType`` documentation says its Spark
structured streaming writes always use too: one small ``PUT`` per data file, and one listing
per 1,000 files at the commit, whatever the number of partitions. Markers are written only
by tasks that run elsewhere (Spark executors) and may be retried; a writer that runs every
task once in its own process writes none (its crash leaves the instant to a listing
rollback). Readers never look in ``.hoodie``, so Java, hudi-rs and tidelake readers ignore
markers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from engine.layout.file_group import delete_unreferenced
from engine.storage import TEMP_PREFIX, Storage
from engine.timeline.active import temp_folder

MARKER_EXTENSION = ".marker."
"""What separates a marker's data file name from its I/O type (Hudi's ``MARKER_EXTN``)."""

CREATE = "CREATE"
MERGE = "MERGE"
APPEND = "APPEND"
IO_TYPES = (CREATE, MERGE, APPEND)
"""Hudi's ``IOType`` values a marker names."""


def marker_path(instant_time: str, data_path: str, io_type: str) -> str:
    """The marker of ``data_path`` (relative to the table) in ``instant_time``."""
    if io_type not in IO_TYPES:
        raise ValueError(f"io_type: {io_type!r} is not one of {', '.join(IO_TYPES)}")
    return f"{temp_folder(instant_time)}/{data_path}{MARKER_EXTENSION}{io_type}"


def create_marker(storage: Storage, instant_time: str, data_path: str, io_type: str, *,
                  fsync: bool) -> str:
    """Record that a task is about to create ``data_path``; returns the marker's path.
    Executor side, before the data file's first byte. ``fsync``: the marker is durable before
    the data file can be (a task whose files are fsynced must name them durably first).
    A marker that exists already (a retried attempt with the same write token) is kept."""
    path = marker_path(instant_time, data_path, io_type)
    with contextlib.suppress(FileExistsError):
        storage.write_new(path, b"", fsync=fsync)
    return path


def marked_files(storage: Storage, instant_time: str) -> list[str] | None:
    """The data files (paths relative to the table) the markers of ``instant_time`` name,
    sorted; None if the instant has no marker (its writer wrote none, or they were deleted
    with its commit or rollback): the caller then lists the table. One listing of the
    instant's marker folder (per 1,000 entries on an object store)."""
    root = temp_folder(instant_time)
    found: list[str] = []
    for folder, statuses in storage.walk_files(root):
        partition = folder[len(root):].lstrip("/")
        for status in statuses:
            name, sep, io_type = status.name.rpartition(MARKER_EXTENSION)
            if not sep or io_type not in IO_TYPES or not name:
                continue  # not a marker (the error rows a sink stages there)
            found.append(f"{partition}/{name}" if partition else name)
    return sorted(found) if found else None


def reconcile(storage: Storage, instant_time: str, referenced: Iterable[str]) -> list[str] | None:
    """Delete the marked data files of ``instant_time`` that ``referenced`` (the write stats'
    paths) does not name — files of task attempts that failed, whole or half-written — and
    return their paths. Driver side, before the commit point, so no reader ever sees them.
    An instant without markers (tasks that wrote none) has the partitions ``referenced``
    names listed instead (:func:`~engine.layout.file_group.delete_unreferenced`); None then.

    A local file that was still being written when its task died sits under a temporary name
    beside the data file's (``.tmp.<hex>.<name>``, :meth:`~engine.storage.Storage.write_new_with`);
    the folders of such files are listed for it — only folders with a file to delete, so a
    commit without failed attempts lists nothing but the marker folder.
    """
    keep = set(referenced)
    marked = marked_files(storage, instant_time)
    if marked is None:
        delete_unreferenced(storage, instant_time, keep)
        return None
    stray = [path for path in marked if path not in keep]
    for path in stray:
        storage.delete(path)
    by_folder: dict[str, set[str]] = {}
    for path in stray:
        folder, _, name = path.rpartition("/")
        by_folder.setdefault(folder, set()).add(name)
    for folder, names in sorted(by_folder.items()):
        for status in storage.list_dir(folder):
            if (status.name.startswith(TEMP_PREFIX)
                    and status.name[len(TEMP_PREFIX):].partition(".")[2] in names):
                storage.delete(f"{folder}/{status.name}" if folder else status.name)
    return stray
