"""The ingest job on a Spark standalone cluster: a master and a worker on loopback.

The master and the worker are the pyspark install's own (``bin/spark-class``), each in its own
process group, stopped at the end. The job runs as a child process
(``tests.ingest.job_child``) with ``spark.master = spark://127.0.0.1:<port>`` — its own driver,
separate from the test session's Spark — against the session's broker. Its report says where
each file group's write handle ran; the chain of parent processes of that Python worker shows
the executor JVM (``CoarseGrainedExecutorBackend``) the worker launched, not the driver.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ingest.job_harness import (
    ChildJob,
    KeyedStream,
    child_env,
    descendants,
    job_settings,
    table_problems,
    write_job,
)
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401

pytestmark = [
    pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka,
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
START_S = 300.0  # generous: JVM start-up is slow when other Spark jobs share the machine


def spark_home() -> Path:
    """The pyspark install, which is a complete Spark distribution (``bin/spark-class``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SparkDaemon:
    """A standalone master or worker: ``spark-class <main> <args>`` in its own process group."""

    def __init__(self, main: str, args: list[str], log: Path) -> None:
        self.log = log
        home = spark_home()
        env = child_env({"SPARK_HOME": str(home), "SPARK_NO_DAEMONIZE": "1"})
        with log.open("wb") as out:
            self.proc = subprocess.Popen([str(home / "bin" / "spark-class"), main, *args],
                                         env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait_for_log(self, pattern: str, timeout: float = START_S) -> None:
        """Wait until the daemon's log matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.log.read_text(errors="replace")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.log.name}: no {pattern!r} (exit "
                                     f"{self.proc.poll()}):\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM its process group (executors included), then SIGKILL what is left."""
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, sig)
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
            if self.proc.poll() is not None and not any(Path(f"/proc/{p}").exists()
                                                        for p in pids[1:]):
                return


@dataclass(frozen=True)
class Cluster:
    """A running standalone cluster: its master URL and the worker's pid."""

    master_url: str
    worker_pid: int


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One master and one worker (1 core, 1 GiB) on 127.0.0.1, stopped afterwards."""
    work = tmp_path_factory.mktemp("standalone")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master = SparkDaemon("org.apache.spark.deploy.master.Master",
                         ["--host", "127.0.0.1", "--port", str(port),
                          "--webui-port", str(free_port())], work / "master.log")
    worker = None
    try:
        master.wait_for_log(r"I have been elected leader|Starting Spark master")
        worker = SparkDaemon("org.apache.spark.deploy.worker.Worker",
                             [url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                              "--webui-port", str(free_port()), "--work-dir",
                              str(work / "worker")], work / "worker.log")
        worker.wait_for_log(r"Successfully registered with master")
        yield Cluster(url, worker.proc.pid)
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


def test_job_on_standalone_cluster_writes_in_worker_executors(
        standalone_cluster: Cluster, kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    """The job of ``tidelake ingest`` runs unchanged against ``spark://`` on loopback: the
    table equals the oracle (tidelake and hudi-rs) and every write handle ran in a Python
    worker of an executor that the standalone worker launched — not in the driver."""
    topic = unique_topic("cluster")
    stream = KeyedStream(kafka_bootstrap, topic, 3_000, seed=23)
    stream.send()
    settings = job_settings(tmp_path, kafka_bootstrap, topic, batch=1_000)
    settings.update({
        "spark.master": standalone_cluster.master_url,
        "spark.app_name": "tidelake-standalone-test",
        "spark.conf.spark.executorEnv.PYTHONPATH": child_env()["PYTHONPATH"],
        "spark.conf.spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
        "spark.conf.spark.pyspark.python": child_env()["PYSPARK_PYTHON"],
        "spark.conf.spark.driver.host": "127.0.0.1",
        "spark.conf.spark.driver.bindAddress": "127.0.0.1",
        "spark.conf.spark.executor.memory": "512m",
    })
    job = ChildJob(write_job(tmp_path / "job.toml", settings), tmp_path, "cluster")
    assert job.wait() == 0, job.tail()

    report = job.report()
    problems = table_problems(tmp_path / "trips", tmp_path / "trips_errors", stream)
    assert not problems, "\n".join(problems)
    assert report["finished"] and report["executor_ids"], report
    assert "driver" not in report["executor_ids"]
    written = [b for b in report["batches"] if not b["skipped"]]
    assert written and sum(b["records"] for b in written) == 3_000
    for batch in written:
        assert batch["tasks"], f"batch {batch['batch_id']} reports no write task"
        for task in batch["tasks"]:
            chain = task["ancestry"]
            pids = [p["pid"] for p in chain]
            assert chain and task["pid"] != report["driver_pid"], task
            assert report["driver_pid"] not in pids, f"{task['file_group']} ran in the driver"
            executor = next((p for p in chain if EXECUTOR_MAIN in p["cmdline"]), None)
            assert executor is not None, f"{task['file_group']}: no executor JVM above {pids}"
            executor_id = re.search(r"--executor-id (\S+)", executor["cmdline"])
            assert executor_id and executor_id.group(1) in report["executor_ids"]
            assert executor_id.group(1) != "driver"
            assert standalone_cluster.worker_pid in pids[pids.index(executor["pid"]):], (
                f"{task['file_group']}: the executor is not the standalone worker's")


READ_CHILD = r"""
import json, os, sys
from pyspark.sql import SparkSession
from ingest.spark_read import register
spark = (SparkSession.builder.master(sys.argv[1]).appName("tidelake-read-cluster")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.executor.memory", "512m")
         .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
         .config("spark.executorEnv.SPARK_LOCAL_IP", "127.0.0.1")
         .config("spark.pyspark.python", sys.executable).getOrCreate())
register(spark)
df = spark.read.format("tidelake").load(sys.argv[2])


def under_executor(rows):
    pid, chain = os.getpid(), []
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            chain.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return [any("CoarseGrainedExecutorBackend" in c for c in chain)]


placed = df.rdd.mapPartitions(under_executor).collect()
rows = [r.asDict() for r in df.collect()]
from ingest.spark_query import read_table
fast = read_table(spark, sys.argv[2])
fast_rows = [r.asDict() for r in fast.collect()]
with open(sys.argv[3], "w") as out:
    json.dump({"rows": rows, "partitions": df.rdd.getNumPartitions(), "placed": placed,
               "fast_rows": fast_rows, "fast_files": fast.inputFiles()}, out)
spark.stop()
"""


def test_spark_read_on_standalone_cluster_equals_engine_read(
        standalone_cluster: Cluster, tmp_path: Path) -> None:
    """``spark.read.format("tidelake")`` from a driver of its own against ``spark://``: one
    task per file slice, run under the standalone worker's executor JVM, and the
    rows are the engine's read of the merge-on-read table (base files, logs and a delete).
    ``ingest.spark_query.read_table`` too: the slices with logs read by the engine in the
    executor's Python workers, the base file alone by the executor's Parquet scan."""
    import json
    import sys

    import pyarrow as pa

    from engine import Table

    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="id", precombine="ts", partition_by=["city"])
    table.upsert(pa.table({"id": [f"k{i}" for i in range(30)], "ts": [1] * 30,
                           "city": ["oslo", "rome", "lima"] * 10, "fare": [1.5] * 30}))
    table.upsert(pa.table({"id": ["k1", "k2"], "ts": [2, 2], "city": ["rome", "lima"],
                           "fare": [9.0, 8.0]}))
    table.delete(pa.table({"id": ["k3"], "city": ["oslo"]}))
    table.upsert(pa.table({"id": ["b1", "b2"], "ts": [1, 1], "city": ["bergen"] * 2,
                           "fare": [3.0, 4.0]}))  # a base file alone
    out = tmp_path / "read.json"
    log = tmp_path / "child.log"
    with log.open("wb") as sink:
        child = subprocess.run([sys.executable, "-c", READ_CHILD, standalone_cluster.master_url,
                                table.path, str(out)], env=child_env(), stdout=sink,
                               stderr=subprocess.STDOUT, timeout=START_S, check=False)
    assert child.returncode == 0, log.read_text()[-3000:]
    got = json.loads(out.read_text())
    expected = table.read()
    expected = expected.cast(pa.schema([pa.field(f.name, f.type.value_type)
                                        if pa.types.is_dictionary(f.type) else f
                                        for f in expected.schema]))
    key = "_hoodie_record_key"
    assert sorted(got["rows"], key=lambda r: r[key]) == sorted(expected.to_pylist(),
                                                               key=lambda r: r[key])
    assert sorted(got["fast_rows"], key=lambda r: r[key]) == sorted(expected.to_pylist(),
                                                                    key=lambda r: r[key])
    assert [f.rsplit("/", 2)[1] for f in got["fast_files"]] == ["bergen"]
    assert got["partitions"] == len(table.scan().slices) == 4
    assert got["placed"] == [True] * 4  # every slice's task ran under the executor JVM
