"""The ingest job as a child process, for the crash and cluster tests (test-only).

::

    python -m tests.ingest.job_child JOB.toml --report REPORT.json \
        [--arm ARM --signal SIGNAL] [--stop STOP] [--go GO]

Runs the job of ``JOB.toml`` with :func:`jobs.ingest_job.start` and :func:`jobs.ingest_job.watch`
until the query ends (``trigger.available_now``) or the file ``STOP`` appears, and rewrites
``REPORT.json`` after every micro-batch: the driver's pid and, per batch, the
:class:`~ingest.sink.BatchResult` figures and where each write task ran — with the chain of
parent processes of the task's Python worker, read on the driver while that worker is alive
(the tests run on one machine, so ``/proc`` shows every process of the job).

Waiting to go (``--go GO``): the child starts its JVM and Spark session, then waits until the
file ``GO`` appears before it checks the broker, opens the table and builds the sink and the
query. A test that kills a job and restarts it starts the restart this way while the job it
is about to kill waits at its crash point, and lets it go once the kill and the checks after it
are done: the restart's JVM and session start (a third of a restart, and nothing of them touches
the table, the checkpoint or the broker) overlap the wait instead of following it.

Crash points: while the file ``ARM`` names one of :data:`CRASH_POINTS`, the first process of the
job that reaches that point writes ``SIGNAL`` and waits there until ``SIGNAL`` is removed, so
the parent test can SIGKILL the job at exactly that point; it never goes on past the point. The
parent may write ``ARM`` before starting the job or while it runs. Each point is reached by
wrapping the function that runs there (no hook in the product code).

This module is imported by Spark's Python workers too (``crash_site/sitecustomize.py`` installs
the ``decode`` point there), so it imports nothing heavy at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

CRASH_POINTS = {
    "before_query": "session, table and sink are built; the streaming query is not started",
    "decode": "executor tasks are reading the batch from Kafka and decoding it",
    "before_error_commit": "executors wrote the data files and the error rows; the error "
                           "table's instant and the data instant are inflight",
    "after_error_commit": "the error table committed the batch; the data instant is inflight, "
                          "its files written",
    "before_commit": "executors wrote the data files; the data instant is inflight (between "
                     "executor writes and the commit)",
    "after_commit": "the data commit is published; Spark has not recorded the batch's end",
}
"""Where an armed job stops, and what has happened by then."""

INDEX_FREE_POINTS = ("before_query", "decode")
"""The points of :data:`CRASH_POINTS` a job reaches before any of its index runs: what a kill
there leaves does not depend on the index. At the CI size they are killed in the BUCKET
table's service-kill lineage (``test_streaming_services``), ahead of its service points, not
in a job lineage of their own (``test_crash`` kills them for every index at the soak size)."""

GLOBAL_STATE_POINTS = {
    "tagging": "GLOBAL_STATE: the state operator's tasks are tagging a shard (its state store "
               "version is being written, not committed)",
}
"""Crash points only a GLOBAL_STATE job reaches (armed like :data:`CRASH_POINTS`). Its
``before_error_commit``, ``after_error_commit`` and ``before_commit`` points come after the
state stores committed the batch's version: between the state commit and the table commit."""

_WAIT_LIMIT_S = 900.0  # a point is never left waiting forever if the parent is gone


