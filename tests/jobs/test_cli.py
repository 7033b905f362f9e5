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
