"""CPU seconds by kind of process (from /proc), and wall time of the sink's driver-side steps."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- CPU accounting ------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


MEMORY_EVERY = 4
"""Memory is read every this many CPU samples (reading it walks the page tables)."""
DRIVER = "driver (bench + job, Python)"
JOB_KINDS = (DRIVER, "Spark JVM", "Spark Python workers")
"""The job's own processes (the broker and the producers are the bench's)."""


def _pss(pid: int) -> tuple[int, int]:
    """Proportional set size of a process in bytes (its resident pages, those it shares
    counted by their share, so that a sum over processes counts a page once), and the part of
    it that is anonymous memory (heaps, not mapped files such as shared libraries); zeros once
    it ended."""
    total = anon = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total = int(line.split()[1]) * 1024
            elif line.startswith("Pss_Anon:"):
                anon = int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return total, anon


def _command(pid: int) -> str:
    """A process's command line, shortened to what tells Spark's processes apart."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    if words and "java" in words[0]:
        return "java " + (words[-2] if len(words) > 1 else "")
    return " ".join(Path(words[0]).name if i == 0 else w for i, w in enumerate(words) if w)[:120]


def _category(pid: int, own: int) -> str:
    if pid == own:
        return DRIVER
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return "other"
    if "java" in cmd.split(" ", 1)[0] or "org.apache.spark" in cmd:
        return "Spark JVM"
    if "pyspark" in cmd:
        return "Spark Python workers"
    if "tansu" in cmd:
        return "Kafka broker (Tansu)"
    if "multiprocessing" in cmd or "bench-producer" in cmd:
        return "producer"
    return "other"


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
        total = sum(parts[:8])
        return (total - idle) / _TICK, total / _TICK
    return 0.0, 0.0


