"""How a user reaches a table the CLI wrote or names: the commands that read it (tidelake and
hudi-rs), runnable as printed, and the environment's object-store credentials. Used by
:mod:`jobs.cli` and :mod:`jobs.demo`."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def with_env_credentials(options: dict[str, str]) -> dict[str, str]:
    """``options`` plus the AWS credentials of the environment (hudi-rs is given both)."""
    found = {key.lower(): value for key, value in os.environ.items()
             if key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AWS_REGION", "AWS_DEFAULT_REGION")}
    return {**found, **options}


def runnable(name: str) -> str:
    """How to run ``name`` (a script of this interpreter's environment, e.g. ``tidelake`` or
    ``python``) from the current folder: bare when it is what ``PATH`` finds (an activated
    virtualenv), else its path — relative when it lies below the current folder."""
    bin_dir = Path(sys.executable).parent
    script = bin_dir / name
    if not script.exists():
        return sys.executable if name == "python" else name
    found = shutil.which(name)
    if found and Path(found).parent == bin_dir:
        return name
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def how_to_read(path: Path | str, storage_options: dict[str, str] | None = None) -> str:
    """Commands that read the table at ``path`` (tidelake and hudi-rs), runnable as printed.

    For an object store, the storage options are printed except secret ones (redacted:
    credentials are left to the environment, where the printed commands find them)."""
    from engine.redact import is_secret_key

    tidelake, python = runnable("tidelake"), runnable("python")
    if isinstance(path, Path):
        path = path.resolve()  # hudi-rs takes absolute paths or URIs only
    shown = {k: v for k, v in (storage_options or {}).items() if not is_secret_key(k)}
    flags = "".join(f" --storage-option {k}={v}" for k, v in shown.items())
    engine_args = f", storage_options={shown!r}" if shown else ""
    rs_options = f".with_storage_options({shown!r})" if shown else ""
    note = ("\n  (credentials from the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
            "AWS_REGION)" if shown else "")
    return (f"read it with:\n  {tidelake} table show {path}{flags}\n"
            f"  {python} -c \"from engine import Table; "
            f"print(Table.open('{path}'{engine_args}).read())\"\n"
            f"  {python} -c \"import pyarrow as pa; from hudi import HudiTableBuilder; "
            f"print(pa.Table.from_batches(HudiTableBuilder.from_base_uri('{path}'){rs_options}"
            f".build().read()))\"{note}")
