"""``tidelake table compact|cluster|clean|archive|savepoint`` and the services part of ``show``.

Each service command opens the table with the writer options given (``--set key=value``
and the named flags), calls the :class:`~engine.Table` method of the service and prints
progress lines while its tasks run (a :data:`~engine.services.base.TaskRunner` that wraps
:func:`~engine.services.base.local_runner`), then one summary line with the time taken. Errors
reach :func:`jobs.cli.main`, which prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from engine import Table
from engine.config import IndexType
from engine.services.base import ServiceRun

ProgressLine = Callable[[str], None]

SHOW_GROUPS = 20
"""File groups ``table show`` lists before a "… N more" line (``--groups`` changes it)."""

_UNITS = {"compaction": "file groups", "clustering": "clustering groups"}
_INSTANT_ATTRS = ("instant_time", "instant", "compaction_instant", "clustering_instant",
                  "requested_time")


# -- progress -----------------------------------------------------------------------------


class ProgressRunner:
    """A task runner that runs the tasks with ``local_runner`` and reports as they finish.

    Lines read ``compaction 20261123191500123: 3/12 file groups (1.4 s)``; the instant comes
    from the tasks (their ``instant_time``-like attribute) when they carry it. With many
    tasks, about 20 lines are printed per run (and always the last one). Thread-safe: the
    local runner executes tasks on two threads.
    """

    def __init__(self, service: str, out: TextIO | None = None) -> None:
        self.service = service
        self.unit = _UNITS.get(service, "tasks")
        self.out = out
        self.tasks_run = 0

    def _label(self, tasks: Sequence[Any]) -> str:
        for attr in _INSTANT_ATTRS:
            value = getattr(tasks[0], attr, None) if tasks else None
            if isinstance(value, str) and value:
                return f"{self.service} {value}"
        return self.service

    def _print(self, text: str) -> None:
        print(text, file=self.out or sys.stdout, flush=True)

    def __call__(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        from engine.services.base import local_runner

        total = len(tasks)
        label = self._label(tasks)
        every = max(1, total // 20)
        lock = threading.Lock()
        done = [0]
        started = time.monotonic()
        self._print(f"{label}: 0/{total} {self.unit}")

        def run_one(task: Any) -> Any:
            result = fn(task)
            with lock:
                done[0] += 1
                self.tasks_run += 1
                if done[0] % every == 0 or done[0] == total:
                    self._print(f"{label}: {done[0]}/{total} {self.unit} "
                                f"({time.monotonic() - started:.1f} s)")
            return result

        return local_runner(run_one, tasks)


# -- service commands ----------------------------------------------------------------------


def parse_sets(items: Sequence[str]) -> dict[str, str]:
    """``--set key=value`` items as a dict (later ones win); ValueError naming a bad item."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set: expected key=value, got {item!r}")
        options[key.strip()] = value.strip()
    return options


def storage_options(args: argparse.Namespace) -> dict[str, str]:
    """``--storage-option key=value`` items (object_store keys such as ``aws_endpoint_url``,
    ``aws_region``); the store's environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) applies
    beneath them. ValueError naming a bad item (never its value: it may be a secret)."""
    options: dict[str, str] = {}
    for number, item in enumerate(getattr(args, "storage_option", None) or [], 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--storage-option: item {number} is not key=value (not shown: "
                             "it may hold a secret)")
        options[key.strip()] = value.strip()
    return options


def add_storage_option(leaf: argparse.ArgumentParser) -> None:
    """The ``--storage-option`` flag of a command that opens a table by path or URI."""
    leaf.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                      help="an object store option (repeatable), e.g. "
                      "aws_endpoint_url=http://127.0.0.1:9000; credentials are best "
                      "left to the store's environment (AWS_ACCESS_KEY_ID, ...)")


def writer_options(args: argparse.Namespace) -> dict[str, str]:
    """The writer options of a service command: ``--set`` items, then the named flags."""
    options = parse_sets(getattr(args, "set", None) or [])
    named = {"sort_columns": "hoodie.clustering.plan.strategy.sort.columns",
             "layout": "hoodie.layout.optimize.strategy",
             "retain_commits": "hoodie.cleaner.commits.retained"}
    for attr, key in named.items():
        value = getattr(args, attr, None)
        if value is not None:
            options[key] = str(value)
    return options