class CpuMeter:
    """Samples CPU seconds of this process and its descendants by kind, and the machine's."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.own = os.getpid()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.machine_start = (0.0, 0.0)
        self.machine_end = (0.0, 0.0)
        self.wall = 0.0
        self.peak_memory = 0
        """The most memory the job's processes (:data:`JOB_KINDS`) held together at one
        sample: their proportional set sizes summed (shared pages counted once), every
        :data:`MEMORY_EVERY` samples."""
        self.peak_memory_by_kind: dict[str, int] = defaultdict(int)
        self.peak_processes: list[tuple[str, int, int, int, str]] = []
        """At the sample of :attr:`peak_memory`: (kind, pid, PSS bytes, anonymous PSS bytes,
        command) of each of the job's processes, the largest first (what the peak is made
        of)."""
        self.peak_at = 0.0
        """Seconds from the meter's start to the sample of :attr:`peak_memory`."""
        self._samples = 0
        self.own_seconds = 0.0
        """CPU seconds of the meter's own samples (walking /proc: ~10 ms a sample with ~160
        processes on the machine, ~0.04 CPU s a wall second), taken off the driver's figure:
        counted, they grew with a run's wall time and charged a slower run for the meter."""

    def _descendants(self) -> dict[int, float]:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                got = _proc_stat(int(entry))
                if got is not None:
                    parents[int(entry)], cpu[int(entry)] = got
        children: dict[int, list[int]] = defaultdict(list)
        for pid, ppid in parents.items():
            children[ppid].append(pid)
        found, todo = {}, [self.own]
        while todo:
            pid = todo.pop()
            if pid in cpu:
                found[pid] = cpu[pid]
            todo.extend(children.get(pid, ()))
        return found

    def _sample(self, initial: bool = False) -> None:
        memory_of: dict[str, int] = defaultdict(int)
        held_by: list[tuple[str, int, int, int, str]] = []
        self._samples += 1
        memory = self._samples % MEMORY_EVERY == 1
        for pid, seconds in self._descendants().items():
            if pid not in self.kind:
                self.first[pid] = seconds if initial else 0.0
            # Looked at again each time: spark-submit's shell script becomes the JVM by exec,
            # under the same pid (a pid kept its first look's kind, so the JVM's seconds were
            # counted as Python workers when the script was seen first).
            kind = _category(pid, self.own)
            if kind != "other" or pid not in self.kind:  # "other": maybe it just ended
                self.kind[pid] = kind
            self.last[pid] = seconds
            if memory:
                held, anon = _pss(pid)
                memory_of[self.kind[pid]] += held
                if self.kind[pid] in JOB_KINDS:
                    held_by.append((self.kind[pid], pid, held, anon, _command(pid)))
        for kind, held in memory_of.items():
            self.peak_memory_by_kind[kind] = max(self.peak_memory_by_kind[kind], held)
        total = sum(memory_of.get(kind, 0) for kind in JOB_KINDS)
        if total > self.peak_memory:
            self.peak_memory = total
            self.peak_processes = sorted(held_by, key=lambda row: -row[2])
            self.peak_at = time.perf_counter() - self.wall

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            started = time.thread_time()
            self._sample()
            self.own_seconds += time.thread_time() - started

    def __enter__(self) -> CpuMeter:
        self.wall = time.perf_counter()
        self._sample(initial=True)
        self.machine_start = _machine_busy()
        self._thread = threading.Thread(target=self._run, name="bench-cpu", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self.machine_end = _machine_busy()
        self.wall = time.perf_counter() - self.wall

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, kind in self.kind.items():
            out[kind] += self.last[pid] - self.first[pid]
        if DRIVER in out:
            out[DRIVER] = max(out[DRIVER] - self.own_seconds, 0.0)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def machine_busy(self) -> float:
        return self.machine_end[0] - self.machine_start[0]

    def describe(self) -> str:
        kinds = self.by_kind()
        ours = sum(kinds.values())
        busy = self.machine_busy()
        cores = os.cpu_count() or 1
        parts = ", ".join(f"{k} {v:.1f}" for k, v in kinds.items() if v >= 0.05)
        rss = ", ".join(f"{k} {self.peak_memory_by_kind.get(k, 0) / 2**30:.2f}" for k in JOB_KINDS)
        return (f"CPU seconds over {self.wall:.1f} s wall ({cores} cores = "
                f"{cores * self.wall:.1f} CPU s): {parts}; all of ours {ours:.1f}, "
                f"whole machine {busy:.1f} (other processes ~{max(busy - ours, 0):.1f}; "
                f"the meter's own {self.own_seconds:.1f} not in the driver's); "
                f"peak memory of the job's processes together {self.peak_memory / 2**30:.2f} GiB "
                f"(PSS summed, sampled every {self.interval * MEMORY_EVERY} s; peak by kind, "
                f"GiB: {rss})")

    def describe_peak(self) -> str:
        """When the memory peak was, and the job's processes then, one line each (PSS, its
        anonymous part, kind, command)."""
        return f"    {self.peak_at:.0f} s after the start\n" + "\n".join(
            f"    {held / 2**20:7.0f} MiB ({anon / 2**20:.0f} anonymous)  {kind}  pid {pid}  "
            f"{command}" for kind, pid, held, anon, command in self.peak_processes)


# -- sink timing ---------------------------------------------------------------------------

SINK_PHASES = (
    ("ingest.sink", "write_rows", "write jobs (data: read Kafka + prepare (+ state tagging) "
     "+ shuffle by file group + write handles; error table: its staged rows)"),
    ("ingest.sink", "start_instant", "start instant (rollback check, requested → inflight)"),
    ("ingest.spark_write", "InstantPlan.finish", "commit (complete the instant)"),
    ("ingest.services", "StreamingServices.after_commit",
     "services after the commit (schedule what is due, back-pressure)"),
    ("ingest.sink", "HudiStreamingSink.process_batch", "whole foreachBatch call"),
)


class SinkTimer:
    """Wall time of the sink's steps, by wrapping them (driver side, restored afterwards).

    The wrapped names are the sink's internals; any that is missing is skipped and named.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.missing: list[str] = []
        self.batch_records: list[int] = []
        """Kafka records of each micro-batch that had any, as the sink counted them."""
        self._restore: list[tuple[Any, str, Any]] = []

    def _wrap(self, label: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1
                result = getattr(args[0], "last_result", None) if args else None
                if func.__name__ == "process_batch" and result is not None and result.records:
                    self.batch_records.append(result.records)

        return timed_call

    def __enter__(self) -> SinkTimer:
        import importlib

        for module_name, name, label in SINK_PHASES:
            owner: Any = importlib.import_module(module_name)
            *path, attr = name.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            func = getattr(owner, attr, None) if owner is not None else None
            if func is None:
                self.missing.append(f"{module_name}.{name}")
                continue
            self._restore.append((owner, attr, owner.__dict__[attr]))
            setattr(owner, attr, self._wrap(label, func))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._restore):
            setattr(owner, attr, original)
        self._restore.clear()
