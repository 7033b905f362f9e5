"""JVM options for the Spark drivers the tests start: a class-data-sharing archive and C1 only
(and RocksDB's JNI library from one extracted copy: :func:`rocksdb_dir`).

Most of a short Spark job's time on this project's 2-core machines is the JVM starting: loading
and verifying ~15,000 classes and compiling them with both JIT tiers. Measured on one job run of
the crash test's shape (1,500 records, two micro-batches, ``tests.ingest.job_child``):

================================================  ===========  =======
driver JVM options                                JVM CPU (s)  wall (s)
================================================  ===========  =======
none                                              42           42
``-XX:TieredStopAtLevel=1`` (C1 only)             25           36
C1 and ``-XX:SharedArchiveFile`` (this archive)   13           27
================================================  ===========  =======

and a local session's first ``count()`` in 7 s instead of 17. The archive is a dynamic AppCDS
archive (JDK 13+): the classes a representative job loaded, dumped by its JVM at exit
(``-XX:ArchiveClassesAtExit``). ``python -m tests.spark_jvm`` writes it once per Java and Spark
install (``scripts/test.sh`` runs it before the suites; about a minute), at the path the
product's jobs map it from (:mod:`jobs.spark_jvm`; its own writer in ``scripts/setup.sh``
may have written it first); :func:`use_in_environment`
(called by ``tests/conftest.py``) puts the options in ``SPARK_SUBMIT_OPTS``, which spark-submit
adds to the driver JVM only, so the test session's own Spark, every child job (the crash, cluster
and CLI tests) and the standalone cluster's driver start with them. A missing or stale archive is
silently not used (``-Xshare:auto``, the JVM's default): the tests pass the same way, slower.

Neither option changes what Spark or the JVM computes; the product's own JVMs map the same
archive, without C1-only.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from jobs import spark_jvm as jobs_spark_jvm
from jobs.spark_jvm import archive_path

__all__ = ["archive_path", "rocksdb_dir", "submit_opts", "use_in_environment", "write_archive"]

C1_ONLY = "-XX:TieredStopAtLevel=1"


_ROCKSDB_LIBS = {"x86_64": "librocksdbjni-linux64.so", "aarch64": "librocksdbjni-linux-aarch64.so"}
_DEFAULT_LIBRARY_PATH = "/usr/java/packages/lib:/usr/lib64:/lib64:/lib:/usr/lib"


def rocksdb_dir() -> Path | None:
    """Where RocksDB's JNI library of this Spark install is extracted (None: not on this
    platform, or no RocksDB jar).

    Without it, every JVM that opens a RocksDB state store (each GLOBAL_STATE job) extracts the
    15 MB library from its jar into a new file under ``/tmp``, and a SIGKILLed JVM never
    deletes it (``deleteOnExit``). On ``java.library.path`` the library is loaded from there
    (RocksDB tries ``System.loadLibrary`` before extracting)."""
    import platform

    import pyspark

    name = _ROCKSDB_LIBS.get(platform.machine())
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("rocksdbjni-*.jar"))
    if name is None or not jars or Path("/lib/ld-musl-x86_64.so.1").exists():
        return None
    return Path(sys.prefix) / "spark-cds" / jars[-1].stem


def _extract_rocksdb() -> None:
    import platform
    import zipfile

    target = rocksdb_dir()
    if target is None or (target / _ROCKSDB_LIBS[platform.machine()]).is_file():
        return
    import pyspark

    jar = Path(pyspark.__file__).parent / "jars" / f"{target.name}.jar"
    name = _ROCKSDB_LIBS[platform.machine()]
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    partial.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(jar) as archive, archive.open(name) as src, \
            (partial / name).open("wb") as out:
        shutil.copyfileobj(src, out)
    try:
        os.rename(partial, target)
    except OSError:  # another process extracted it first
        shutil.rmtree(partial, ignore_errors=True)
    print(f"spark_jvm: extracted {name} to {target}")


def submit_opts() -> str:
    """The driver JVM options: C1 only, the archive where one was written, and RocksDB's JNI
    library where it was extracted (:func:`rocksdb_dir`)."""
    archive = archive_path()
    opts = C1_ONLY
    if archive is not None and archive.is_file():
        opts += f" -XX:SharedArchiveFile={archive}"
    rocksdb = rocksdb_dir()
    if rocksdb is not None and rocksdb.is_dir():
        opts += f" -Djava.library.path={rocksdb}:{_DEFAULT_LIBRARY_PATH}"
    return opts


def use_in_environment() -> None:
    """Add :func:`submit_opts` to ``SPARK_SUBMIT_OPTS`` (kept: whatever the user set there)."""
    ours = submit_opts()
    current = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if ours not in current:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{current} {ours}".strip()


def write_archive() -> Path | None:
    """Write the archive unless it exists (:func:`jobs.spark_jvm.write_archive`, one archive
    for jobs and tests): run one GLOBAL_STATE job of the crash test's shape (two micro-batches
    through the Kafka source, the state operator, the sink and a commit) with
    ``-XX:ArchiveClassesAtExit``. Returns the archive, or None where none could be written
    (the reason is printed; the tests then run without it)."""
    return jobs_spark_jvm.write_archive(_crash_shape_job, "the archive job")


def _crash_shape_job(partial: Path) -> tuple[int, str]:
    import tempfile

    from ingest.broker import EmbeddedBroker
    from tests.ingest.job_harness import ChildJob, KeyedStream, job_settings, write_job

    with tempfile.TemporaryDirectory(prefix="spark-cds-") as tmp, EmbeddedBroker() as broker:
        work = Path(tmp)
        stream = KeyedStream(broker.bootstrap_servers, "cds", 1_500, seed=7)
        stream.send()
        settings = job_settings(work, broker.bootstrap_servers, "cds", batch=1_000,
                                index="GLOBAL_STATE")
        options = f"{C1_ONLY} -XX:ArchiveClassesAtExit={partial}"
        job = ChildJob(write_job(work / "job.toml", settings), work, "cds",
                       env={"SPARK_SUBMIT_OPTS": options})
        code = job.wait(timeout=600)
        return code, job.tail()


if __name__ == "__main__":
    _extract_rocksdb()
    write_archive()
