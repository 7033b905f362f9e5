"""One local SparkSession for the whole test session (fixture ``spark``).

Test modules import it with ``from tests.spark_session import spark``. The session runs
``local[2]`` with 2 shuffle partitions, no UI, Arrow conversions on, and a warehouse under a
temporary directory. Python workers run the interpreter running pytest, and find the repo's
packages (``engine``, ``ingest``) through ``PYTHONPATH``, because Spark's data sources and UDFs
are unpickled there by module name.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark"]

REPO = Path(__file__).resolve().parents[1]
_shared: list[SparkSession] = []
_users = [0]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A ``pyspark.sql.SparkSession`` shared by all tests; stopped after its last user.

    pytest makes one session fixture per module that imports this one: they share one session.
    """
    if not _shared:
        _shared.append(_start(tmp_path_factory.mktemp("spark")))
    session, _users[0] = _shared[0], _users[0] + 1
    try:
        yield session
    finally:
        _users[0] -= 1
        if _users[0] == 0:
            _shared.pop().stop()


def _start(work: Path) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    with warnings.catch_warnings():
        # pyspark.testing (imported while the session starts) warns once per process that
        # pandas >= 3 is not fully supported; nothing here uses the pandas APIs it means.
        warnings.filterwarnings(
            "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
        )
        from pyspark.sql import SparkSession

        session = (
            SparkSession.builder.master("local[2]")
            .appName("tidelake-tests")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.warehouse.dir", str(work / "warehouse"))
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    return session
