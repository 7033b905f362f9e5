"""Shared fixtures: the sample tables beside the project, and hudi-rs as the judge."""

from __future__ import annotations

import datetime as _dt
import decimal
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hudi import HudiQueryType, HudiReadOptions, HudiTableBuilder

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


def hudi_rs_read(path: str | Path, **read_options: Any) -> pa.Table:
    """Read a table with hudi-rs (PyPI ``hudi``), the external judge.

    ``as_of``, ``start``/``end`` (incremental) and ``read_optimized`` map to hudi-rs
    read options.
    """
    table = HudiTableBuilder.from_base_uri(str(path)).build()
    options = HudiReadOptions()
    if read_options.get("as_of"):
        options = options.with_as_of_timestamp(read_options["as_of"])
    if read_options.get("start") is not None:
        options = options.with_query_type(HudiQueryType.Incremental).with_start_timestamp(
            read_options["start"])
        if read_options.get("end"):
            options = options.with_end_timestamp(read_options["end"])
    if read_options.get("read_optimized"):
        options = options.with_hudi_option("hoodie.read.use.read_optimized.mode", "true")
    batches = table.read(options)
    if not batches:
        return pa.table({})
    return pa.Table.from_batches(batches)
