"""Reading parts of one object-store object: :class:`RangedInput`, the file
:meth:`ObjectStorage.open_input(rel, whole=False) <engine.storage.ObjectStorage.open_input>`
returns.

A reader that needs a footer and a few column chunks of a parquet file fetches just those:

* **the tail first**: opening the file is one ``GET`` of its last bytes (a suffix range,
  ``bytes=-N``), which also answers the object's size and version (ETag); ``N`` is the
  footer size the store's previous files of this table had, with a margin (:func:`tail_guess`;
  64 KiB before any was seen), so the footer usually comes in that one request. A file
  shorter than ``N`` comes whole, and no further request is made for it;
* **then only the ranges asked for**: :meth:`RangedInput.prefetch` takes the byte ranges a
  reader will read (the projected columns' chunks of the needed row groups:
  :func:`engine.format.base_file.chunk_ranges`), merges neighbours closer than
  :data:`HOLE` bytes (one request instead of two for a few wasted bytes), leaves out what is
  held already, and fetches the rest, several at a time. Any read of bytes not held (a
  footer larger than the tail guess, a reader that did not say what it needs) fetches the
  missing bytes, with :data:`READ_AHEAD` more when they are not followed by held bytes (a
  reader scanning log-block headers forward).

**One version, never mixed bytes.** Every request after the first is conditional on the
ETag the first one answered (``If-Match``), and the ETag each answer carries is compared
with it too: a file replaced between its footer and its chunks raises
:class:`~engine.errors.FileChangedError` (transient: reading it again from the start reads
one version) instead of decoding bytes of two files.
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import pyarrow as pa

from engine.errors import StorageError

TAIL_GUESS = 64 * 1024
"""The first tail fetched of a table's files, before any footer of it was seen (parquet's own
first footer read)."""
TAIL_MARGIN = 1024
"""Added to the footer size remembered (and 1/8 of it): a file whose footer is a little
larger than its neighbours' still comes in one request."""
HOLE = 16 * 1024
"""Ranges closer than this are fetched as one: on an object store a request costs what
tens of kilobytes do (its latency), and the waste stays small beside the chunks asked for."""
READ_AHEAD = 64 * 1024
"""A read of bytes not held fetches at least this much (up to the next held bytes)."""
FETCHERS = 8
"""Ranges fetched at once by :meth:`RangedInput.prefetch`."""

Fetch = Callable[[int, int], bytes]
"""``fetch(start, end)``: bytes ``[start, end)`` of the object's version that was opened;
raises :class:`~engine.errors.FileChangedError` if the object is another version now."""

FOOTERS_KEPT = 64 * 1024 * 1024
"""Bytes of footers a process keeps (:func:`known_footer`), the least recently used dropped
first. A base file is never rewritten under its name (Hudi names each file by the write that
made it), so a file read again is opened with a request conditional on the version read before
(``If-None-Match``; on Azure, which has no suffix ranges, the ``HEAD`` it makes anyway): the
store answers it with no body, and only the column chunks are fetched. Another version answers
its tail as before."""


class KnownFooter(NamedTuple):
    """The footer of one version of a file, kept by :func:`keep_footer`."""

    version: str
    """The object's ETag."""
    size: int
    footer: bytes
    """The file's last bytes: its footer and the 8 closing ones."""


class Opened(NamedTuple):
    """What the first request of a file answered (:func:`open_ranged`)."""

    tail: bytes
    """The file's last bytes (a kept footer when the store answered "not modified")."""
    size: int
    version: str | None
    """The object's ETag (None where the store gives none: nothing is kept then)."""
    fetch: Fetch
    fetched: int
    """Bytes the store sent (0 when a kept footer served)."""


_FOOTERS: OrderedDict[str, KnownFooter] = OrderedDict()
_footers_held = 0
_FOOTERS_LOCK = threading.Lock()


def known_footer(location: str) -> KnownFooter | None:
    """The footer kept of the file at ``location``, if any."""
    with _FOOTERS_LOCK:
        found = _FOOTERS.get(location)
        if found is not None:
            _FOOTERS.move_to_end(location)
        return found


