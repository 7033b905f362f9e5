"""The child processes of ``test_stress.py``: an offline executor and a second writer.

Run as ``python -m tests.engine.stress_child MODE PATH OPTIONS_JSON ARG``; the parent
SIGKILLs or SIGSTOPs them at random points. Each reports on stdout, one line per event,
flushed at once, so the parent knows what a killed child got to; ``ready`` first, once the
imports are done (the parent's random kill points count from there):

* ``executor``: ``ARG`` rounds of executing every pending compaction and clustering plan
  (``execute_pending``, as ``tidelake table compact|cluster`` does), taking over attempts
  whose heartbeat expired. Prints ``tasks <service> <n>`` when an attempt's tasks start
  (then dawdles a little, widening the window in which the parent may kill or pause it),
  ``ran <service> <completed instants>`` and ``error <service> <message>``.
* ``writer``: one upsert of ``ARG`` (JSON columns). Prints ``begun <instant>`` once the
  instant is inflight (before its files are written), then ``committed <instant>`` or
  ``refused <instant> <message>``. A writer killed after ``begun`` may or may not have
  reached its commit point; the parent decides from the timeline folder.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from engine import Table, TidelakeError
from engine.services.base import local_runner
from engine.services.table_services import CLUSTERING, COMPACTION, execute_pending
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import WriteStat
from engine.write.write_client import UPSERT, WriteClient, WritePlan


def _say(*words: object) -> None:
    print(*words, flush=True)


def _client(path: str, options: dict[str, str]) -> WriteClient:
    table = Table.open(path, options)
    return WriteClient(table.storage, table.config, table.write_config)


def run_executor(path: str, options: dict[str, str], rounds: int) -> None:
    """Execute pending compaction and clustering plans, ``rounds`` times."""
    rng = random.Random()
    services = [COMPACTION, CLUSTERING] if Table.open(path).config.is_mor else [CLUSTERING]
    for _ in range(rounds):
        for service in services:

            def runner(fn: Callable[[Any], Any], tasks: Sequence[Any],
                       service: str = service) -> list[Any]:
                _say("tasks", service, len(tasks))
                time.sleep(rng.uniform(0.0, 0.3))
                return local_runner(fn, tasks)

            try:
                run = execute_pending(_client(path, options), service, runner=runner)
            except TidelakeError as exc:
                _say("error", service, type(exc).__name__, str(exc).replace("\n", " "))
                continue
            _say("ran", service, *run.completed)
        time.sleep(rng.uniform(0.05, 0.25))


def run_writer(path: str, options: dict[str, str], columns: dict[str, list[Any]]) -> None:
    """Upsert one batch, saying when its instant began and how it ended."""
    client = _client(path, options)
    data = pa.table({"key": pa.array(columns["key"], pa.string()),
                     "part": pa.array(columns["part"], pa.string()),
                     "ts": pa.array(columns["ts"], pa.int64()),
                     "val": pa.array(columns["val"], pa.int64())})
    records, deletes = client.prepare(data, Timeline.load(client.storage, client.config),
                                      dedupe=True)
    began: list[str] = []

    def run(plan: WritePlan) -> list[WriteStat]:
        began.append(plan.instant.requested_time)
        _say("begun", plan.instant.requested_time)
        return client.execute_local(plan)

    try:
        instant = client.write(UPSERT, records, deletes, run=run)
    except TidelakeError as exc:
        _say("refused", began[0] if began else "-", type(exc).__name__,
             str(exc).replace("\n", " "))
        return
    _say("committed", instant)


def main(argv: Sequence[str]) -> None:
    mode, path, options_json, arg = argv
    _say("ready")
    options = json.loads(options_json)
    if mode == "executor":
        run_executor(path, options, int(arg))
    elif mode == "writer":
        run_writer(path, options, json.loads(arg))
    else:
        raise SystemExit(f"unknown mode {mode!r}: expected executor or writer")


if __name__ == "__main__":
    main(sys.argv[1:])
