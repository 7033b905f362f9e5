"""Where the time goes: single-core stage rates and Spark's Python worker profiles."""

from __future__ import annotations

import cProfile
import functools
import io
import pstats
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest_parts.throughput import RunResult, job_config, run_throughput


@dataclass
class StageRates:
    records: int = 0
    read_rate: float | None = None
    prepare_rate: float | None = None
    read_profile: list[str] = field(default_factory=list)
    prepare_profile: list[str] = field(default_factory=list)
    error: str | None = None


def _top(profile: cProfile.Profile, count: int) -> list[str]:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(count)
    lines = [ln.rstrip() for ln in out.getvalue().splitlines()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return [ln for ln in lines[start:] if ln.strip()]


def stage_rates(bootstrap: str, topic: str, folder: Path, records: int, top: int
                ) -> StageRates:
    """In this process, on one core: read ``records`` of partition 0 with the job's Kafka
    reader, then run the job's prepare step (JSON decode, keys, partitions) on them."""
    from ingest.kafka_options import KafkaSourceOptions
    from ingest.kafka_source import KafkaInputPartition, KafkaStreamReader
    from ingest.prepare import prepare_batch
    from jobs.ingest_job import build_decoder, build_sink

    out = StageRates()
    try:
        options = KafkaSourceOptions.from_options({
            "kafka.bootstrap.servers": bootstrap, "subscribe": topic})
        reader = KafkaStreamReader(options)
        part = KafkaInputPartition(topic, 0, 0, records)
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        batches = list(reader.read(part))
        profile.disable()
        read_seconds = time.perf_counter() - started
        out.records = sum(b.num_rows for b in batches)
        out.read_rate = out.records / read_seconds
        out.read_profile = _top(profile, top)
        config = job_config(bootstrap=bootstrap, topic=topic, folder=folder, index="BUCKET",
                            max_offsets=records, buckets=4, log_format="parquet",
                            available_now=True, interval="1 second", shuffle=2)
        sink = build_sink(config, build_decoder(config))
        # The source's rows reach prepare as Spark hands them to mapInArrow (no headers).
        kafka_rows = [b.select(["key", "value", "topic", "partition", "offset", "timestamp"])
                      for b in batches]
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        prepared = [prepare_batch(b, sink.spec) for b in kafka_rows]
        profile.disable()
        out.prepare_rate = out.records / (time.perf_counter() - started)
        out.prepare_profile = _top(profile, top)
        del prepared
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out


WAITING = "waiting (for Arrow input from the JVM, on locks, in sleeps)"
WORKER_CATEGORIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (label, package folder, files in it; empty: every file). Spark's worker profiles keep
    # file names without folders, so a name in several packages counts for the first here.
    ("kafka-python (fetch, record decoding)", "kafka", ()),
    ("Kafka source → Arrow (ingest/kafka_source.py, kafka_read.py)", "ingest",
     ("kafka_source.py", "kafka_read.py", "kafka_offsets.py", "kafka_options.py")),
    ("JSON decode (ingest/decode.py, pyarrow.json)", "ingest", ("decode.py", "ddl.py")),
    ("prepare: keys, partition paths (ingest/prepare.py)", "ingest", ("prepare.py",)),
    ("write: placement, resolve, write handles (ingest/spark_write.py, resolve.py, engine/)",
     "ingest", ("spark_write.py", "resolve.py")),
    ("write: placement, resolve, write handles (ingest/spark_write.py, resolve.py, engine/)",
     "engine", ()),
    ("pyspark (Arrow streams to and from the JVM, worker loop)", "pyspark", ()),
    ("pyarrow (other)", "pyarrow", ()),
)


@functools.cache
def _file_categories() -> dict[str, str]:
    """File name → category, from the installed packages' files."""
    import importlib.util

    found: dict[str, str] = {}
    for label, package, files in WORKER_CATEGORIES:
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec else []
        names = set(files)
        if not names:
            for root in roots:
                names.update(p.name for p in Path(root).rglob("*.py"))
        for name in sorted(names):
            found.setdefault(name, label)
    return found