def _process_start() -> float:
    """Wall-clock time this process started (from ``/proc``; now if unreadable)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in
                    Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return time.time()


def mark(phase: str) -> None:
    """Print when this process reached ``phase``, in seconds since it started (the
    restart cost of a job, per phase, in its log: ``grep 'job_child: +'``)."""
    print(f"job_child: +{time.time() - _process_start():.2f}s {phase} pid {os.getpid()}",
          flush=True)


def stop_here(signal_file: str, point: str, **detail: Any) -> None:
    """Announce reaching ``point`` in ``signal_file``, then wait to be killed; never return."""
    target = Path(signal_file)
    temp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps({"point": point, "pid": os.getpid(), **detail}))
    os.replace(temp, target)
    mark(f"point {point} reached")  # the parent never reads half a file
    deadline = time.monotonic() + _WAIT_LIMIT_S
    while target.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(86)  # the parent removed the file without killing us: still never go on


def wait_to_go(go_file: str) -> None:
    """Wait until ``go_file`` exists (the parent's go); never longer than the points wait."""
    go, deadline = Path(go_file), time.monotonic() + _WAIT_LIMIT_S
    while not go.exists():
        if time.monotonic() > deadline:
            os._exit(87)  # the parent is gone: never run on its own
        time.sleep(0.05)


def armed(arm: str | None, point: str) -> bool:
    """True if the file ``arm`` names ``point``."""
    if not arm:
        return False
    try:
        return Path(arm).read_text().strip() == point
    except OSError:
        return False


SERVICE_POINTS = {
    # point: (module, function, runs in executors, what has happened by then)
    "compaction_task": ("engine.services.compaction", "execute_compaction_task", True,
                        "a compaction is inflight; its executor tasks are writing base files"),
    "compaction_commit": ("engine.services.compaction", "_remove_strays", False,
                          "every compaction task wrote its base file; the compaction is not "
                          "committed"),
    "clean": ("engine.services.clean", "execute_clean_task", False,
              "a clean is inflight and deleting files"),
    "archive": ("engine.services.archive", "_delete_active_files", False,
                "archival wrote the history rows; the active timeline files are not deleted"),
    "clustering_task": ("engine.services.clustering", "execute_clustering_task", True,
                        "a clustering is inflight; its executor tasks are writing new groups"),
    "clustering_commit": ("engine.services.clustering", "_commit", False,
                          "every clustering task wrote its files; the replacecommit is not "
                          "published"),
}
"""Crash points inside the table services (the job's service thread, or its Spark tasks);
armed like :data:`CRASH_POINTS`."""


def install_service_crash_points(arm: str, signal_file: str, *, executors: bool,
                                 module: Any = None) -> None:
    """Stop at a table-service point when armed: the driver's points (``executors`` False)
    or those that run in Spark tasks (``executors`` True, from ``sitecustomize``); with
    ``module``, only the points of that (just imported) module."""
    import importlib

    for point, (module_name, name, in_executors, _) in SERVICE_POINTS.items():
        if in_executors != executors:
            continue
        if module is not None and module.__name__ != module_name:
            continue
        target = module if module is not None else importlib.import_module(module_name)
        original = getattr(target, name)

        def stop_or_run(*args: Any, _original: Any = original, _point: str = point,
                        **kwargs: Any) -> Any:
            if armed(arm, _point):
                stop_here(signal_file, _point)
            return _original(*args, **kwargs)

        setattr(target, name, stop_or_run)


def install_tagging_crash_point(arm: str, signal_file: str, module: Any = None) -> None:
    """Inside a state operator task, stop at ``tagging`` when armed (a Spark Python worker;
    see ``crash_site/sitecustomize.py``); ``module``: ``ingest.global_index_processor``, if
    imported."""
    if module is None:
        import ingest.global_index_processor as module
    GlobalIndexProcessor = module.GlobalIndexProcessor

    original = GlobalIndexProcessor.handleInputRows

    def tag_or_stop(self: Any, key: Any, rows: Any, timer: Any) -> Any:
        if not bool(key[0]) and armed(arm, "tagging"):
            stop_here(signal_file, "tagging", shard=str(key[1]))
        return original(self, key, rows, timer)

    GlobalIndexProcessor.handleInputRows = tag_or_stop


def install_decode_crash_point(arm: str, signal_file: str, module: Any = None) -> None:
    """Inside an executor task, stop at ``decode`` when armed: the job's decoders are wrapped
    in the process that decodes (a Spark Python worker; see ``crash_site/sitecustomize.py``);
    ``module``: ``ingest.decode``, if imported.

    Decoding runs lazily in a micro-batch's first Spark job, in the tasks that read Kafka.
    """
    decode = module
    if decode is None:
        from ingest import decode

    for cls in (decode.JsonDecoder, decode.AvroDecoder):
        original = cls.decode

        def decode_or_stop(self: Any, values: Any, *, _original: Any = original) -> Any:
            from pyspark import TaskContext

            if TaskContext.get() is not None and armed(arm, "decode"):
                stop_here(signal_file, "decode", rows=len(values))
            return _original(self, values)

        cls.decode = decode_or_stop


def install_executor_crash_points(arm: str, signal_file: str) -> None:
    """Arm the executor-side points (``decode``, ``tagging``, ``compaction_task``,
    ``clustering_task``) in this process when their module is imported, not before
    (``crash_site/sitecustomize.py`` calls this in every Python process of an armed job).

    Importing those modules up front cost every Python process the job starts (Spark's
    data-source lookup, planner and streaming-source workers, the worker daemon) about a
    second of CPU, most of them for modules they never use.
    """
    import importlib.abc
    import importlib.machinery

    hooks = {
        "ingest.decode": lambda m: install_decode_crash_point(arm, signal_file, m),
        "ingest.global_index_processor": lambda m: install_tagging_crash_point(arm, signal_file, m),
        **{module_name: (lambda m: install_service_crash_points(
            arm, signal_file, executors=True, module=m))
           for module_name, _, in_executors, _ in SERVICE_POINTS.values() if in_executors},
    }

    class AfterImport(importlib.abc.MetaPathFinder):
        """Finds nothing itself: wraps the loader of a hooked module so the hook runs
        right after the module's code."""

        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            hook = hooks.get(name)
            if hook is None:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return None
            execute = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                execute(module)
                hook(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    for name, hook in hooks.items():
        if name in sys.modules:
            hook(sys.modules[name])
    sys.meta_path.insert(0, AfterImport())


def ancestry(pid: int) -> list[dict[str, Any]]:
    """``pid`` and its parents up to init: ``[{"pid", "cmdline"}, ...]`` (empty if gone)."""
    chain: list[dict[str, Any]] = []
    while pid > 1 and len(chain) < 32:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            break
        chain.append({"pid": pid, "cmdline": cmdline.replace(b"\0", b" ").decode(
            "utf-8", "replace").strip()})
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
    return chain


class Report:
    """What the job did so far; rewritten atomically after every batch."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.data: dict[str, Any] = {"driver_pid": os.getpid(), "batches": [],
                                     "finished": False}

    def add_batch(self, result: Any, seconds: float, retries: int = 0) -> None:
        tasks = [{"pid": t.pid, "host": t.host, "file_group": t.file_group,
                  "task_attempt_id": t.task_attempt_id, "ancestry": ancestry(t.pid)}
                 for t in result.tasks]
        self.data["batches"].append({
            "batch_id": result.batch_id, "skipped": result.skipped,
            "records": result.records, "errors": result.errors,
            "instant_time": result.instant_time, "seconds": seconds, "tasks": tasks,
            "retries": retries})
        self.write()

    def write(self) -> None:
        temp = self.path.with_name(self.path.name + ".tmp")
        temp.write_text(json.dumps(self.data))
        os.replace(temp, self.path)


def install(arm: str | None, signal_file: str, errors_path: str, report: Report) -> None:
    """Wrap the sink, the commits, the query start and the decoder (see :data:`CRASH_POINTS`)."""
    import ingest.sink as sink_module
    from engine.write.write_client import WriteClient

    original_process = sink_module.HudiStreamingSink.process_batch

    def process_batch(self: Any, df: Any, batch_id: int) -> None:
        started = time.monotonic()
        retries = self.totals.retries
        mark(f"batch {batch_id} started")
        original_process(self, df, batch_id)
        mark(f"batch {batch_id} done")
        report.add_batch(self.last_result, time.monotonic() - started,
                         self.totals.retries - retries)

    sink_module.HudiStreamingSink.process_batch = process_batch  # type: ignore[method-assign]

    original_finish = WriteClient.finish
    errors_root = os.path.realpath(errors_path)

    def finish(self: Any, *a: Any, **kw: Any) -> Any:
        table = "error_" if os.path.realpath(self.storage.base_path) == errors_root else ""
        if armed(arm, f"before_{table}commit"):
            stop_here(signal_file, f"before_{table}commit")
        done = original_finish(self, *a, **kw)
        if armed(arm, f"after_{table}commit"):
            stop_here(signal_file, f"after_{table}commit", instant=done.requested_time)
        return done

    WriteClient.finish = finish  # type: ignore[method-assign]

    original_start = sink_module.start_ingest

    def start_ingest(*a: Any, **kw: Any) -> Any:
        mark("session and sink built")
        if armed(arm, "before_query"):
            stop_here(signal_file, "before_query")
        query = original_start(*a, **kw)
        mark("query started")
        return query

    sink_module.start_ingest = start_ingest
    install_service_crash_points(arm or "", signal_file, executors=False)
    # ``decode``, ``compaction_task`` and ``clustering_task`` run in the executors' workers:
    # see ChildJob (harness) and crash_site/sitecustomize.py.


def main(argv: list[str] | None = None) -> int:
    """Run the job; see the module docstring."""
    parser = argparse.ArgumentParser(prog="job_child")
    parser.add_argument("config")
    parser.add_argument("--report", required=True)
    parser.add_argument("--arm", default=None)
    parser.add_argument("--signal", default=None)
    parser.add_argument("--stop", default=None)
    parser.add_argument("--go", default=None)
    args = parser.parse_args(argv)
    if args.arm and not args.signal:
        parser.error("--arm needs --signal")

    mark("python up")
    import jobs.ingest_job as ingest_job
    from jobs.ingest_job import start, watch
    from jobs.job_config import load

    mark("imports done")
    original_launch = ingest_job._launch_jvm

    def launch_jvm(*a: Any, **kw: Any) -> None:
        original_launch(*a, **kw)
        mark("JVM up")

    ingest_job._launch_jvm = launch_jvm
    original_build_spark = ingest_job.build_spark

    def build_spark(*a: Any, **kw: Any) -> Any:
        spark = original_build_spark(*a, **kw)
        mark("session built")
        return spark

    ingest_job.build_spark = build_spark

    config = load(args.config)
    if args.go:
        # The session first, then wait for the parent's go (see the module docstring):
        # ``start`` below takes this session, checks the broker and opens the table after it.
        spark = build_spark(config)
        wait_to_go(args.go)
        mark("go")
    else:
        spark = None
    errors_path = config["errors.table_path"] or f"{config['table.path'].rstrip('/')}_errors"
    report = Report(args.report)
    report.write()
    install(args.arm, args.signal or "", errors_path, report)
    spark, sink, query = start(config, spark)
    stop = Path(args.stop) if args.stop else None
    try:
        watch(query, sink, until=(lambda _: stop.exists()) if stop else None)
        report.data["executor_ids"] = _executor_ids(spark)
    finally:
        sink.services.stop()
        spark.stop()
    report.data["finished"] = True
    report.write()
    mark("stopped")
    return 0


def _executor_ids(spark: Any) -> list[str]:
    """Ids of the executors Spark knows (the driver's own id excluded)."""
    ids = spark.sparkContext._jsc.sc().getExecutorIds()
    return [str(ids.apply(i)) for i in range(ids.size())]


if __name__ == "__main__":
    sys.exit(main())