def keep_footer(location: str, known: KnownFooter) -> None:
    """Keep ``known`` as the footer of the file at ``location`` (:data:`FOOTERS_KEPT`)."""
    global _footers_held
    if len(known.footer) > FOOTERS_KEPT // 16:
        return
    with _FOOTERS_LOCK:
        old = _FOOTERS.pop(location, None)
        if old is not None:
            _footers_held -= len(old.footer)
        _FOOTERS[location] = known
        _footers_held += len(known.footer)
        while _footers_held > FOOTERS_KEPT:
            _, dropped = _FOOTERS.popitem(last=False)
            _footers_held -= len(dropped.footer)


_TAILS: dict[str, int] = {}
"""Footer sizes (with their 8 closing bytes) last seen, by table location: what the next
file's first request fetches."""
_TAILS_KEPT = 4096


def tail_guess(location: str) -> int:
    """How many bytes the first request of a file of the table at ``location`` fetches."""
    seen = _TAILS.get(location)
    if seen is None:
        return TAIL_GUESS
    return seen + seen // 8 + TAIL_MARGIN


def remember_tail(location: str, needed: int) -> None:
    """Record that a file of the table at ``location`` needed its last ``needed`` bytes to
    be read (its footer): the next files' first requests fetch about that much."""
    if len(_TAILS) >= _TAILS_KEPT and location not in _TAILS:
        _TAILS.clear()
    _TAILS[location] = needed


def coalesce(ranges: Iterable[tuple[int, int]], hole: int = HOLE) -> list[tuple[int, int]]:
    """``(start, end)`` ranges sorted and merged where they overlap or lie less than
    ``hole`` bytes apart."""
    merged: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start - merged[-1][1] < hole:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


