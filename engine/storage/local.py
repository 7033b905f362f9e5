"""A local (or shared, mounted) file system's storage: exclusive create is ``link``, durability
is ``fsync`` of files and folders and one ``syncfs`` per commit (:mod:`engine.storage`)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping

import pyarrow as pa

from engine.storage.base import TEMP_PREFIX, FileStatus, Producer, Storage
from engine.storage.locations import local_path


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


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage(Storage, local=True):
    """A local (or shared, mounted) file system: exclusive create is ``link``, which every
    local file system enforces, so nothing is probed and no opt-out applies."""

    def __init__(self, location: str = "",
                 storage_options: Mapping[str, str] | None = None,
                 unsafe_single_writer: bool = False) -> None:
        self.base_path = os.path.abspath(local_path(location))

    def __getnewargs__(self) -> tuple[str]:
        return (self.base_path,)

    def __repr__(self) -> str:
        return f"LocalStorage({self.base_path!r})"

    @property
    def is_local(self) -> bool:
        return True

    def relative(self, location: str) -> str:
        path = local_path(location)
        if not os.path.isabs(path):
            path = os.path.join(self.base_path, path)
        path = os.path.normpath(path)
        if not path.startswith(self.base_path + os.sep):
            raise ValueError(f"{location} is not inside the table folder {self.base_path}")
        return os.path.relpath(path, self.base_path).replace(os.sep, "/")

    def child(self, rel: str) -> LocalStorage:
        return LocalStorage(self.full(rel))

    def open_input(self, rel: str, *, whole: bool = True) -> pa.NativeFile:
        return pa.OSFile(self.full(rel), "rb")

    def read_with_mtime(self, rel: str) -> tuple[bytes, float] | None:
        try:
            with open(self.full(rel), "rb") as fh:
                return fh.read(), os.fstat(fh.fileno()).st_mtime
        except FileNotFoundError:
            return None

    def touch_if(self, rel: str, keep: Callable[[bytes], bool]) -> bool:
        with open(self.full(rel), "rb") as fh:
            if not keep(fh.read()):
                return False
            os.utime(fh.fileno())  # the very file just read, not a successor
            return True

    def write_new_with(self, rel: str, produce: Producer, *, fsync: bool = True) -> int:
        temp = self.temp_path_for(rel)
        try:
            with pa.OSFile(temp, "wb") as sink:
                produce(sink)
            if fsync:
                _fsync_file(temp)
            size = os.path.getsize(temp)
            self.publish(temp, rel, exclusive=True, durable=fsync)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        return size

    def remove_empty_folder(self, rel: str) -> bool:
        path = self.full(rel) if rel else self.base_path
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:  # not empty
            return False
        return True

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

    def stat(self, rel: str) -> tuple[int, float]:
        found = os.stat(self.full(rel))
        return found.st_size, found.st_mtime

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

