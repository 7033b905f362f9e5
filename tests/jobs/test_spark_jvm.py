"""The driver JVM's class-data archive in the product's jobs (jobs/spark_jvm.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from jobs.spark_jvm import archive_path, java_options, with_archive


def test_with_archive_written_appends_it_after_the_users_options(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"\0" * 16)
    conf = {"spark.master": "local[2]", "spark.driver.extraJavaOptions": "-Dmine=1"}
    got = with_archive(conf, archive)
    assert got == {"spark.master": "local[2]",
                   "spark.driver.extraJavaOptions": f"-Dmine=1 -XX:SharedArchiveFile={archive}"}
    assert conf["spark.driver.extraJavaOptions"] == "-Dmine=1"  # the caller's map untouched
    assert with_archive({}, archive) == {
        "spark.driver.extraJavaOptions": f"-XX:SharedArchiveFile={archive}"}


def test_with_archive_missing_leaves_the_options_as_given(tmp_path: Path) -> None:
    conf = {"spark.driver.extraJavaOptions": "-Dmine=1"}
    assert with_archive(conf, tmp_path / "never-written.jsa") == conf
    assert java_options(tmp_path / "never-written.jsa") == ""


def test_archive_path_is_under_this_environment_keyed_by_java_and_spark() -> None:
    path = archive_path()
    if path is None:
        pytest.skip("no java here")
    assert path.parent.name == "spark-cds" and path.suffix == ".jsa"
    assert path == archive_path()  # the same install finds the same file


def test_a_damaged_archive_is_ignored_by_the_jvm(tmp_path: Path) -> None:
    """What 'degrades gracefully' rests on: a JVM handed an archive it cannot map (another
    Java's, or a damaged file) starts without it instead of failing."""
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java here")
    damaged = tmp_path / "damaged.jsa"
    damaged.write_bytes(bytes(range(256)) * 4096)
    run = subprocess.run([java, java_options(damaged), "-version"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr


def test_with_archive_not_added_to_a_jvm_writing_one(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"\0" * 16)
    conf = {"spark.driver.extraJavaOptions": "-XX:ArchiveClassesAtExit=/tmp/new.jsa"}
    assert with_archive(conf, archive) == conf