def _category_of(filename: str, name: str) -> str:
    if "acquire" in name or "sleep" in name or (filename == "ipc.py" and name == "__init__"):
        return WAITING  # pyarrow's stream reader blocks in __init__ until input arrives
    if "pyarrow._json" in name or "read_json" in name:
        return WORKER_CATEGORIES[2][0]
    if filename == "~" and ("pyarrow" in name or "numpy" in name):
        return "pyarrow (other)"
    return _file_categories().get(filename, "other")


WORKER_STAGES = (
    # (label, file, function): cumulative time of these entry points in the workers
    ("Kafka read (kafka_read.read_range)", "kafka_read.py", "read_range"),
    ("  of which kafka-python's fetch + record parsing (fetcher._unpack_records)",
     "fetcher.py", "_unpack_records"),
    ("  of which records → Arrow (kafka_read._to_batch)", "kafka_read.py", "_to_batch"),
    ("prepare (prepare.prepare_batch)", "prepare.py", "prepare_batch"),
    ("  of which JSON decode (decode.JsonDecoder.decode)", "decode.py", "decode"),
    ("placement (spark_write.place_rows)", "spark_write.py", "place_rows"),
    ("write handles (spark_write.write_group)", "spark_write.py", "write_group"),
)


@dataclass
class WorkerProfile:
    seconds: float | None = None  # wall time of the profiled run
    total: float = 0.0  # own time summed over every profiled function
    stages: dict[str, float] = field(default_factory=dict)
    categories: dict[str, float] = field(default_factory=dict)
    top: list[str] = field(default_factory=list)
    error: str | None = None


def collect_worker_profile(spark: Any, top: int) -> WorkerProfile:
    """Sum the Python workers' cProfile results (Spark's ``perf`` profilers of the data
    source read and of the mapInArrow functions) by category of code."""
    out = WorkerProfile()
    folder = tempfile.mkdtemp(prefix="tidelake-bench-prof-")
    try:
        spark.profile.dump(folder, type="perf")
        files = sorted(str(f) for f in Path(folder).rglob("*") if f.is_file())
        if not files:
            out.error = "Spark recorded no worker profile"
            return out
        stats = pstats.Stats(files[0], stream=io.StringIO())
        for extra in files[1:]:
            stats.add(extra)
        cats: dict[str, float] = defaultdict(float)
        cumulative: dict[tuple[str, str], float] = defaultdict(float)
        raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
        for (filename, _line, name), (_cc, _nc, tottime, cumtime, _callers) in raw.items():
            cats[_category_of(filename, name)] += tottime
            cumulative[(filename, name)] += cumtime
        out.total = sum(cats.values())
        out.categories = dict(sorted(cats.items(), key=lambda kv: -kv[1]))
        out.stages = {label: cumulative.get((filename, name), 0.0)
                      for label, filename, name in WORKER_STAGES}
        text = io.StringIO()
        stats.stream = text  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(top)
        lines = text.getvalue().splitlines()
        first = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
        out.top = [ln.rstrip() for ln in lines[first:] if ln.strip()]
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


PROFILER_CONFS = ("spark.sql.pyspark.udf.profiler", "spark.sql.pyspark.dataSource.profiler")


def run_worker_profile(spark: Any, **kwargs: Any) -> tuple[RunResult, WorkerProfile]:
    """An extra, untimed bucket-index run with Spark's Python worker profilers on."""
    top = kwargs.pop("top")
    for key in PROFILER_CONFS:
        spark.conf.set(key, "perf")
    try:
        run = run_throughput(spark, **kwargs)
        profile = collect_worker_profile(spark, top)
        profile.seconds = run.seconds
    finally:
        for key in PROFILER_CONFS:
            spark.conf.unset(key)
    return run, profile