def summary_line(run: ServiceRun, seconds: float, *, schedule_only: bool = False) -> str:
    """One line saying what a :class:`~engine.services.base.ServiceRun` did, and how long it
    took: ``compaction: completed 2026… (12 file groups, 200,000 rows) in 3.20 s``."""
    parts: list[str] = []
    done = run.completed
    if run.scheduled:
        parts.append(f"scheduled {run.scheduled}")
    if run.completed:
        verb = "archived" if run.service == "archive" else "completed"
        parts.append(f"{verb} {', '.join(done)}" if len(done) <= 3 else
                     f"{verb} {len(done)} instants ({done[0]} … {done[-1]})")
    if schedule_only and run.scheduled:
        parts.append("not executed (--schedule-only)")
    text = "; ".join(parts) if parts else "nothing to do"
    counts = [f"{value:,} {key.replace('_', ' ')}" for key, value in run.details.items()
              if isinstance(value, int) and not isinstance(value, bool) and value
              and not (len(done) > 3 and key.startswith("instants") and value == len(done))]
    if counts:
        text += f" ({', '.join(counts)})"
    return f"{run.service}: {text} in {seconds:.2f} s"


def _service(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        table = Table.open(args.path, options=writer_options(args),
                           storage_options=storage_options(args))
        method = getattr(table, name)
        kwargs: dict[str, Any] = {}
        if getattr(args, "schedule_only", False):
            kwargs["schedule_only"] = True
        if getattr(args, "instant", None) is not None:
            kwargs["instant"] = args.instant
        service = {"compact": "compaction", "cluster": "clustering"}.get(name, name)
        runner = ProgressRunner(service)
        if name in ("compact", "cluster"):
            kwargs["runner"] = runner
        started = time.monotonic()
        result = method(**kwargs)
        line = summary_line(result, time.monotonic() - started,
                            schedule_only=bool(kwargs.get("schedule_only")))
        if (name == "cluster" and not result.did_something
                and table.write_config.index_type is IndexType.BUCKET):
            line += " (BUCKET-index tables are never clustered: a key's bucket is its file group)"
        print(line, flush=True)
        return 0

    run.__name__ = f"run_{name}"
    return run


run_compact = _service("compact")
run_cluster = _service("cluster")
run_clean = _service("clean")
run_archive = _service("archive")


def run_savepoint(args: argparse.Namespace) -> int:
    """``tidelake table savepoint PATH [INSTANT] | --delete INSTANT | --list``."""
    table = Table.open(args.path, storage_options=storage_options(args))
    if args.list:
        if args.instant or args.delete:
            raise ValueError("--list takes no instant and no --delete")
        points = table.savepoints()
        for point in points:
            print(point)
        if not points:
            print("no savepoints")
        return 0
    if args.delete:
        if args.instant:
            raise ValueError("--delete INSTANT takes no second instant")
        table.delete_savepoint(args.delete)
        print(f"savepoint {args.delete} deleted")
        return 0
    made = table.savepoint(args.instant, comment=args.comment)
    print(f"savepoint {made} created: its files are kept by the cleaner and it stays "
          "readable (time travel as_of it)")
    return 0


def add_commands(table_sub: Any) -> list[argparse.ArgumentParser]:
    """Add the service and savepoint commands under ``tidelake table``; returns the leaves."""
    leaves: list[argparse.ArgumentParser] = []
    specs = [
        ("compact", run_compact, "compact a MERGE_ON_READ table: merge log files into new "
         "base files", True),
        ("cluster", run_cluster, "cluster: rewrite small file groups, sorted", True),
        ("clean", run_clean, "delete file slices older than the retention", False),
        ("archive", run_archive, "move old instants to the timeline history", False),
    ]
    for name, func, text, takes_instant in specs:
        leaf = table_sub.add_parser(name, help=text, description=text)
        leaf.add_argument("path")
        if name != "archive":
            leaf.add_argument("--schedule-only", action="store_true",
                              help="write the plan only; a later run executes it")
        if takes_instant:
            leaf.add_argument("--instant", metavar="T",
                              help="execute this pending plan only (no new plan)")
        if name == "cluster":
            leaf.add_argument("--sort-columns", metavar="A,B",
                              help="hoodie.clustering.plan.strategy.sort.columns")
            leaf.add_argument("--layout", choices=("linear", "z-order", "hilbert"),
                              help="hoodie.layout.optimize.strategy")
        if name == "clean":
            leaf.add_argument("--retain-commits", type=int, metavar="N",
                              help="hoodie.cleaner.commits.retained")
        leaf.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                          help="a writer option (repeatable), e.g. "
                          "hoodie.cleaner.commits.retained=5")
        leaf.set_defaults(func=func)
        leaves.append(leaf)
    save = table_sub.add_parser(
        "savepoint", help="savepoint a commit, delete a savepoint, or list them",
        description="Savepoint a completed commit (default: the latest) so the cleaner keeps "
        "its files and it stays readable; --delete removes one; --list prints them.")
    save.add_argument("path")
    save.add_argument("instant", nargs="?", help="the commit to savepoint (default: latest)")
    save.add_argument("--comment", default="", help="recorded in the savepoint")
    save.add_argument("--delete", metavar="INSTANT", help="delete this savepoint")
    save.add_argument("--list", action="store_true", help="list the savepoints")
    save.set_defaults(func=run_savepoint)
    leaves.append(save)
    return leaves


