"""The storage contract: :class:`Storage`, the operations a commit and a reader rely on
(their guarantees per store: :mod:`engine.storage`), and what its listings return."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine.storage.locations import is_local

TEMP_PREFIX = ".tmp."
"""How the name of a local write's hidden temporary file begins: ``.tmp.<hex>.<final name>``
(:meth:`~engine.storage.LocalStorage.temp_path_for`)."""


@dataclass(frozen=True)
class FileStatus:
    """A listed file: its path relative to the listed folder, and its size."""

    name: str
    size: int


Producer = Callable[[pa.NativeFile], None]
"""Writes a whole file into the stream it is given (e.g. a ``pyarrow.parquet`` writer)."""


_IMPLEMENTATIONS: dict[bool, type[Storage]] = {}
"""The implementation ``Storage(location)`` returns for a local location (True) and for an
object store URI (False); each names itself when it subclasses :class:`Storage` (``local=``).
The package imports both, so they are there whichever of its modules was imported first."""


class Storage:
    """The storage of one table, rooted at its location; all paths are relative to it.

    ``Storage(location, storage_options)`` returns a :class:`LocalStorage` or an
    :class:`ObjectStorage` as the location says (see :mod:`engine.storage`). Picklable (the
    options travel with it to Spark executors; never shown in ``repr``).
    ``unsafe_single_writer`` (``tidelake.storage.allow.unsafe.single.writer``, a writer
    option, also taken among ``storage_options``): write to an object store that ignores
    conditional writes, with a warning, instead of refusing it.
    """

    base_path: str
    """The table location: a local absolute path, or the object store URI."""

    def __init_subclass__(cls, *, local: bool | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if local is not None:
            _IMPLEMENTATIONS[local] = cls

    def __new__(cls, location: str = "", storage_options: Mapping[str, str] | None = None,
                unsafe_single_writer: bool = False, *args: Any) -> Storage:
        if cls is Storage:
            cls = _IMPLEMENTATIONS[is_local(location)]
        return super().__new__(cls)

    # -- locations ---------------------------------------------------------------------

    def full(self, rel: str) -> str:
        """The location of ``rel`` (absolute path or URI); refuses paths leaving the table."""
        raise NotImplementedError

    def relative(self, location: str) -> str:
        """The inverse of :meth:`full`: ``rel`` of a location below the table's; raises
        ``ValueError`` for a location outside it."""
        raise NotImplementedError

    def child(self, rel: str) -> Storage:
        """The storage rooted at the folder ``rel`` (same store and options)."""
        raise NotImplementedError

    @property
    def is_local(self) -> bool:
        """True for a local (or shared, mounted) file system."""
        raise NotImplementedError

    # -- reads -------------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        """True if the file (or, locally, the folder) exists."""
        raise NotImplementedError

    def read(self, rel: str) -> bytes:
        """Whole file content."""
        raise NotImplementedError

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        """``length`` bytes of a file from ``offset`` (fewer at its end): a reader that
        needs a block of a large file (an HFile's index, one data block) reads just that."""
        raise NotImplementedError

    def open_input(self, rel: str, *, whole: bool = True) -> pa.NativeFile:
        """A random-access file to read ``rel`` with (close it after use). ``whole=False``
        for a reader that reads only parts of it (a parquet footer, some column chunks): an
        object store then fetches the file's tail and the ranges asked for instead of the
        whole object (:class:`~engine.storage.RangedInput`)."""
        raise NotImplementedError

    def size(self, rel: str) -> int:
        """File size in bytes."""
        raise NotImplementedError

    def modified(self, rel: str) -> float | None:
        """Last modification time of a file (seconds since the epoch); None if missing."""
        raise NotImplementedError

    def stat(self, rel: str) -> tuple[int, float]:
        """Size in bytes and modification time of a file, of the same version (one ``HEAD``
        on an object store); :class:`FileNotFoundError` if missing."""
        raise NotImplementedError

    def read_with_mtime(self, rel: str) -> tuple[bytes, float] | None:
        """Content and modification time of one file, both of the same version; None if
        the file is missing."""
        raise NotImplementedError

    def list_dir(self, rel: str) -> list[FileStatus]:
        """Files (not folders) directly in ``rel``; empty if the folder is missing."""
        raise NotImplementedError

    def list_subdirs(self, rel: str) -> list[str]:
        """Names of folders directly in ``rel``."""
        raise NotImplementedError

    def walk_files(self, rel: str = "", *,
                   skip: Collection[str] = ()) -> Iterator[tuple[str, list[FileStatus]]]:
        """Yield (folder relative to base, files) for every folder below ``rel``, except the
        folders named in ``skip`` (relative to base) and everything below them."""
        raise NotImplementedError

    # -- writes ------------------------------------------------------------------------

    def makedirs(self, rel: str) -> None:
        """Create a folder and its parents if missing (nothing to do on object stores)."""
        raise NotImplementedError

    def write_new(self, rel: str, data: bytes, *, fsync: bool = True) -> None:
        """Publish ``data`` under ``rel`` atomically; :class:`FileExistsError` if present.

        ``fsync=True``: the content and the folder entry are durable when this returns.
        ``fsync=False`` for data files, which :meth:`sync` flushes together before commit.
        """
        raise NotImplementedError

    def write_new_with(self, rel: str, produce: Producer, *, fsync: bool = True) -> int:
        """Publish the file ``produce`` writes as :meth:`write_new` does; its size.

        ``produce`` gets a writable stream that never carries the final name; nothing is
        published if it raises."""
        raise NotImplementedError

    def write_replace(self, rel: str, data: bytes) -> None:
        """Publish ``data`` under ``rel`` atomically, replacing any previous content; durable
        when this returns."""
        raise NotImplementedError

    def touch_if(self, rel: str, keep: Callable[[bytes], bool]) -> bool:
        """Refresh the modification time of ``rel`` if ``keep(content)`` holds for the very
        version read (an object store rewrites it conditionally on its ETag); False if it
        does not hold or the file changed meanwhile. :class:`FileNotFoundError` if missing."""
        raise NotImplementedError

    def sync(self) -> None:
        """Flush every written file to durable storage (see :mod:`engine.storage`)."""
        raise NotImplementedError

    def delete(self, rel: str) -> bool:
        """Delete a file; False if it was already gone (local disk; an object store may
        answer True for a missing object)."""
        raise NotImplementedError

    def delete_tree(self, rel: str) -> bool:
        """Delete a folder and everything in it (never the base folder); False if missing."""
        raise NotImplementedError

    def remove_empty_folder(self, rel: str) -> bool:
        """Remove the folder ``rel`` if it is empty (``""``: the table folder); True if it is
        gone. Object stores have no folders: always True."""
        raise NotImplementedError
