"""The Python processes Spark starts in the tests import pyspark from its installed package.

Spark puts ``pyspark.zip`` and py4j's source zip (inside the installed ``pyspark``) first on
the path of every Python process it starts: the data source lookup, creation and read
planning, the streaming source runner, the worker daemons. Python caches no bytecode for
modules imported from a zip, so each of those processes compiled every pyspark module it
imported from source: ~0.8-1.1 CPU s more than importing the installed package (measured:
``import pyspark.worker, pyspark.sql.worker.plan_data_source_read, pyspark.daemon`` takes
1.2-1.8 s from the zip, 0.4-0.6 s installed). A job run of the crash test starts about ten
such processes, most of them one after the other before its first micro-batch.

:func:`use_in_environment` (called by ``tests/conftest.py``) puts ``tests/spark_site`` first
on ``PYTHONPATH``; its ``sitecustomize`` drops those two zips from ``sys.path`` where the
installed packages are the same release, then runs the next ``sitecustomize`` on the path
(the crash tests' ``crash_site``). It changes which copy of the same files is imported,
nothing else; a Spark that is not the pip-installed pyspark keeps its zips.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SITE", "pythonpath", "use_in_environment"]

SITE = Path(__file__).resolve().parent / "spark_site"
"""The folder holding the ``sitecustomize`` described above."""


def pythonpath(*first: str | Path) -> str:
    """A ``PYTHONPATH`` of ``first`` then :data:`SITE` (for a child whose path is set anew)."""
    return os.pathsep.join(dict.fromkeys([*map(str, first), str(SITE)]))


def use_in_environment() -> None:
    """Put :data:`SITE` on ``PYTHONPATH`` (kept: whatever else is there)."""
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = pythonpath(*current)
