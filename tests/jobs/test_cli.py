"""The ``tidelake`` command: the demo verifies its table; ``table show`` prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import WRITE_KEYS
from jobs.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_demo_small_run_writes_and_verifies_table(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--engine", "--output", str(out), "--batches", "3",
                 "--batch-size", "200"]) == 0
    printed = capsys.readouterr().out
    assert "matches what was written: yes" in printed
    assert "hudi-rs reads" in printed
    assert main(["table", "show", str(out / "engine-trips")]) == 0
    shown = capsys.readouterr().out
    assert "deltacommit" in shown and "file groups:" in shown


def test_table_show_missing_table_is_a_clear_error(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "show", str(tmp_path / "none")]) == 2
    assert "no Hudi table" in capsys.readouterr().err


def test_every_write_option_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for spec in WRITE_KEYS:
        assert f"`{spec.key}`" in doc, spec.key


def test_how_to_read_commands_run_as_printed(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an activated virtualenv the printed commands name this environment's scripts
    by path; with its bin folder on PATH they are bare. Either way they run."""
    import os
    import shlex
    import subprocess
    import sys

    import pyarrow as pa

    from engine import Table
    from jobs.table_access import how_to_read

    table = tmp_path / "t"
    Table.create(str(table), name="t", table_type="COPY_ON_WRITE", record_key="id",
                 precombine="ts").upsert(pa.table({"id": ["a"], "ts": [1]}))
    bin_dir = Path(sys.executable).parent
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    lines = how_to_read(Path("t")).splitlines()[1:]
    assert lines[0].split()[0] == str(bin_dir / "tidelake")
    for line in lines:
        out = subprocess.run(shlex.split(line), capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "PATH": "/usr/bin:/bin"}, check=False)
        assert out.returncode == 0, (line, out.stderr[-2000:])
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert how_to_read(Path("t")).splitlines()[1].split()[0] == "tidelake"


def _small_table(path: Path) -> None:
    import pyarrow as pa

    from engine import Table

    table = Table.create(str(path), name="trips", record_key="id", precombine="ts",
                         partition_by=["city"])
    table.upsert(pa.table({"id": ["a", "b", "c"], "ts": [1, 2, 3],
                           "city": ["oslo", "oslo", "lima"],
                           "fare": [1.5, None, 3.0],
                           "tags": [["x"], [], None]}))
    table.delete(pa.table({"id": ["b"], "city": ["oslo"]}))


def test_table_show_prints_row_count_and_schema(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _small_table(tmp_path / "t")
    assert main(["table", "show", str(tmp_path / "t")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:9] == [
        "rows: 2 (latest snapshot)",
        "",
        "schema:",
        "  id: string (nullable)",
        "  ts: long (nullable)",
        "  city: string (nullable)",
        "  fare: double (nullable)",
        "  tags: array<string (nullable)> (nullable)",
    ]


def test_table_show_into_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """``tidelake table show T | head -1``: the reader goes away; no BrokenPipeError trace."""
    import os
    import subprocess
    import sys

    _small_table(tmp_path / "t")
    process = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "table", "show", str(tmp_path / "t")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ,
                                                             "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `head` does once it has what it wants
    with process.stderr:
        err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0
    assert err == ""


def test_table_metadata_validate_rebuild_and_show(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from engine import Table
    from engine.metadata.table import MetadataTable

    path = tmp_path / "t"
    _small_table(path)  # COPY_ON_WRITE: keeps a metadata table by default
    assert main(["table", "metadata", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "agrees with storage" in out and "files checked" in out
    assert main(["table", "show", str(path)]) == 0
    assert "metadata table: files; 2 deltacommits since its last compaction; in step" in \
        capsys.readouterr().out
    table = Table.open(str(path))
    mdt = MetadataTable(table.storage, table.config)
    latest = max((i for i in mdt.timeline().instants if i.is_completed),
                 key=lambda i: i.completion_time or "")
    mdt.remove_instant(mdt.timeline(), latest.requested_time)  # a commit it never saw
    assert main(["table", "metadata", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"deltacommit: {latest.requested_time}" in out
    assert "tidelake table metadata rebuild" in out
    assert main(["table", "metadata", "rebuild", str(path)]) == 0
    assert "rebuilt" in capsys.readouterr().out
    assert main(["table", "metadata", "validate", str(path)]) == 0
    assert main(["table", "metadata", "rebuild", str(path),
                 "--set", "hoodie.metadata.enable=false"]) == 0
    assert "deleted" in capsys.readouterr().out
    assert main(["table", "metadata", "validate", str(path)]) == 0
    assert "keeps no metadata table" in capsys.readouterr().out


def test_streaming_demo_summary_splits_start_up_from_the_steady_rate() -> None:
    """The demo's summary: start-up up to the first committed batch, then the rate of the
    records after it (what the job keeps up with), not one rate over both."""
    from jobs.demo import StartUp
    from jobs.progress import Progress

    timing = StartUp(launched=100.0, session_ready=106.0, query_started=106.5)
    p = Progress()
    timing.batch(p, now=108.0)  # a batch without data committed nothing: no start-up yet
    p.batches, p.commits, p.records, p.seconds = 1, 1, 4_000, 1.5
    timing.batch(p, now=110.0)
    p.batches, p.commits, p.records, p.seconds = 11, 11, 54_000, 6.5
    timing.batch(p, now=120.0)
    assert timing.describe(p, 5_000.0).splitlines() == [
        "start-up: first batch committed 10.0 s after the job was launched (Spark session "
        "6.0 s, starting the query 0.5 s, its first batch 3.5 s)",
        "steady: 50,000 records in 10 batches over 10.0 s after it = 5,000/s, as fast as the "
        "producer sent them (5,000/s); the batches themselves took 5.0 s = 10,000 records/s "
        "while busy"]