# -- show ----------------------------------------------------------------------------------


def _plan_size(table: Table, instant: Any) -> str:
    """What a pending plan covers (from its requested file), or '' if unreadable."""
    from engine.timeline.active import Timeline
    from engine.timeline.commit_metadata import read_avro_ocf
    from engine.timeline.instant import State

    name = instant.with_state(State.REQUESTED).file_name(table.config.timeline_layout)
    try:
        plan = read_avro_ocf(table.storage.read(f"{Timeline.folder_for(table.config)}/{name}"))
    except Exception:  # an empty or foreign plan file: show the instant without counts
        return ""
    action = instant.action.value
    if action == "compaction":
        return f"{len(plan.get('operations') or [])} file group(s)"
    if action == "clustering":
        groups = (plan.get("clusteringPlan") or {}).get("inputGroups") or []
        slices = sum(len(g.get("slices") or []) for g in groups)
        return f"{len(groups)} group(s), {slices} file slice(s)"
    if action == "clean":
        per_partition = plan.get("filePathsToBeDeletedPerPartition") or {}
        files = sum(len(v or []) for v in per_partition.values())
        return f"{files} file(s) to delete"
    return ""


def pending_services(table: Table, timeline: Any) -> list[str]:
    """Lines for the pending compaction, clustering and clean plans, oldest first."""
    from engine.timeline.heartbeat import heartbeat_age
    from engine.timeline.instant import Action, State

    wc = table.write_config
    expiry = wc.heartbeat_interval_ms / 1000 * wc.heartbeat_tolerable_misses
    lines = []
    for instant in timeline.pending((Action.COMPACTION, Action.CLUSTERING, Action.CLEAN)):
        state = instant.state.value
        if instant.state is State.INFLIGHT and instant.action is not Action.CLEAN:
            age = heartbeat_age(table.storage, instant.requested_time)
            state += (f" (running: heartbeat {age:.0f} s old)" if age is not None
                      and age <= expiry else " (no live executor: the next run re-executes it)")
        covers = _plan_size(table, instant)
        lines.append(f"  {instant.requested_time}  {instant.action.value:<10} {state}"
                     + (f"  {covers}" if covers else ""))
    return lines


