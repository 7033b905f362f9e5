"""Instants: the points of a Hudi timeline (time, action, state) and their file names."""

from __future__ import annotations

import datetime as _dt
import re
import threading
import time
from dataclasses import dataclass
from enum import Enum


class Action(str, Enum):
    """Timeline actions (``HoodieTimeline`` constants)."""

    COMMIT = "commit"
    DELTA_COMMIT = "deltacommit"
    REPLACE_COMMIT = "replacecommit"
    CLUSTERING = "clustering"
    COMPACTION = "compaction"
    LOG_COMPACTION = "logcompaction"
    CLEAN = "clean"
    ROLLBACK = "rollback"
    SAVEPOINT = "savepoint"
    RESTORE = "restore"
    INDEXING = "indexing"
    SCHEMA_COMMIT = "schemacommit"

    @property
    def completed_action(self) -> Action:
        """The action name a completed instant of this action carries."""
        if self is Action.COMPACTION:
            return Action.COMMIT
        if self is Action.CLUSTERING:
            return Action.REPLACE_COMMIT
        if self is Action.LOG_COMPACTION:
            return Action.DELTA_COMMIT
        return self

    @property
    def writes_data(self) -> bool:
        """True for actions whose completed form publishes data files."""
        return self.completed_action in (Action.COMMIT, Action.DELTA_COMMIT,
                                         Action.REPLACE_COMMIT)


class State(str, Enum):
    """Instant states, in the order an instant moves through them."""

    REQUESTED = "requested"
    INFLIGHT = "inflight"
    COMPLETED = "completed"


_ORDER = {State.REQUESTED: 0, State.INFLIGHT: 1, State.COMPLETED: 2}
_TIME = r"\d{14}(?:\d{3})?"
_ACTIONS = "|".join(a.value for a in Action)
_V8_COMPLETED = re.compile(rf"^({_TIME})_({_TIME})\.({_ACTIONS})$")
_PLAIN_COMPLETED = re.compile(rf"^({_TIME})\.({_ACTIONS})$")
_PENDING = re.compile(rf"^({_TIME})\.(?:({_ACTIONS})\.)?(requested|inflight)$")


@dataclass(frozen=True, order=True)
class Instant:
    """One instant: requested time, action, state and (v8, completed) completion time."""

    requested_time: str
    action: Action
    state: State
    completion_time: str | None = None

    @property
    def is_completed(self) -> bool:
        """True once the instant's completed file exists."""
        return self.state is State.COMPLETED

    def file_name(self, layout: int = 2) -> str:
        """Timeline file name of this instant in the given timeline layout."""
        t = self.requested_time
        if self.state is State.COMPLETED:
            action = self.action.completed_action.value
            if layout >= 2:
                if not self.completion_time:
                    raise ValueError(f"completed instant {t} has no completion time")
                return f"{t}_{self.completion_time}.{action}"
            return f"{t}.{action}"
        if self.state is State.INFLIGHT and self.action is Action.COMMIT:
            return f"{t}.inflight"  # legacy name kept by both layouts
        return f"{t}.{self.action.value}.{self.state.value}"

    def with_state(self, state: State, completion_time: str | None = None) -> Instant:
        """The same instant in another state."""
        return Instant(self.requested_time, self.action, state, completion_time)

    @staticmethod
    def parse(file_name: str) -> Instant | None:
        """Parse a timeline file name (v6 or v8 layout); None if it is not an instant."""
        m = _V8_COMPLETED.match(file_name)
        if m:
            return Instant(m.group(1), Action(m.group(3)), State.COMPLETED, m.group(2))
        m = _PLAIN_COMPLETED.match(file_name)
        if m:
            return Instant(m.group(1), Action(m.group(2)), State.COMPLETED, None)
        m = _PENDING.match(file_name)
        if m:
            action = Action(m.group(2)) if m.group(2) else Action.COMMIT
            return Instant(m.group(1), action, State(m.group(3)), None)
        return None

    @staticmethod
    def state_rank(state: State) -> int:
        """Ordering of states (requested < inflight < completed)."""
        return _ORDER[state]


_lock = threading.Lock()
_last_issued = ""


def format_instant_time(moment: _dt.datetime) -> str:
    """``yyyyMMddHHmmssSSS`` in UTC."""
    utc = moment.astimezone(_dt.timezone.utc)
    return utc.strftime("%Y%m%d%H%M%S") + f"{utc.microsecond // 1000:03d}"


def parse_instant_time(text: str) -> _dt.datetime:
    """The UTC datetime of a 14- or 17-digit instant time."""
    if not re.fullmatch(_TIME, text):
        raise ValueError(f"instant time {text!r} is not yyyyMMddHHmmss[SSS]")
    base = _dt.datetime.strptime(text[:14], "%Y%m%d%H%M%S").replace(tzinfo=_dt.timezone.utc)
    millis = int(text[14:] or "0")
    return base + _dt.timedelta(milliseconds=millis)


MAX_CLOCK_SKEW_SECONDS = 2.0
"""How far the timeline may run ahead of this clock: instant generation waits that long at
most (clocks of writers on different machines drift a little), and refuses beyond it."""


def new_instant_time(after: str = "") -> str:
    """A fresh UTC instant time, strictly greater than ``after`` and than any issued here.

    Like Hudi's generator, waits for the clock to move rather than inventing a time ahead
    of it, so instants stay meaningful as wall-clock times. If ``after`` is more than
    :data:`MAX_CLOCK_SKEW_SECONDS` ahead of this clock, raises
    :class:`~engine.errors.ClockSkewError` instead of pinning every later instant to
    synthetic times.
    """
    global _last_issued
    with _lock:
        if after and after > _last_issued and not after.startswith("0000"):
            # (metadata-table initialization instants, 00000000000000xxx, are no clock time)
            ahead = (parse_instant_time(after)
                     - _dt.datetime.now(_dt.timezone.utc)).total_seconds()
            if ahead > MAX_CLOCK_SKEW_SECONDS:
                from engine.errors import ClockSkewError

                raise ClockSkewError(
                    f"the timeline holds instant {after}, {ahead:.1f} s ahead of this "
                    f"machine's clock (at most {MAX_CLOCK_SKEW_SECONDS:g} s is waited out): "
                    "synchronize the clocks of every writer (NTP); an instant written by a "
                    "skewed clock stays on the timeline")
        floor = max(after, _last_issued)
        while True:
            now = _dt.datetime.now(_dt.timezone.utc)
            candidate = format_instant_time(now)
            if candidate > floor:
                _last_issued = candidate
                return candidate
            time.sleep(0.001)
