"""How the engine's independent tasks run: a :data:`TaskRunner` maps a module-level function
over picklable tasks, in this process (:func:`local_runner`) or as one Spark job that the
caller supplies. Table services, the write client and the metadata table's index builders take
one; it sits with the foundations so that any layer may (Hudi's ``HoodieEngineContext``, in
``hudi-common``'s ``engine`` package)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

TaskRunner = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]
"""``run(fn, tasks) -> [fn(task) for task in tasks]``, wherever the tasks execute."""


def local_runner(fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
    """Run the tasks in this process (two threads: I/O and Arrow overlap)."""
    if len(tasks) < 2:
        return [fn(task) for task in tasks]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(fn, tasks))
