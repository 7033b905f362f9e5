"""Our reader returns exactly what hudi-rs reads from real Spark-written sample tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine import Table
from tests.conftest import SAMPLES, extract_sample, jsonable

EXPECTED = sorted((SAMPLES / "expected").glob("*.json")) if SAMPLES.is_dir() else []


def _normalize_rows(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    def canon(v: Any) -> Any:
        if isinstance(v, float):
            return round(v, 9) if math.isfinite(v) else str(v)
        if isinstance(v, dict):
            return {k: canon(x) for k, x in v.items()}
        if isinstance(v, list):
            return [canon(x) for x in v]
        return v

    out = [json.dumps({c: canon(jsonable(r.get(c))) for c in columns}, sort_keys=True)
           for r in rows]
    return sorted(out)


@pytest.mark.parametrize("expected_path", EXPECTED, ids=[p.stem for p in EXPECTED])
def test_read_sample_table_matches_hudi_rs(samples_dir: Path, expected_path: Path,
                                           tmp_path: Path) -> None:
    expected = json.loads(expected_path.read_text())
    table_dir = extract_sample(samples_dir / expected["sample"], tmp_path,
                               expected["table_dir_in_zip"])
    result = Table.open(str(table_dir)).read()
    assert result.num_rows == expected["num_rows"]
    if not expected["num_rows"]:
        return
    columns = expected["columns"]
    assert result.column_names == columns
    ours = _normalize_rows(result.to_pylist(), columns)
    theirs = _normalize_rows(expected["rows"], columns)
    assert ours == theirs
