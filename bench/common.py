"""Shared helpers for tidelake's benchmarks: workload, machine info, timing, result tables.

Everything here is deterministic for a given seed and vectorized: building a million-row
batch takes well under a second, so the generator never shows up in a benchmark figure
(and is never inside a timed section anyway).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parent.parent

# -- workload ------------------------------------------------------------------------------

KEY_PREFIX = "k"
KEY_DIGITS = 10
TS_BASE = 1_700_000_000_000  # epoch millis of the initial load
TS_STEP = 3_600_000  # each batch is an hour later; values inside a batch stay below the next
VOCAB_SIZE = 1024
INT_COLUMNS = ("i0", "i1", "i2", "i3")
FLOAT_COLUMNS = ("f0", "f1", "f2", "f3")
STRING_COLUMNS = ("s0", "s1")
DATA_COLUMNS = ("key", "ts", "partition", *INT_COLUMNS, *FLOAT_COLUMNS, *STRING_COLUMNS)


@dataclass(frozen=True)
class WorkloadSpec:
    """Size of the upsert workload: an initial load, then ``batches`` mixed batches."""

    rows: int = 1_000_000
    batches: int = 10
    batch_size: int = 100_000
    update_fraction: float = 0.5
    partitions: int = 10
    seed: int = 42

    @property
    def updates_per_batch(self) -> int:
        return round(self.batch_size * self.update_fraction)

    @property
    def new_per_batch(self) -> int:
        return self.batch_size - self.updates_per_batch

    @property
    def expected_rows(self) -> int:
        """Distinct keys after the whole workload: the final table's row count."""
        return self.rows + self.batches * self.new_per_batch

    def describe(self) -> str:
        return (f"{self.rows:,} rows, then {self.batches} batches x {self.batch_size:,} "
                f"({self.updates_per_batch:,} updates of random existing keys + "
                f"{self.new_per_batch:,} new keys), {self.partitions} partitions, "
                f"seed {self.seed}")


@dataclass
class Workload:
    """The generated data: the initial load and the upsert batches, in order."""

    spec: WorkloadSpec
    initial: pa.Table
    batches: list[pa.Table]
    updated_keys: list[np.ndarray] = field(default_factory=list)  # key numbers per batch
    new_keys: list[np.ndarray] = field(default_factory=list)

    @property
    def schema(self) -> pa.Schema:
        return self.initial.schema


def key_strings(numbers: np.ndarray) -> pa.Array:
    """``k{n:010d}`` for every number, built straight into an Arrow string buffer."""
    nums = np.ascontiguousarray(numbers, dtype=np.int64)
    if nums.size and (nums.min() < 0 or nums.max() >= 10**KEY_DIGITS):
        raise ValueError(f"key numbers must be in [0, 1e{KEY_DIGITS})")
    width = len(KEY_PREFIX) + KEY_DIGITS
    chars = np.empty((nums.size, width), dtype=np.uint8)
    chars[:, : len(KEY_PREFIX)] = np.frombuffer(KEY_PREFIX.encode(), dtype=np.uint8)
    powers = 10 ** np.arange(KEY_DIGITS - 1, -1, -1, dtype=np.int64)
    chars[:, len(KEY_PREFIX):] = (nums[:, None] // powers) % 10 + ord("0")
    offsets = np.arange(0, (nums.size + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), nums.size,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(chars)])


def key_string(number: int) -> str:
    return f"{KEY_PREFIX}{number:0{KEY_DIGITS}d}"


def partition_values(count: int) -> list[str]:
    """The partition column's values: ``count`` consecutive dates."""
    return [f"2024-01-{day:02d}" for day in range(1, count + 1)]


def _vocabulary(rng: np.random.Generator, size: int) -> pa.Array:
    """``size`` distinct-ish lowercase words of 16-24 characters (about 20 on average)."""
    lengths = rng.integers(16, 25, size)
    letters = rng.integers(ord("a"), ord("z") + 1, (size, 24), dtype=np.uint8)
    return pa.array([letters[i, : lengths[i]].tobytes().decode() for i in range(size)],
                    pa.string())


