"""What every table service shares: the result of a run, and how its tasks are executed.

A service that rewrites data (compaction, clustering) splits its work into independent,
picklable tasks — one per file group or clustering group — and a module-level function that
executes one task where it runs (this process, or a Spark executor). The caller decides
where: :data:`~engine.tasks.TaskRunner` maps that function over the tasks and returns the
results in order. :func:`~engine.tasks.local_runner` runs them in this process; the streaming
job passes a runner that submits one Spark job (``sc.parallelize(tasks).map(fn).collect()``)
from its service thread, so the work runs in executor tasks while micro-batches keep
committing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.tasks import TaskRunner, local_runner

# the runner is engine.tasks's, re-exported for the services' callers
__all__ = ["ServiceRun", "TaskRunner", "local_runner"]


@dataclass(frozen=True)
class ServiceRun:
    """What one call of a table service did.

    ``scheduled``: the instant of the plan this call wrote (None: nothing was due or there
    was nothing to do). ``completed``: the instants this call executed to completion (a
    compaction run executes every pending plan it can). ``details``: counts for progress
    lines and the command line (file groups, rows, files deleted, instants archived...).
    """

    service: str
    scheduled: str | None = None
    completed: tuple[str, ...] = ()
    details: Mapping[str, int] = field(default_factory=dict)

    @property
    def did_something(self) -> bool:
        """True if a plan was written or an instant completed."""
        return self.scheduled is not None or bool(self.completed)
