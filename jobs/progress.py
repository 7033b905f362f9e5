"""A running ingest job's progress: its totals after each micro-batch, the Kafka lag, and the
lines the job prints (a batch, idle, the summary). :mod:`jobs.ingest_job` updates it;
:mod:`jobs.metrics` publishes it."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.sink import BatchResult


RATE_WINDOW_S = 10.0
"""The current rate is over this many seconds (the average is over the whole run)."""
IDLE_AFTER_S = 30.0
"""Without a completed batch for this long the job prints an idle line."""


@dataclass
class Progress:
    """Totals of a running job, updated after every micro-batch (and its Kafka lag whenever
    the query reports progress)."""

    batches: int = 0
    records: int = 0
    errors: int = 0
    skipped: int = 0
    retries: int = 0
    """Micro-batches the sink replanned and wrote again after a commit conflict."""
    commits: int = 0
    """Micro-batches that completed a data instant."""
    seconds: float = 0.0
    """Time the sink spent in micro-batches (``SinkTotals.seconds``)."""
    commit_seconds: float = 0.0
    """Time the sink spent completing data instants (``SinkTotals.commit_seconds``)."""
    file_groups: int = 0
    last: BatchResult | None = None
    """The sink's result of the last micro-batch (with the totals above: one look)."""
    services: str = ""
    """What the table services did so far (``ServicesState.describe``)."""
    started: float = 0.0
    lag: int | None = None
    """Records in Kafka not yet read (latest offsets minus the last batch's end offsets)."""
    partition_lag: dict[tuple[str, str], int] = field(default_factory=dict)
    """:attr:`lag` per (topic, partition)."""
    last_batch_at: float = 0.0
    interrupted: bool = False
    stopped_by: str = "the query ended"
    """Why :func:`watch` returned: ``Ctrl-C``, ``--duration reached``, ``done`` (``until``),
    or ``the query ended`` (e.g. ``trigger.available_now`` read everything)."""
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    """(time, records) at each batch, for the current rate."""

    def rate(self) -> float:
        """Records per second on average since the start."""
        return self.records / max(time.monotonic() - self.started, 1e-9)

    def current_rate(self, window: float = RATE_WINDOW_S) -> float:
        """Records per second over the last ``window`` seconds (0 when nothing came in)."""
        now = time.monotonic()
        recent = [(t, n) for t, n in self.samples if now - t <= window]
        if not recent:
            return 0.0
        before = [(t, n) for t, n in self.samples if now - t > window]
        t0, n0 = before[-1] if before else (self.started, 0)
        return (self.records - n0) / max(now - t0, 1e-9)

    def record_batch(self) -> None:
        now = time.monotonic()
        self.last_batch_at = now
        self.samples.append((now, self.records))


def kafka_lag(progress: Mapping[str, Any] | None) -> int | None:
    """Records behind: per partition, the latest offset minus the end offset of the last
    batch, summed over the query's sources (None when the progress does not say)."""
    by_partition = kafka_lag_by_partition(progress)
    return None if by_partition is None else sum(by_partition.values())


def kafka_lag_by_partition(progress: Mapping[str, Any] | None
                           ) -> dict[tuple[str, str], int] | None:
    """:func:`kafka_lag` per (topic, partition), partitions as the progress names them."""
    if not progress:
        return None
    lags: dict[tuple[str, str], int] = {}
    known = False
    for source in progress.get("sources") or []:
        latest, end = _offsets(source.get("latestOffset")), _offsets(source.get("endOffset"))
        if latest is None or end is None:
            continue
        known = True
        for topic, parts in latest.items():
            done = end.get(topic, {}) if isinstance(end.get(topic), dict) else {}
            for part, offset in parts.items():
                lag = max(int(offset) - int(done.get(part, 0)), 0)
                lags[(topic, str(part))] = lags.get((topic, str(part)), 0) + lag
    return lags if known else None


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        return None
    return value


def format_progress(p: Progress) -> str:
    """The progress line of a batch: records, current and average rate, lag, errors."""
    lag = "?" if p.lag is None else f"{p.lag:,}"
    line = (f"batch {p.batches}: {p.records:,} records, {p.current_rate():,.0f}/s now "
            f"({p.rate():,.0f}/s avg), lag {lag}, {p.errors:,} errors, "
            f"{p.file_groups} file groups written")
    if p.skipped:
        line += f", {p.skipped} replayed batches skipped"
    if p.retries:
        line += f", {p.retries} commit retries"
    if p.services:
        line += f"; services: {p.services}"
    return line


def format_idle(p: Progress, idle_s: float, *, busy: bool = False) -> str:
    """The line printed when no batch completed for a while (``busy``: one is running)."""
    lag = "" if p.lag is None else f", lag {p.lag:,}"
    if busy:
        return (f"batch {p.batches + 1} still running after {idle_s:.0f} s{lag}; "
                f"{p.records:,} records in {p.batches} batches so far")
    state = "waiting for new records" if p.lag in (0, None) else f"no new batch{lag}"
    return f"idle {idle_s:.0f} s: {state}; {p.records:,} records in {p.batches} batches so far"


def format_summary(p: Progress, reason: str) -> str:
    """The last line of a job: why it stopped and what it did."""
    elapsed = time.monotonic() - p.started
    lag = "" if p.lag is None else f", lag {p.lag:,}"
    return (f"stopped ({reason}) after {elapsed:.0f} s: {p.records:,} records in {p.batches} "
            f"batches ({p.rate():,.0f}/s avg), {p.errors:,} errors{lag}")
