"""The Spark driver JVM's class-data-sharing archive: written once per install, mapped by
every job's JVM so that it starts without loading and verifying Spark's classes one by one.

Most of a job's start on a 2-core machine is the JVM: ~15,000 classes loaded, verified and
compiled before the first micro-batch commits. A dynamic AppCDS archive (JDK 13+) holds the
classes a representative job loaded, dumped by its JVM at exit (``-XX:ArchiveClassesAtExit``);
a JVM started with ``-XX:SharedArchiveFile`` maps them instead. ``python -m jobs.spark_jvm``
writes it (``scripts/setup.sh`` runs it once; about a minute: one small ``tidelake demo``
run), under the virtual environment, keyed by the Java runtime and the Spark jars
(:func:`archive_path`): another Java or Spark finds no archive of its own and starts without
one. :func:`with_archive` is how :func:`jobs.ingest_job.build_spark` adds it to
``spark.driver.extraJavaOptions`` when it starts the JVM itself; no archive, no option. A
stale archive that passes the key (the same Java rebuilt in place) is refused by the JVM
itself, which then starts as without it (``-Xshare:auto``, the default).

The archive changes how fast classes load, never what Spark or the JVM computes. The tests
use the same file (``tests/spark_jvm.py``, which adds C1-only compilation for its short
jobs; a job keeps both JIT tiers).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["archive_path", "java_options", "jvms_writing", "with_archive", "write_archive"]

_DUMP_WAIT_S = 180.0


def _java() -> Path | None:
    """The ``java`` that pyspark launches (``JAVA_HOME`` first, as ``spark-class`` does)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path() -> Path | None:
    """Where the archive of this Java and this Spark install lives (None without a ``java``).

    Keyed by the Java runtime's image and the Spark jars: an archive only maps into the JVM
    and class path that wrote it."""
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256()
    modules = java.parent.parent / "lib" / "modules"
    for path in (java, modules):
        with contextlib.suppress(OSError):
            stat = path.stat()
            key.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    key.update(pyspark.__version__.encode())
    key.update("\n".join(sorted(p.name for p in jars.glob("*.jar"))).encode())
    return Path(sys.prefix) / "spark-cds" / f"{key.hexdigest()[:16]}.jsa"


def java_options(archive: Path | None = None) -> str:
    """The driver JVM's option for the archive (default: this install's,
    :func:`archive_path`): ``-XX:SharedArchiveFile=…`` where it was written, else nothing."""
    if archive is None:
        with contextlib.suppress(Exception):  # no pyspark, no java: no archive
            archive = archive_path()
    if archive is not None and archive.is_file():
        return f"-XX:SharedArchiveFile={archive}"
    return ""


def with_archive(options: Mapping[str, str], archive: Path | None = None) -> dict[str, str]:
    """``options`` (a Spark conf) with :func:`java_options` added to
    ``spark.driver.extraJavaOptions``, after whatever the user put there."""
    out = dict(options)
    ours = java_options(archive)
    dumping = "ArchiveClassesAtExit" in os.environ.get("SPARK_SUBMIT_OPTS", "") + \
        out.get("spark.driver.extraJavaOptions", "")
    if ours and not dumping:  # a JVM writing an archive (:func:`write_archive`) maps none
        given = out.get("spark.driver.extraJavaOptions", "")
        out["spark.driver.extraJavaOptions"] = f"{given} {ours}".strip()
    return out


def jvms_writing(target: Path) -> list[int]:
    """Pids of live processes whose command line names ``target`` (the JVM dumping into it)."""
    needle = str(target).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


Run = Callable[[Path], tuple[int, str]]
"""``run(partial)``: one Spark job whose driver JVM starts with
``-XX:ArchiveClassesAtExit=partial`` (in ``SPARK_SUBMIT_OPTS``); its exit code and the tail of
its output."""


def write_archive(run: Run | None = None, name: str = "the archive's demo run") -> Path | None:
    """Write the archive unless it exists: ``run`` (by default one small ``tidelake demo``:
    embedded broker, 2,000 records, the GLOBAL_STATE index, whose state store loads the most
    classes) with ``-XX:ArchiveClassesAtExit``. Returns the archive, or None where none could
    be written (the reason is printed, naming the run ``name``; jobs then start without
    it)."""
    target = archive_path()
    if target is None:
        print("spark_jvm: no java found; Spark JVMs start without a class-data archive")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer; the others find it written
        if target.is_file():
            print(f"spark_jvm: {target} (class-data archive) is there")
            return target
        return _dump(target, run or _demo_run, name)


def _demo_run(partial: Path) -> tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="spark-cds-") as tmp:
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial}"}
        command = [sys.executable, "-m", "jobs.cli", "demo", "--records", "2000", "--rate",
                   "0", "--index", "GLOBAL_STATE", "--output", str(Path(tmp) / "demo")]
        try:
            run = subprocess.run(command, env=env, cwd=tmp, capture_output=True, text=True,
                                 timeout=600, check=False)
        except subprocess.TimeoutExpired:
            return -1, "timed out after 600 s"
        return run.returncode, (run.stdout + run.stderr)[-2000:]


def _dump(target: Path, run: Run, name: str) -> Path | None:
    started = time.monotonic()
    partial = target.with_name(f"{target.stem}.{os.getpid()}.partial")
    code, tail = run(partial)
    # The JVM ends after the job's Python (it exits when the gateway's pipe closes) and only
    # then writes the archive.
    deadline = time.monotonic() + _DUMP_WAIT_S
    while jvms_writing(partial) and time.monotonic() < deadline:
        time.sleep(0.2)
    if code != 0:
        partial.unlink(missing_ok=True)
        print(f"spark_jvm: {name} failed (exit {code}); no archive:\n{tail}")
        return None
    if jvms_writing(partial) or not partial.is_file() or partial.stat().st_size < 1 << 20:
        partial.unlink(missing_ok=True)
        print("spark_jvm: the JVM wrote no class-data archive (this Java may lack a base CDS "
              "archive); Spark JVMs start without one")
        return None
    os.replace(partial, target)
    size = target.stat().st_size / 2**20
    print(f"spark_jvm: wrote {target} ({size:.0f} MiB) in {time.monotonic() - started:.0f} s")
    return target


if __name__ == "__main__":
    write_archive()