class _RowMaker:
    def __init__(self, spec: WorkloadSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        self.vocab = _vocabulary(rng, VOCAB_SIZE)
        self.partitions = pa.array(partition_values(spec.partitions), pa.string())

    def rows(self, numbers: np.ndarray, batch: int) -> pa.Table:
        """Rows for the given key numbers; ``batch`` 0 is the initial load."""
        n = numbers.size
        rng = self.rng
        ts = TS_BASE + batch * TS_STEP + rng.integers(0, TS_STEP, n, dtype=np.int64)
        # A key always maps to the same partition (updates never move a record).
        part_idx = pa.array(numbers % self.spec.partitions, pa.int64())
        columns: dict[str, pa.Array] = {
            "key": key_strings(numbers),
            "ts": pa.array(ts, pa.int64()),
            "partition": self.partitions.take(part_idx),
        }
        for name in INT_COLUMNS:
            columns[name] = pa.array(rng.integers(0, 1_000_000_000, n, dtype=np.int64))
        for name in FLOAT_COLUMNS:
            columns[name] = pa.array(rng.random(n) * 1000.0)
        for name in STRING_COLUMNS:
            columns[name] = self.vocab.take(pa.array(rng.integers(0, VOCAB_SIZE, n)))
        return pa.table(columns)


def generate_workload(spec: WorkloadSpec) -> Workload:
    """Build the initial load and every batch (deterministic for ``spec.seed``)."""
    if spec.rows <= 0 or spec.batches < 0 or spec.batch_size <= 0:
        raise ValueError("rows and batch size must be positive, batches non-negative")
    if spec.updates_per_batch > spec.rows:
        raise ValueError("more updates per batch than existing keys")
    rng = np.random.default_rng(spec.seed)
    maker = _RowMaker(spec, rng)
    initial = maker.rows(np.arange(spec.rows, dtype=np.int64), 0)
    batches: list[pa.Table] = []
    updated: list[np.ndarray] = []
    new: list[np.ndarray] = []
    next_key = spec.rows
    for b in range(1, spec.batches + 1):
        upd = rng.choice(next_key, size=spec.updates_per_batch, replace=False).astype(np.int64)
        fresh = np.arange(next_key, next_key + spec.new_per_batch, dtype=np.int64)
        next_key += spec.new_per_batch
        numbers = np.concatenate([upd, fresh])
        rng.shuffle(numbers)  # updates and inserts interleaved, as in a real stream
        batches.append(maker.rows(numbers, b))
        updated.append(upd)
        new.append(fresh)
    return Workload(spec, initial, batches, updated, new)


def sample_keys(workload: Workload, per_group: int = 8, seed: int = 7) -> list[int]:
    """Key numbers to verify: updated in the last, first and a middle batch, newly
    inserted in a batch, and (most likely) never touched after the initial load."""
    rng = np.random.default_rng(seed)
    spec = workload.spec
    picks: list[np.ndarray] = []
    if workload.updated_keys:
        for b in sorted({0, len(workload.updated_keys) // 2, len(workload.updated_keys) - 1}):
            picks.append(rng.choice(workload.updated_keys[b], per_group, replace=False))
        if workload.new_keys[0].size:  # an update-only workload has no new keys
            picks.append(rng.choice(workload.new_keys[0], per_group, replace=False))
    picks.append(rng.choice(spec.rows, per_group, replace=False))
    return sorted({int(x) for x in np.concatenate(picks)})


def expected_latest(workload: Workload, numbers: Sequence[int]) -> dict[str, dict[str, object]]:
    """The latest version of each sampled key's row (by batch order, which is ts order)."""
    keys = pa.array([key_string(n) for n in numbers], pa.string())
    latest: dict[str, dict[str, object]] = {}
    for table in [workload.initial, *workload.batches]:
        hit = table.filter(pc.is_in(table.column("key"), value_set=keys))
        for row in hit.to_pylist():
            latest[str(row["key"])] = row
    return latest


def verify(result: pa.Table, workload: Workload, numbers: Sequence[int]) -> list[str]:
    """Cheap correctness checks of a final full read; returns the problems found."""
    problems: list[str] = []
    expected_rows = workload.spec.expected_rows
    if result.num_rows != expected_rows:
        problems.append(f"row count {result.num_rows:,} != expected {expected_rows:,}")
    distinct = pc.count_distinct(result.column("key")).as_py()
    if distinct != result.num_rows:
        problems.append(f"{result.num_rows - distinct:,} duplicate keys")
    expected = expected_latest(workload, numbers)
    keys = pa.array(list(expected), pa.string())
    cols = [c for c in DATA_COLUMNS if c in result.column_names]
    got = result.select(cols).filter(pc.is_in(result.column("key"), value_set=keys))
    got_rows = {str(r["key"]): r for r in got.to_pylist()}
    stale = 0
    for key, want in expected.items():
        have = got_rows.get(key)
        if have is None:
            problems.append(f"key {key} missing")
        elif any(have[c] != want[c] for c in cols):
            stale += 1
    if stale:
        problems.append(f"{stale}/{len(expected)} sampled keys do not carry their latest values")
    return problems


# -- machine info --------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    return None


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _filesystem(path: str) -> str:
    """The mount point and filesystem type holding ``path`` (from /proc/mounts)."""
    best = ("", "?")
    real = os.path.realpath(path)
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            mount = parts[1]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best[0]):
                best = (mount, parts[2])
    return f"{best[1]} at {best[0] or '/'}"


def package_version(module: str, dist: str | None = None) -> str | None:
    """Installed version of a distribution, or ``None`` when the module does not import."""
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(dist or module)
    return str(getattr(mod, "__version__", "?"))


def tidelake_version() -> str:
    """tidelake's version (installed, else pyproject.toml) plus the git commit if any."""
    version = "?"
    try:
        version = importlib.metadata.version("tidelake")
    except importlib.metadata.PackageNotFoundError:
        with contextlib.suppress(OSError):
            for line in (REPO_ROOT / "pyproject.toml").read_text().splitlines():
                if line.startswith("version"):
                    version = line.split("=", 1)[1].strip().strip('"')
                    break
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return version
    commit = rev.stdout.strip() if rev.returncode == 0 else "no commit"
    if dirty.returncode == 0 and dirty.stdout.strip():
        commit += ", uncommitted changes"
    return f"{version} ({commit})"


def machine_info(data_dir: str | None = None) -> dict[str, str]:
    """What the figures were measured on, as ordered label -> value pairs."""
    mem = _memory_gib()
    logical = os.cpu_count() or 1
    usable = _usable_cores()
    info = {
        "CPU": _cpu_model(),
        "cores": f"{usable} usable" + (f" of {logical} logical" if usable != logical else ""),
        "memory": f"{mem:.1f} GiB" if mem is not None else "unknown",
        "OS": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "tidelake": tidelake_version(),
    }
    for label, module, dist in (("pyarrow", "pyarrow", None), ("numpy", "numpy", None),
                                ("deltalake", "deltalake", None),
                                ("lance", "lance", "pylance")):
        info[label] = package_version(module, dist) or "not installed"
    info["load average"] = load_average()
    if data_dir is not None:
        info["data folder"] = f"{data_dir} ({_filesystem(data_dir)})"
    return info


def load_average() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews every figure."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


def machine_line(info: dict[str, str]) -> str:
    """One line naming the machine, e.g. for a results table caption."""
    return (f"{info['CPU']}, {info['cores']} cores, {info['memory']} RAM, "
            f"{info['OS']}, Python {info['Python'].split()[-1]}")


# -- timing --------------------------------------------------------------------------------


def tree_cpu() -> float:
    """CPU seconds of this process and its descendants so far (Linux ``/proc``), reaped
    children included."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15]) / ticks
    tree, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += [child for child, parent in parents.items() if parent == pid]
    return sum(times.get(pid, 0.0) for pid in tree)



class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __init__(self) -> None:
        self.start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


@contextlib.contextmanager
def timed(label: str, quiet: bool = False) -> Iterator[Stopwatch]:
    """A stopwatch that also logs ``label: N.NN s`` to stderr when it stops."""
    sw = Stopwatch()
    with sw:
        yield sw
    if not quiet:
        log(f"  {label}: {sw.seconds:.2f} s")


def rate(rows: int, seconds: float) -> float:
    return rows / seconds if seconds > 0 else float("inf")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def dir_size(path: str) -> int:
    """Bytes of every file under ``path`` (data, logs and metadata alike)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


# -- formatting ----------------------------------------------------------------------------


def fmt_rate(value: float | None) -> str:
    """Rows per second, compact: ``612k``, ``1.52M``."""
    if value is None or value != value:  # None or NaN
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}"


def fmt_seconds(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024**2:.1f} MiB"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
               right: Sequence[bool] | None = None) -> str:
    """A plain-text table with aligned columns (numbers right-aligned where asked)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    align = list(right) if right is not None else [False] * len(headers)

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, align,
                                                                  strict=True)]
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                   right: Sequence[bool] | None = None) -> str:
    align = list(right) if right is not None else [False] * len(headers)

    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |",
           "|" + "|".join("---:" if r else "---" for r in align) + "|"]
    out.extend("| " + " | ".join(esc(c) for c in row) + " |" for row in rows)
    return "\n".join(out)


def local_spark(app_name: str) -> SparkSession:
    """A local Spark session on 2 cores for a bench: this checkout on the Python workers'
    path, Arrow on, UTC, no UI or console progress, errors only in the log."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    path_env = os.pathsep.join([str(REPO_ROOT), *filter(None, os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))])
    os.environ["PYTHONPATH"] = path_env
    spark = (SparkSession.builder.master("local[2]").appName(app_name)
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.executorEnv.PYTHONPATH", path_env).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
