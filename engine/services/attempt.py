"""One attempt at executing a compaction or clustering plan, and how it proves it owns it.

A plan is executed by one attempt at a time, but a stalled attempt (a GC pause, slow
storage, a paused container) can wake up after another executor judged it dead and took
the plan over: both then run the same plan. The rules that keep them apart, shared by
compaction and clustering:

* **Start** (:func:`start_attempt`, under the table lock): pending rollbacks are finished
  first — always: a rollback left half-done by a dead executor targets an attempt that no
  longer owns its plan, and no new attempt starts before it is finished. A plan whose
  heartbeat is alive belongs to a live attempt and is left alone; an inflight plan whose
  attempt is abandoned (heartbeat expired or missing, or its process provably ended:
  :func:`~engine.timeline.heartbeat.is_abandoned`) is reverted, then taken.
* **Names**: every attempt draws a unique stage id, the middle of its files' write tokens
  (``<task>-<stage>-<retry>``). Two attempts never share a file name, and an attempt only
  ever deletes files of its own stage — except a revert, which runs under the lock after
  the attempt it reverts was judged dead.
* **Commit point** (:meth:`ServiceAttempt.check_owner`, under the lock): the instant is
  still inflight, no rollback requested since the attempt started targets it, its
  heartbeat never missed its expiry (Java's ``HeartbeatUtils.abortIfHeartbeatExpired``),
  and the lock is still held. Otherwise nothing is committed.
* **Late tasks**: a task that publishes a file checks afterwards that no rollback of its
  instant was requested since its attempt started, and deletes the file if one was
  (:func:`~engine.timeline.rollback_plan.discard_if_superseded`).
* **Failure** (:meth:`ServiceAttempt.abandon`): an attempt that still owns the plan
  reverts it (the plan runs again later); one that was taken over deletes only its own
  files and leaves the instant — and its heartbeat, the same file — to the new owner.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from engine.errors import TransientError
from engine.format.naming import parse_base_file
from engine.layout.file_group import list_table_files
from engine.timeline.active import Timeline
from engine.timeline.heartbeat import Heartbeat, is_abandoned
from engine.timeline.instant import Action, Instant, State
from engine.timeline.rollback_plan import reverted_since
from engine.write.rollback import revert_inflight_service, rollback_failed_writes
from engine.write.write_client import WriteClient


class AttemptSupersededError(TransientError):
    """This attempt no longer owns its plan (another executor took it over, or its
    heartbeat missed its expiry): nothing of it was committed."""


def new_stage_id() -> int:
    """A stage id no other attempt of the plan uses (the middle of its write tokens)."""
    return random.SystemRandom().randrange(1, 2**31)


def stage_of(name: str) -> int | None:
    """The stage id in a base file name's write token (None if it has none)."""
    parsed = parse_base_file(name)
    if parsed is None:
        return None
    parts = parsed.write_token.split("-")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


