"""The active timeline: which instants exist, in which state, and the writer's transitions.

Commit protocol (docs/engine.md, "A write, step by step"), as the writer drives it:

1. :meth:`Timeline.create_requested` — ``T.<action>.requested``;
2. :meth:`Timeline.transition_to_inflight` — ``T.<action>.inflight`` (``T.inflight`` for
   ``commit``); data files are written after this;
3. :meth:`Timeline.complete` — ``T_C.<action>`` published with
   :meth:`~engine.storage.Storage.write_new` (atomic and exclusive), last. The writer
   reaches it through the commit protocol (:func:`engine.write.commit.commit_instant`),
   which first brings the metadata table in step with the instant; the timeline knows
   nothing of the metadata table and completes an instant only with the protocol's
   :class:`MetadataSynced` for it.

Readers only ever consider completed instants. An instant left requested or inflight by
a crashed writer is rolled back by the first writer after its heartbeat expired
(:mod:`engine.write.rollback`, :mod:`engine.timeline.heartbeat`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from engine.config import TableConfig
from engine.errors import CommitConflictError, CorruptTableError, InstantStateError
from engine.storage import Storage
from engine.timeline.commit_metadata import CommitMetadata
from engine.timeline.history import ArchivedInstant, ArchivedTimeline, load_archived
from engine.timeline.instant import Action, Instant, State, new_instant_time

HOODIE = ".hoodie"

DATA_ACTIONS = (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT)
DATA_ACTION_NAMES = frozenset(a.value for a in DATA_ACTIONS)
HISTORY = "history"

COMMITS_KEPT = 256
"""Parsed commit metadata a process keeps, by table and timeline file name: a completed
instant's file is never written again, and where completed names hold the completion time
(``TableVersion.completion_times``) a name read once always means the same content (a point
lookup opens the table anew and needs the latest commit's schema)."""
_COMMITS: OrderedDict[tuple[str, str], CommitMetadata] = OrderedDict()
_COMMITS_LOCK = threading.Lock()


@dataclass(frozen=True)
class MetadataSynced:
    """The commit protocol's word (:func:`engine.write.commit.commit_instant`) that the
    metadata table is in step with the instant ``instant_time`` about to complete:
    ``completion_time`` is that of the MDT deltacommit written at the instant, None when none
    was due (the table keeps no MDT, or the action changes no file listing). The instant
    completes later than it. :meth:`Timeline.complete` requires one for the very instant it
    completes; only the commit protocol and the MDT's own writer (whose table keeps no MDT)
    make them."""

    instant_time: str
    completion_time: str | None = None


class Timeline:
    """A snapshot of the table's active timeline, loaded from storage."""

    def __init__(self, storage: Storage, config: TableConfig,
                 instants: Iterable[Instant]) -> None:
        self.storage = storage
        self.config = config
        self.instants: tuple[Instant, ...] = tuple(sorted(instants))
        self._metadata_cache: dict[str, CommitMetadata] = {}
        self._archived: ArchivedTimeline | None = None
        self.memo: dict[str, Any] = {}
        """What was read from storage along with this snapshot and holds for it (the data
        table's ``hoodie.properties``, the metadata table's timeline:
        :mod:`engine.metadata.table`), read on first use and kept, so that one commit
        phase reads each once; whoever changes them through this snapshot drops them."""

    # -- loading -------------------------------------------------------------------------

    @staticmethod
    def folder_for(config: TableConfig) -> str:
        """Timeline folder relative to the base path (``.hoodie/timeline`` from v8 on)."""
        if config.table_version.timeline_in_subfolder:
            return f"{HOODIE}/{config.timeline_path}"
        return HOODIE

    @classmethod
    def load(cls, storage: Storage, config: TableConfig, *,
             reuse: Timeline | None = None) -> Timeline:
        """List the timeline folder; each instant appears once, in its furthest state.

        A savepoint carries the requested time of the commit it savepoints (Hudi's layout),
        so it is an instant of its own beside that commit. ``reuse``: an earlier snapshot
        whose parsed commit metadata is kept for the instants completed in both (a
        completed instant's file never changes), so it is not read again."""
        best: dict[tuple[str, bool], Instant] = {}
        for status in storage.list_dir(cls.folder_for(config)):
            instant = Instant.parse(status.name)
            if instant is None:
                continue
            key = (instant.requested_time, instant.action is Action.SAVEPOINT)
            seen = best.get(key)
            if seen is None or (Instant.state_rank(instant.state)
                                > Instant.state_rank(seen.state)):
                if seen is not None and instant.state is State.COMPLETED:
                    # keep the pending action name (compaction, clustering) for the record
                    instant = Instant(instant.requested_time, instant.action,
                                      State.COMPLETED, instant.completion_time)
                best[key] = instant
        loaded = cls(storage, config, best.values())
        if reuse is not None and reuse._metadata_cache:
            before = {(i.requested_time, i.completion_time)
                      for i in reuse.completed_data_instants}
            for instant in loaded.completed_data_instants:
                parsed = reuse._metadata_cache.get(instant.requested_time)
                if parsed is not None and (instant.requested_time,
                                           instant.completion_time) in before:
                    loaded._metadata_cache[instant.requested_time] = parsed
        return loaded

    def after_completing(self, done: Instant) -> Timeline:
        """This snapshot with ``done``, one of its pending instants, completed: what the
        writer that just completed it knows without listing the timeline again (parsed
        commit metadata and the history kept)."""
        kept = [i for i in self.instants if not (
            i.requested_time == done.requested_time and i.action is not Action.SAVEPOINT)]
        after = Timeline(self.storage, self.config, [*kept, done])
        after._metadata_cache = self._metadata_cache
        after._archived = self._archived
        return after

    @property
    def folder(self) -> str:
        """Timeline folder relative to the base path."""
        return self.folder_for(self.config)

    @property
    def history_folder(self) -> str:
        """The LSM history folder (``.hoodie/timeline/history``)."""
        return f"{self.folder}/{HISTORY}"

    # -- archived instants ---------------------------------------------------------------

    def archived(self) -> ArchivedTimeline:
        """The archived instants (LSM history; v8 only), loaded on first use and cached."""
        if self._archived is None:
            if self.config.timeline_layout >= 2:
                self._archived = load_archived(self.storage, self.history_folder)
            else:
                self._archived = ArchivedTimeline(())
        return self._archived

    @cached_property
    def archived_boundary(self) -> str | None:
        """Requested time of the first non-savepointed write instant on the active timeline
        (any state): instants before it are archived (Java ``isBeforeTimelineStarts``).
        None when the active timeline has no write instant."""
        savepointed = self.savepointed_times
        for instant in self.instants:
            if instant.action.writes_data and instant.requested_time not in savepointed:
                return instant.requested_time
        return None

    @cached_property
    def active_times(self) -> frozenset[str]:
        """Requested times of every instant on the active timeline."""
        return frozenset(i.requested_time for i in self.instants)

    @cached_property
    def savepointed_times(self) -> frozenset[str]:
        """Requested times of the commits with a completed savepoint."""
        return frozenset(i.requested_time for i in self.instants
                         if i.action is Action.SAVEPOINT and i.is_completed)

    def archived_completion_key(self, requested_time: str) -> str | None:
        """Completion ordering key of an archived data instant: its completion time from
        the history; its requested time if it is older than the active timeline but not in
        the history (Java: archived ⇒ completed); None if not archived. Consults the
        history only for times the active timeline does not know."""
        if requested_time in self.active_times:
            return None
        boundary = self.archived_boundary
        row = self.archived().get(requested_time)
        if row is not None:
            if row.action not in DATA_ACTION_NAMES:
                return None
            return row.completion_time or row.requested_time
        if boundary is not None and requested_time < boundary:
            return requested_time
        return None

    def archived_commit_metadata(self, row: ArchivedInstant) -> CommitMetadata:
        """Parsed commit metadata of an archived data instant (from its history row)."""
        key = row.requested_time
        if key not in self._metadata_cache:
            data = row.metadata if row.metadata is not None \
                else self.archived().metadata(key)
            try:
                self._metadata_cache[key] = CommitMetadata.from_bytes(data or b"")
            except CorruptTableError as exc:
                raise CorruptTableError(
                    f"timeline history row of instant {key}: {exc}") from exc
        return self._metadata_cache[key]

    # -- queries -------------------------------------------------------------------------

    @cached_property
    def completed_data_instants(self) -> tuple[Instant, ...]:
        """Completed commit/deltacommit/replacecommit instants, in completion order."""
        done = [i for i in self.instants
                if i.is_completed and i.action.completed_action in DATA_ACTIONS]
        return tuple(sorted(done, key=completion_key))

    def pending(self, actions: Iterable[Action] | None = None) -> list[Instant]:
        """Requested or inflight instants (optionally of the given actions)."""
        wanted = set(actions) if actions is not None else None
        return [i for i in self.instants
                if not i.is_completed and (wanted is None or i.action in wanted)]

    def find(self, requested_time: str) -> Instant | None:
        """The instant requested at ``requested_time`` (a savepoint, which shares its
        commit's time, is not it), in its furthest state; None if not on the timeline."""
        return next((i for i in self.instants if i.requested_time == requested_time
                     and i.action is not Action.SAVEPOINT), None)

    def completion_time_of(self, requested_time: str) -> str | None:
        """Completion time (v8) or requested time (v6) of a completed data instant."""
        for instant in self.completed_data_instants:
            if instant.requested_time == requested_time:
                return completion_key(instant)
        return None

    @cached_property
    def completed_times(self) -> frozenset[str]:
        """Requested times of all completed data instants."""
        return frozenset(i.requested_time for i in self.completed_data_instants)

    def latest_instant_time(self) -> str:
        """Greatest requested or completion time anywhere on the timeline ('' if empty)."""
        latest = ""
        for instant in self.instants:
            latest = max(latest, instant.requested_time, instant.completion_time or "")
        return latest

    def commit_metadata(self, instant: Instant) -> CommitMetadata:
        """Parsed metadata of a completed data instant (cached with this snapshot, and per
        process by file name when the name holds the completion time:
        :data:`COMMITS_KEPT`)."""
        key = instant.requested_time
        if key not in self._metadata_cache:
            rel = f"{self.folder}/{instant.file_name(self.config.timeline_layout)}"
            named = ((self.storage.base_path, rel) if self.config.table_version.completion_times
                     and instant.completion_time else None)
            parsed = None
            if named is not None:
                with _COMMITS_LOCK:
                    parsed = _COMMITS.get(named)
                    if parsed is not None:
                        _COMMITS.move_to_end(named)
            if parsed is None:
                parsed = self._parse_commit(rel)
                if named is not None:
                    with _COMMITS_LOCK:
                        _COMMITS[named] = parsed
                        while len(_COMMITS) > COMMITS_KEPT:
                            _COMMITS.popitem(last=False)
            self._metadata_cache[key] = parsed
        return self._metadata_cache[key]

    def _parse_commit(self, rel: str) -> CommitMetadata:
        try:
            data = self.storage.read(rel)
        except FileNotFoundError as exc:
            raise CorruptTableError(f"timeline file {rel} vanished") from exc
        try:
            return CommitMetadata.from_bytes(data)
        except CorruptTableError as exc:
            raise CorruptTableError(f"timeline file {rel}: {exc}") from exc

    def latest_schema(self) -> str | None:
        """Avro schema JSON of the latest completed commit that recorded one."""
        return self.latest_schema_and_source()[0]

    def latest_schema_and_source(self) -> tuple[str | None, str]:
        """:meth:`latest_schema` and the file it comes from (for error messages): a
        timeline file, or ``hoodie.properties`` (``hoodie.table.create.schema``)."""
        for instant in reversed(self.completed_data_instants):
            schema = self.commit_metadata(instant).schema
            if schema:
                return schema, f"{self.folder}/{instant.file_name(self.config.timeline_layout)}"
        # every schema-bearing commit archived: the newest one in the history
        for row in reversed(list(self.archived())):
            if row.action in DATA_ACTION_NAMES:
                schema = self.archived_commit_metadata(row).schema
                if schema:
                    return schema, f"{self.history_folder} (instant {row.requested_time})"
        return self.config.create_schema, f"{HOODIE}/hoodie.properties"

    def rolling_metadata(self, keys: Iterable[str]) -> dict[str, str]:
        """For each key, its value in the newest completed data instant that records it
        (``hoodie.write.rolling.metadata.keys``: what a service commit carries forward);
        keys no active commit records are looked up in the history."""
        wanted = set(keys)
        found: dict[str, str] = {}
        for instant in reversed(self.completed_data_instants):
            if not wanted:
                break
            extra = self.commit_metadata(instant).extra_metadata
            for key in [k for k in wanted if k in extra]:
                found[key] = extra[key]
                wanted.discard(key)
        if wanted:  # the commits that recorded them may be archived
            for row in reversed(list(self.archived())):
                if not wanted:
                    break
                if row.action not in DATA_ACTION_NAMES:
                    continue
                extra = self.archived_commit_metadata(row).extra_metadata
                for key in [k for k in wanted if k in extra]:
                    found[key] = extra[key]
                    wanted.discard(key)
        return found

    # -- writer transitions --------------------------------------------------------------

    def _write(self, instant: Instant, content: bytes, *, exclusive: bool) -> None:
        rel = f"{self.folder}/{instant.file_name(self.config.timeline_layout)}"
        try:
            if exclusive:
                self.storage.write_new(rel, content)
            else:
                self.storage.write_replace(rel, content)
        except FileExistsError:
            raise CommitConflictError(
                f"instant {instant.requested_time} already has {rel}") from None

    def create_requested(self, action: Action, requested_time: str | None = None,
                         content: bytes = b"") -> Instant:
        """Start an instant: write ``T.<action>.requested`` with a fresh time if none given."""
        t = requested_time or new_instant_time(self.latest_instant_time())
        if any(i.requested_time == t for i in self.instants):
            raise CommitConflictError(f"instant time {t} is already on the timeline")
        instant = Instant(t, action, State.REQUESTED)
        self._write(instant, content, exclusive=True)
        return instant

    def transition_to_inflight(self, instant: Instant, content: bytes = b"") -> Instant:
        """Requested → inflight."""
        if instant.state is not State.REQUESTED:
            raise InstantStateError(f"{instant} is not requested")
        inflight = instant.with_state(State.INFLIGHT)
        self._write(inflight, content, exclusive=True)
        return inflight

    def complete(self, instant: Instant, content: bytes, synced: MetadataSynced, *,
                 listed: bool = False) -> Instant:
        """Inflight → completed: publish ``T_C.<action>`` atomically, the commit point.

        ``synced``: the commit protocol's :class:`MetadataSynced` for this instant (a data
        action that changes the file listing has its metadata-table deltacommit at the
        same instant written by then; :func:`engine.write.commit.commit_instant`); one for
        another instant is refused. Hold the table lock.

        The completion time is later than every time on the timeline and than the MDT
        deltacommit's: the timeline folder is listed again for it, unless ``listed`` says
        this snapshot was loaded under the lock the caller still holds (every instant is
        started and completed under it, so nothing newer can be on storage; the caller's
        own files since are counted)."""
        if instant.state is not State.INFLIGHT:
            raise InstantStateError(f"{instant} is not inflight")
        if synced.instant_time != instant.requested_time:
            raise InstantStateError(
                f"{instant} cannot complete with the metadata-table step of instant "
                f"{synced.instant_time}: complete it through engine.write.commit")
        floor = max(self.latest_instant_time(), instant.requested_time,
                    "" if listed else self._latest_on_storage(),
                    synced.completion_time or "")
        completion = new_instant_time(floor)
        # (before version 8 the completed file names no completion time: the instant is
        # ordered by its requested time, in memory as when listed again)
        done = instant.with_state(State.COMPLETED, completion
                                  if self.config.table_version.completion_times else None)
        self._write(done, content, exclusive=True)
        return done

    def _latest_on_storage(self) -> str:
        latest = ""
        for status in self.storage.list_dir(self.folder):
            parsed = Instant.parse(status.name)
            if parsed is not None:
                latest = max(latest, parsed.requested_time, parsed.completion_time or "")
        return latest

    def delete_instant_files(self, instant: Instant) -> None:
        """Remove every timeline file of an instant (after rolling it back)."""
        prefix = instant.requested_time
        savepoint = instant.action is Action.SAVEPOINT
        for status in self.storage.list_dir(self.folder):
            parsed = Instant.parse(status.name)
            if (parsed is not None and parsed.requested_time == prefix
                    and (parsed.action is Action.SAVEPOINT) == savepoint):
                self.storage.delete(f"{self.folder}/{status.name}")


def temp_folder(instant_time: str) -> str:
    """The instant's scratch folder, ``.hoodie/.temp/<instant>`` (Hudi keeps its markers
    there): files a writer needs only until the instant completes or is rolled back, which
    both delete it."""
    return f"{HOODIE}/.temp/{instant_time}"


def completion_key(instant: Instant) -> str:
    """Order of completed instants: completion time (v8), else requested time (v6)."""
    return instant.completion_time or instant.requested_time
