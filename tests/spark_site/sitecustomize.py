"""Test-only: a Python process that Spark starts imports pyspark and py4j from their installed
packages, not from the copies in ``pyspark.zip`` and ``py4j-*-src.zip`` that Spark puts first
on the path of its Python workers (``tests/spark_python.py`` puts this folder on
``PYTHONPATH`` for the Spark the tests start).

Python never caches bytecode for modules imported from a zip: each of those processes (the
data source lookup, creation and read planning, the streaming source runner, the worker
daemons) compiled the pyspark modules it imports from source, ~1 CPU s each. The installed
packages are the same release (the zips sit inside the installed ``pyspark``) and carry the
bytecode pip wrote. The next ``sitecustomize`` on the path runs after this one (the crash
tests' ``crash_site``).
"""

import os
import sys


def _installed_copy(entry: str) -> bool:
    """True if ``entry`` is a zip of the pip-installed pyspark whose installed package (or
    py4j, of the same version) sits beside it in ``site-packages``."""
    name = os.path.basename(entry)
    lib = os.path.dirname(os.path.abspath(entry))  # <site-packages>/pyspark/python/lib
    package = os.path.dirname(os.path.dirname(lib))
    site = os.path.dirname(package)
    if os.path.basename(package) != "pyspark" or os.path.basename(lib) != "lib":
        return False
    if name == "pyspark.zip":
        return os.path.isfile(os.path.join(package, "__init__.py"))
    if name.startswith("py4j-") and name.endswith("-src.zip"):
        version = name[len("py4j-"):-len("-src.zip")]
        return os.path.isdir(os.path.join(site, f"py4j-{version}.dist-info"))
    return False


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, as if this one were not there."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


sys.path[:] = [entry for entry in sys.path if not _installed_copy(entry)]
_chain()
