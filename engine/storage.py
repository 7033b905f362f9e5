"""The storage operations a commit relies on, and their guarantees (local file system).

Contract (what the write protocol and readers depend on):

* :meth:`Storage.write_new` publishes a whole file under its final name or not at all, and
  fails with :class:`FileExistsError` if the name exists — the completed-instant file is
  published this way, so two writers can never both complete the same instant and a reader
  never sees a half-written commit. On local disk: write a hidden temporary file, fsync,
  then ``link`` it to the final name (atomic, exclusive), then unlink the temporary.
* :meth:`Storage.write_replace` publishes a whole file, replacing any previous one
  atomically (``rename``): used for ``hoodie.properties``.
* Data files are written through :meth:`temp_path_for` + :meth:`publish` so that a crash
  never leaves a partial file under a data file name; a leftover temporary file starts
  with ``.tmp.`` and matches no Hudi file pattern, so no reader ever picks it up.
* Durability: a file published with ``fsync=True`` (:meth:`write_new`, the default: timeline
  files, partition metadata; :meth:`write_replace`: ``hoodie.properties``) is
  fsynced before its link or rename, and its folder is fsynced after it, so the new name
  survives a power loss too; a folder created for a file is made durable in its parent.
  Data files written on the committing machine are not flushed one by one: the writer
  calls :meth:`sync` once (Linux ``syncfs`` of the table's file system) after all data
  files of an instant are written and before the completed instant is published. Data
  files written on other machines (Spark executors) are flushed by the task that wrote
  them, each file and its folder entry (``engine.write.write_handle.execute(..., sync=True)``),
  before the task reports them: :meth:`sync` on the driver only reaches the driver's own
  host. A power loss can then lose an uncommitted write, never a committed one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from engine.errors import UnsupportedStorageError

TEMP_PREFIX = ".tmp."

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def local_path(location: str) -> str:
    """The local folder of a table location: a path, or a ``file://`` URI.

    ``file:///data/t`` and ``file://localhost/data/t`` are ``/data/t`` (percent-escapes
    decoded); a plain path is returned as given. Any other scheme (``s3://``, ``gs://``,
    ``abfs://``, ...) raises :class:`~engine.errors.UnsupportedStorageError` naming the
    location: object storage is not supported yet, and such a string must never become a
    folder named ``s3:`` in the working directory.
    """
    match = _SCHEME.match(location)
    if match is None:
        return location
    scheme = match.group(1).lower()
    if scheme != "file":
        raise UnsupportedStorageError(
            f"{location}: {scheme}:// locations are not supported yet (object storage is "
            "planned); use a local folder or a file:// URI")
    parts = urlsplit(location)
    if parts.netloc not in ("", "localhost"):
        raise UnsupportedStorageError(
            f"{location}: a file:// URI must name a local path (file:///folder), not the "
            f"host '{parts.netloc}'")
    path = unquote(parts.path)
    if not path:
        raise UnsupportedStorageError(f"{location}: the file:// URI names no folder")
    return path


def _load_syncfs() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


_SYNCFS = _load_syncfs()

# Errors of fsync on a folder from file systems that cannot flush one (nothing to do then).
_NO_DIR_FSYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EISDIR)


def fsync_folder(folder: str) -> None:
    """Make the entries of ``folder`` durable (a file just linked or renamed into it)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


def make_folders(folder: str) -> None:
    """Create ``folder`` and its missing parents, each made durable in its parent."""
    if os.path.isdir(folder):
        return
    parent = os.path.dirname(folder)
    if parent and parent != folder:
        make_folders(parent)
    try:
        os.mkdir(folder)
    except FileExistsError:
        return
    fsync_folder(parent)


@dataclass(frozen=True)
class FileStatus:
    """A listed file: its path relative to the listed folder, and its size."""

    name: str
    size: int


class Storage:
    """Local-disk storage rooted at a table's base path; all paths are relative to it."""

    def __init__(self, base_path: str) -> None:
        self.base_path = os.path.abspath(local_path(base_path))

    def full(self, rel: str) -> str:
        """Absolute path of ``rel``; refuses paths that would leave the base folder."""
        path = os.path.normpath(os.path.join(self.base_path, rel))
        if path != self.base_path and not path.startswith(self.base_path + os.sep):
            raise ValueError(f"path {rel!r} escapes the table folder {self.base_path}")
        return path

    def exists(self, rel: str) -> bool:
        """True if the file or folder exists."""
        return os.path.exists(self.full(rel))

    def makedirs(self, rel: str) -> None:
        """Create a folder and its parents if missing (durably, see :func:`make_folders`)."""
        make_folders(self.full(rel))

    def read(self, rel: str) -> bytes:
        """Whole file content."""
        with open(self.full(rel), "rb") as fh:
            return fh.read()

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        """``length`` bytes of a file from ``offset`` (fewer at its end): a reader that
        needs a block of a large file (an HFile's index, one data block) reads just that."""
        fd = os.open(self.full(rel), os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def size(self, rel: str) -> int:
        """File size in bytes."""
        return os.path.getsize(self.full(rel))

    def modified(self, rel: str) -> float | None:
        """Last modification time of a file (seconds since the epoch); None if missing."""
        try:
            return os.stat(self.full(rel)).st_mtime
        except FileNotFoundError:
            return None

    def list_dir(self, rel: str) -> list[FileStatus]:
        """Files (not folders) directly in ``rel``; empty if the folder is missing."""
        try:
            entries = list(os.scandir(self.full(rel)))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            try:
                if entry.is_file():
                    found.append(FileStatus(entry.name, entry.stat().st_size))
            except FileNotFoundError:  # deleted while listing (another writer's temp file)
                continue
        return found

    def list_subdirs(self, rel: str) -> list[str]:
        """Names of folders directly in ``rel``."""
        try:
            return [e.name for e in os.scandir(self.full(rel)) if e.is_dir()]
        except FileNotFoundError:
            return []

    def walk_files(self, rel: str = "", *,
                   skip: Collection[str] = ()) -> Iterator[tuple[str, list[FileStatus]]]:
        """Yield (folder relative to base, files) for every folder below ``rel``, except the
        folders named in ``skip`` (relative to base) and everything below them."""
        root = self.full(rel)
        for folder, dirs, files in os.walk(root):
            rel_folder = os.path.relpath(folder, self.base_path)
            rel_folder = "" if rel_folder == "." else rel_folder.replace(os.sep, "/")
            if skip:
                dirs[:] = [d for d in dirs
                           if (f"{rel_folder}/{d}" if rel_folder else d) not in skip]
            dirs.sort()
            stats = []
            for name in files:
                try:
                    stats.append(FileStatus(name, os.path.getsize(os.path.join(folder, name))))
                except FileNotFoundError:  # deleted while listing (rollback, clean)
                    continue
            yield rel_folder, stats

    def temp_path_for(self, rel: str) -> str:
        """Absolute path of a hidden temporary file beside ``rel``, for :meth:`publish`."""
        final = self.full(rel)
        folder, name = os.path.split(final)
        make_folders(folder)
        return os.path.join(folder, f"{TEMP_PREFIX}{uuid.uuid4().hex}.{name}")

    def publish(self, temp_abs: str, rel: str, *, exclusive: bool = True,
                durable: bool = True) -> None:
        """Move a finished temporary file to its final name (exclusive link or rename).

        ``durable``: fsync the folder afterwards, so that the new name survives a power loss
        (the caller has fsynced the file's content already).
        """
        final = self.full(rel)
        if exclusive:
            try:
                os.link(temp_abs, final)
            finally:
                os.unlink(temp_abs)
        else:
            os.replace(temp_abs, final)
        if durable:
            fsync_folder(os.path.dirname(final))

    def write_new(self, rel: str, data: bytes, *, fsync: bool = True) -> None:
        """Publish ``data`` under ``rel`` atomically; :class:`FileExistsError` if present.

        ``fsync=True``: the content and the folder entry are durable when this returns.
        ``fsync=False`` for data files, which :meth:`sync` flushes together before commit.
        """
        temp = self.temp_path_for(rel)
        with open(temp, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        self.publish(temp, rel, exclusive=True, durable=fsync)

    def sync(self) -> None:
        """Flush every written file of the table's file system to disk (one ``syncfs``)."""
        fd = os.open(self.base_path, os.O_RDONLY)
        try:
            if _SYNCFS is None or _SYNCFS(fd) != 0:
                os.sync()
        finally:
            os.close(fd)

    def write_replace(self, rel: str, data: bytes) -> None:
        """Publish ``data`` under ``rel`` atomically, replacing any previous content; content
        and folder entry are durable when this returns."""
        temp = self.temp_path_for(rel)
        with open(temp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self.publish(temp, rel, exclusive=False)

    def delete(self, rel: str) -> bool:
        """Delete a file; False if it was already gone."""
        try:
            os.unlink(self.full(rel))
            return True
        except FileNotFoundError:
            return False

    def delete_tree(self, rel: str) -> bool:
        """Delete a folder and everything in it (never the base folder); False if missing."""
        path = self.full(rel)
        if path == self.base_path:
            raise ValueError("delete_tree: refusing to delete the table folder itself")
        try:
            shutil.rmtree(path)
            return True
        except FileNotFoundError:
            return False
