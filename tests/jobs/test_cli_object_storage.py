"""`tidelake table ...` on an s3:// table (moto on loopback): options by flag and environment."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from jobs.cli import main
from tests.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Location


def test_cli_show_and_compact_s3_table_with_env_credentials_prints_no_secret(
        s3: S3Location, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    table = Table.create(s3.uri(), name="trips", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", storage_options=s3.storage_options)
    for ts in (1, 2):
        table.upsert(pa.table({"key": [f"k{i}" for i in range(30)], "ts": [ts] * 30}))
    # Credentials from the store's usual environment, the endpoint by flag.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    flags = ["--storage-option", f"aws_endpoint_url={s3.server.endpoint}",
             "--storage-option", "aws_allow_http=true"]
    assert main(["table", "show", s3.uri(), *flags]) == 0
    out = capsys.readouterr().out
    assert "rows: 30 (latest snapshot)" in out
    assert "deltacommit" in out
    assert main(["table", "compact", s3.uri(), *flags]) == 0
    assert main(["table", "show", s3.uri(), *flags]) == 0
    captured = capsys.readouterr()
    assert "rows: 30 (latest snapshot)" in captured.out
    assert "commit" in captured.out
    for text in (captured.out, captured.err, out):
        assert SECRET_ACCESS_KEY not in text and ACCESS_KEY_ID not in text
    assert Table.open(s3.uri(), storage_options=s3.storage_options).read().num_rows == 30


def test_cli_storage_option_without_equals_exits_2_without_echoing_value(
        s3: S3Location, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "show", s3.uri(), "--storage-option", SECRET_ACCESS_KEY]) == 2
    err = capsys.readouterr().err
    assert "--storage-option" in err
    assert SECRET_ACCESS_KEY not in err


def test_engine_demo_on_s3_table_writes_checks_and_prints_how_to_read_without_secret(
        s3: S3Location, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    assert main(["demo", "--engine", "--batches", "2", "--batch-size", "200",
                 "--output", str(tmp_path), "--table", s3.uri("demo"),
                 "--s3-endpoint", s3.server.endpoint]) == 0
    out = capsys.readouterr().out
    assert "matches what was written: yes" in out
    assert "hudi-rs reads" in out
    assert (f"table show {s3.uri('demo')} --storage-option aws_endpoint_url="
            f"{s3.server.endpoint} --storage-option aws_allow_http=true") in out
    assert SECRET_ACCESS_KEY not in out and ACCESS_KEY_ID not in out
    assert list(tmp_path.iterdir()) == []  # nothing local
    rows = Table.open(s3.uri("demo"), storage_options=s3.storage_options).read().num_rows
    assert f"table holds {rows} records" in out