class _Ranges(io.RawIOBase):
    """A seekable read-only file over ``fetch`` and the bytes already held."""

    def __init__(self, fetch: Fetch, size: int, tail: bytes, name: str) -> None:
        self._fetch = fetch
        self._size = size
        self.name = name
        self._starts: list[int] = []
        self._parts: list[bytes] = []
        self._pos = 0
        self._lock = threading.Lock()
        self.fetched = 0
        """Bytes fetched since the open (the tail included)."""
        self.requests = 0
        """Requests made since the open (the tail's included)."""
        if tail:
            self._hold(size - len(tail), tail)

    @property
    def size(self) -> int:
        return self._size

    def _hold(self, start: int, data: bytes) -> None:
        with self._lock:
            at = bisect.bisect_left(self._starts, start)
            self._starts.insert(at, start)
            self._parts.insert(at, data)

    def held(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` not held yet, in order."""
        gaps: list[tuple[int, int]] = []
        at = start
        with self._lock:
            i = max(bisect.bisect_right(self._starts, start) - 1, 0)
            while at < end and i < len(self._starts):
                first, part = self._starts[i], self._parts[i]
                if first + len(part) <= at:
                    i += 1
                    continue
                if first > at:
                    gaps.append((at, min(first, end)))
                at = max(at, first + len(part))
                i += 1
        if at < end:
            gaps.append((at, end))
        return gaps

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch ``ranges`` (not held) and hold them; several at a time."""
        def one(span: tuple[int, int]) -> None:
            start, end = span
            data = self._fetch(start, end)
            if len(data) != end - start:
                raise StorageError(f"GET {self.name}: {len(data)} bytes answered at {start}, "
                                   f"{end - start} asked")
            self._hold(start, data)

        if len(ranges) == 1:
            one(ranges[0])
        elif ranges:
            with ThreadPoolExecutor(min(FETCHERS, len(ranges))) as pool:
                list(pool.map(one, ranges))
        self.requests += len(ranges)
        self.fetched += sum(end - start for start, end in ranges)

    def read_at(self, start: int, length: int) -> bytes:
        end = min(start + max(length, 0), self._size)
        if end <= start:
            return b""
        gaps = self.held(start, end)
        if gaps:
            # read ahead when nothing held follows (a reader scanning log-block headers)
            last_start, last = gaps[-1]
            after = self.held(last, min(last + READ_AHEAD, self._size))
            if after and after[0][0] == last:
                gaps[-1] = (last_start, after[0][1])
            self.fetch(gaps)
        out = bytearray()
        with self._lock:
            i = max(bisect.bisect_right(self._starts, start) - 1, 0)
            at = start
            while at < end:
                if i >= len(self._starts):
                    raise StorageError(f"{self.name}: bytes at {at} missing after their GET")
                first, part = self._starts[i], self._parts[i]
                if first + len(part) > at >= first:
                    take = part[at - first:min(end, first + len(part)) - first]
                    out += take
                    at += len(take)
                i += 1
        return bytes(out)

    # -- io.RawIOBase ------------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(base + offset, 0)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        length = self._size - self._pos if size is None or size < 0 else size
        data = self.read_at(self._pos, length)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class RangedInput(pa.PythonFile):
    """A random-access file over ranged reads of one version of an object (module doc).

    Built by :meth:`ObjectStorage.open_input(rel, whole=False)
    <engine.storage.ObjectStorage.open_input>`; a parquet reader takes the footer from
    :meth:`tail` (:meth:`footer` when it is larger) and says which chunks it will read with
    :meth:`prefetch` (:func:`engine.format.base_file.parquet_file`); any other reader just
    reads it."""

    ranges: _Ranges
    location: str
    """The file's URI."""
    table: str
    """The location of the table the file belongs to (the footer sizes remembered)."""
    version: str | None
    """The ETag of the version read."""
    _first: int

    @classmethod
    def over(cls, ranges: _Ranges, location: str, table: str, first: int,
             version: str | None = None) -> RangedInput:
        """The file over ``ranges``, whose first ``first`` bytes from the end the open
        fetched (pyarrow's ``PythonFile`` takes its own constructor arguments only)."""
        found = cls(ranges, mode="r")
        found.ranges, found.location, found.table, found._first = ranges, location, table, first
        found.version = version
        return found

    def tail(self) -> bytes:
        """The bytes the open fetched: the file's last ones (all of a small file)."""
        return self.ranges.read_at(self.ranges.size - self._first, self._first)

    def footer(self, length: int) -> bytes:
        """The file's last ``length`` bytes, fetching those the open did not."""
        size = self.ranges.size
        return self.ranges.read_at(max(size - length, 0), min(length, size))

    def remember_footer(self, length: int) -> None:
        """The file's footer is its last ``length`` bytes: the next files of the table are
        opened with about that much (:func:`tail_guess`), and this version's footer is kept
        for the next read of the file (:data:`FOOTERS_KEPT`)."""
        remember_tail(self.table, length)
        if self.version:
            keep_footer(self.location,
                        KnownFooter(self.version, self.ranges.size, self.footer(length)))

    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Fetch the ``(start, end)`` ranges a reader is about to read, merged where close,
        leaving out what is held; several requests at a time."""
        size = self.ranges.size
        self.ranges.fetch([gap for start, end in coalesce(ranges)
                           for gap in self.ranges.held(start, min(end, size))])

    @property
    def fetched(self) -> int:
        """Bytes fetched from the store since the open (the first request's included)."""
        return self.ranges.fetched

    @property
    def requests(self) -> int:
        """Requests made since the open (the first included)."""
        return self.ranges.requests


def open_ranged(first: Callable[[int], Opened], location: str, table: str) -> RangedInput:
    """A :class:`RangedInput` of the object at ``location`` (a file of the table at
    ``table``): ``first(n)`` makes the first request (the last ``n`` bytes, or the footer
    kept of the same version, :func:`known_footer`)."""
    opened = first(tail_guess(table))
    ranges = _Ranges(opened.fetch, opened.size, opened.tail, location)
    ranges.requests, ranges.fetched = 1, opened.fetched
    return RangedInput.over(ranges, location, table, len(opened.tail), opened.version)


__all__ = ["FOOTERS_KEPT", "HOLE", "READ_AHEAD", "TAIL_GUESS", "KnownFooter", "Opened",
           "RangedInput", "coalesce", "keep_footer", "known_footer", "open_ranged",
           "remember_tail", "tail_guess"]