def file_group_lines(table: Table, timeline: Any, limit: int = SHOW_GROUPS) -> list[str]:
    """A compact table of the live file groups: slices, logs of the latest slice, bytes,
    base file; at most ``limit`` rows, then "… N more"."""
    from engine.layout.view import TableView

    slices = TableView(table.storage, timeline).all_file_slices()
    groups: dict[tuple[str, str], list[Any]] = {}
    for slc in slices:
        groups.setdefault((slc.partition_path, slc.file_id), []).append(slc)
    rows = []
    for (partition, file_id), group in sorted(groups.items()):
        latest = group[-1]
        base = latest.base_file.name if latest.base_file else f"(log only) {file_id}"
        rows.append((partition or ".", str(len(group)), str(len(latest.log_files)),
                     f"{latest.total_size():,}", base))
    partitions = len({r[0] for r in rows})
    lines = [f"file groups: {len(rows)} in {partitions} partition(s)"]
    if not rows:
        return lines
    # slices: every slice still on storage; the other columns: the latest slice
    headers = ("partition", "slices", "logs", "bytes", "base file")
    shown = rows[:limit] if limit > 0 else rows
    widths = [max(len(h), *(len(r[i]) for r in shown)) for i, h in enumerate(headers)]
    right = (False, True, True, True, False)

    def fmt(cells: Sequence[str]) -> str:
        return "  " + "  ".join(c.rjust(w) if r else c.ljust(w)
                                for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    lines.append(fmt(headers))
    lines.extend(fmt(r) for r in shown)
    if len(rows) > len(shown):
        lines.append(f"  … {len(rows) - len(shown)} more")
    return lines


def service_lines(table: Table, timeline: Any) -> list[str]:
    """``table show``'s lines on services: pending plans, earliest readable instant,
    archived instants, savepoints."""
    lines = ["pending services:"]
    lines.extend(pending_services(table, timeline) or ["  none"])
    from engine.services.clean import earliest_readable_instant

    earliest = earliest_readable_instant(timeline)
    lines.append("earliest readable instant: "
                 + (f"{earliest} (older ones were cleaned: time travel and incremental "
                    "reads start here)" if earliest else "any (nothing cleaned yet)"))
    if table.config.table_version.lsm_history:
        archived = len(table.timeline(include_archived=True)) - len(table.timeline())
        lines.append(f"archived instants: {archived:,} (in .hoodie/timeline/history)")
    else:
        lines.append(f"archived instants: none written (table version "
                     f"{table.config.version}: every instant stays on the active timeline)")
    points = table.savepoints()
    lines.append(f"savepoints: {', '.join(points) if points else 'none'}")
    return lines


# -- metadata ------------------------------------------------------------------------------


def run_metadata(args: argparse.Namespace) -> int:
    """``tidelake table metadata validate|rebuild PATH``: exit 1 when validate finds a
    difference."""
    table = Table.open(args.path, options=parse_sets(args.set),
                       storage_options=storage_options(args))
    if args.action == "rebuild":
        started = time.monotonic()
        table.rebuild_metadata()
        result = table.validate_metadata()
        if "files" not in result.declared:
            print(f"metadata table of {args.path} deleted "
                  "(hoodie.metadata.enable=false)", flush=True)
            return 0
        print(f"metadata table of {args.path} rebuilt in {time.monotonic() - started:.2f} s: "
              f"{result.files_checked:,} files listed", flush=True)
        return 0 if result.ok else 1
    result = table.validate_metadata()
    if "files" not in result.declared:
        print(f"{args.path} keeps no metadata table (hoodie.table.metadata.partitions is "
              "empty): readers list storage", flush=True)
        return 0
    for diff in result.differences:
        print(diff)
    verdict = ("agrees with storage" if result.ok else
               f"{len(result.differences):,} differences (rebuild with `tidelake table "
               f"metadata rebuild {args.path}`)")
    keys = (f", {result.keys_checked:,} record keys checked against the record_index"
            if result.keys_checked else "")
    print(f"metadata table ({', '.join(result.declared)}): {result.files_checked:,} files "
          f"checked{keys}, {verdict}", flush=True)
    return 0 if result.ok else 1


def metadata_line(table: Table, timeline: Any) -> str:
    """One line on the table's metadata table for ``tidelake table show``: its partitions,
    deltacommits since its last compaction, and whether it is in step."""
    from engine.metadata.listing import base_boundary, missing_deltacommits
    from engine.metadata.table import MetadataTable, completed_mdt_instants, declared_partitions
    from engine.timeline.active import completion_key
    from engine.timeline.instant import Action

    declared = declared_partitions(table.storage)
    mdt = MetadataTable(table.storage, table.config)
    if "files" not in declared or not mdt.exists:
        keeps = ("hoodie.metadata.enable=true keeps one"
                 if table.config.table_version.keeps_metadata_table
                 else f"none is kept on table version {table.config.version}")
        return f"metadata table: none (readers list the table folder; {keeps})"
    mdt_timeline = mdt.timeline()
    boundary = base_boundary(mdt_timeline)
    since = sum(1 for i in completed_mdt_instants(mdt_timeline)
                if i.action is Action.DELTA_COMMIT and completion_key(i) > boundary)
    missing = missing_deltacommits(mdt_timeline, timeline)
    state = ("in step" if not missing else
             f"OUT OF STEP: misses {', '.join(missing[:3])} (the next write rebuilds it)")
    return (f"metadata table: {', '.join(declared)}; {since} deltacommits since its last "
            f"compaction; {state}")


def add_metadata_command(table_sub: Any) -> argparse.ArgumentParser:
    """``tidelake table metadata validate|rebuild PATH``."""
    text = ("check the metadata table against storage (validate), or build it anew from "
            "the committed files (rebuild)")
    leaf = table_sub.add_parser("metadata", help=text, description=text)
    leaf.add_argument("action", choices=("validate", "rebuild"))
    leaf.add_argument("path")
    leaf.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a writer option (repeatable), e.g. hoodie.metadata.enable=false "
                      "with rebuild deletes the metadata table")
    leaf.set_defaults(func=run_metadata)
    return leaf