@dataclass
class ServiceAttempt:
    """This process's attempt at executing one plan."""

    client: WriteClient
    instant: Instant  # inflight
    timeline: Timeline  # as loaded when the attempt started, after any revert
    heartbeat: Heartbeat
    floor: str  # the timeline's latest time when the attempt started
    stage: int

    @property
    def instant_time(self) -> str:
        return self.instant.requested_time

    def check_owner(self, now: Timeline) -> None:
        """Under the lock, right before the commit point: raise
        :class:`AttemptSupersededError` unless this attempt still owns the plan."""
        found = now.find(self.instant_time)
        kind = self.instant.action.value
        if found is None or found.state is not State.INFLIGHT:
            state = "gone" if found is None else found.state.value
            raise AttemptSupersededError(
                f"{kind} {self.instant_time} is {state}: another executor reverted or "
                "completed it; nothing of this attempt was committed")
        if reverted_since(now, self.instant_time, self.floor):
            raise AttemptSupersededError(
                f"{kind} {self.instant_time}: this attempt was reverted by another executor, "
                "which judged it dead (its heartbeat had expired: raise "
                "hoodie.client.heartbeat.interval_in_ms or tolerable.misses); nothing of "
                "this attempt was committed")
        try:
            self.heartbeat.check()
        except TransientError as exc:
            raise AttemptSupersededError(f"{kind} {self.instant_time}: {exc}") from None
        self.client.lock.verify()

    def own_files(self) -> list[str]:
        """Paths of the base files of this instant written by this attempt."""
        files = list_table_files(self.client.storage)
        return [f.path for f in files.base_files
                if f.instant_time == self.instant_time and stage_of(f.name) == self.stage]

    def remove_strays(self, keep: Iterable[str]) -> None:
        """Delete this attempt's files that ``keep`` does not list (failed task tries)."""
        kept = set(keep)
        for path in self.own_files():
            if path not in kept:
                self.client.storage.delete(path)

    def abandon(self) -> bool:
        """After a failure: revert the attempt if it still owns the plan, else delete only
        its own files (those no commit names) and leave the instant to its owner. True when
        it still owned the plan (reverted it), False when another executor had completed or
        reverted it meanwhile."""
        client = self.client
        ours = False
        try:
            with client.lock:
                now = Timeline.load(client.storage, client.config)
                found = now.find(self.instant_time)
                if found is not None and found.is_completed:
                    committed = {s.path for s in now.commit_metadata(found).write_stats}
                    self.remove_strays(committed)
                elif (found is None or found.state is not State.INFLIGHT
                      or reverted_since(now, self.instant_time, self.floor)):
                    self.remove_strays(())
                else:
                    revert_inflight_service(client.storage, now, found)
                    ours = True
        finally:
            # a new owner's heartbeat is the same file: leave it to that owner
            self.heartbeat.stop(delete=ours)
        return ours

    def failure(self, exc: BaseException, owned: bool) -> str:
        """What a service error says of a failure that is no tidelake error (``owned``: what
        :meth:`abandon` returned): reverted to run again, or superseded by another executor
        (which may have completed the plan and the cleaner removed its inputs since, so a
        resumed attempt finds files gone)."""
        kind = self.instant.action.value
        if owned:
            return (f"{kind} {self.instant_time} failed ({type(exc).__name__}: {exc}); the "
                    f"attempt was reverted and its plan runs again on the next {kind}")
        return (f"{kind} {self.instant_time}: another executor completed or reverted the plan "
                f"while this attempt ran ({type(exc).__name__}: {exc}); nothing of this attempt "
                "was committed")


def start_attempt(client: WriteClient, instant_time: str, action: Action, *,
                  explicit: bool = False) -> ServiceAttempt | None:
    """Under the lock: take the plan's execution (see the module doc); None if it is not
    pending, or a live attempt owns it. ``explicit``: raise ``ValueError`` if
    ``instant_time`` is not a plan of ``action``."""
    storage = client.storage
    expiry = client.write_config.heartbeat_expiry_seconds
    with client.lock:
        timeline = Timeline.load(storage, client.config)
        if timeline.pending([Action.ROLLBACK]):
            rollback_failed_writes(storage, timeline, lambda _: False, service_reverts=True)
            timeline = Timeline.load(storage, client.config)
        instant = timeline.find(instant_time)
        if instant is None or instant.action is not action:
            if explicit:
                raise ValueError(f"instant: {instant_time} is not a {action.value} instant "
                                 "of this table")
            return None
        if instant.is_completed or not is_abandoned(storage, instant_time, expiry):
            return None  # done, or a live attempt elsewhere owns it
        if instant.state is State.INFLIGHT:
            revert_inflight_service(storage, timeline, instant)
            timeline = Timeline.load(storage, client.config)
            instant = instant.with_state(State.REQUESTED)
        floor = timeline.latest_instant_time()
        heartbeat = Heartbeat(storage, instant_time,
                              client.write_config.heartbeat_interval_ms / 1000.0,
                              expiry).start()
        try:
            client.lock.verify()
            inflight = timeline.transition_to_inflight(instant)
        except BaseException:
            heartbeat.stop()
            raise
    return ServiceAttempt(client, inflight, timeline, heartbeat, floor, new_stage_id())

