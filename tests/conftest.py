"""Shared fixtures: the sample tables beside the project (hudi-rs, the oracle: tests/helpers.py)."""

from __future__ import annotations

import datetime as _dt
import decimal
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import soak, spark_jvm, spark_python
from tests.gcs import GCSLocation, GCSServer
from tests.s3 import S3Location, S3Server

spark_jvm.use_in_environment()  # the Spark JVMs the tests start: C1 and the class-data archive
spark_python.use_in_environment()  # their Python processes import the installed pyspark

def pytest_report_header() -> str:
    """The seed of the rotating CI cases (``tests/soak.py``), which ``-q`` runs name on failure."""
    return f"{soak.rotation_note()} (rotating CI cases: docs/testing.md)" + (
        "; TIDELAKE_SOAK: every case at its full size" if soak.SOAK else "")


SAMPLES = Path(__file__).resolve().parent / "fixtures" / "hudi-samples"
"""Java-written sample tables shipped with the tests (see its README.md)."""


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    """``tests/fixtures/hudi-samples``: the zips and the ``expected`` snapshots."""
    assert (SAMPLES / "expected").is_dir(), f"sample tables missing at {SAMPLES}"
    return SAMPLES


def extract_sample(zip_path: Path, dest: Path, table_dir: str) -> Path:
    """Unzip a sample (skipping macOS resource forks) and return its table folder."""
    with zipfile.ZipFile(zip_path) as zf:
        for member in zf.namelist():
            if member.startswith("__MACOSX/"):
                continue
            zf.extract(member, dest)
    return dest / table_dir


def jsonable(value: Any) -> Any:
    """Python value in the form the sample ``expected/*.json`` files use."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.isoformat()
    if isinstance(value, _dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value



@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-protocol server (moto) on loopback for the whole session (tests/s3.py)."""
    server = S3Server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: S3Server) -> S3Location:
    """A new, empty bucket of the session's S3 server."""
    return S3Location(s3_server, s3_server.new_bucket())


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GCSServer]:
    """A GCS XML-API server on loopback for the whole session (tests/gcs.py)."""
    server = GCSServer.start()
    yield server
    server.stop()


@pytest.fixture
def gcs(gcs_server: GCSServer) -> Iterator[GCSLocation]:
    """A new, empty bucket of the session's GCS server, which enforces preconditions."""
    gcs_server.ignore_conditions = gcs_server.ignore_update_conditions = False
    yield GCSLocation(gcs_server, gcs_server.new_bucket())
    gcs_server.ignore_conditions = gcs_server.ignore_update_conditions = False
