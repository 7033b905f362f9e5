"""Table version 9 (Hudi 1.1/1.2, ``docs/table-version-9.md``): Java-written v9 tables read
with data skipping from their V2 column and partition stats = the unfiltered read filtered =
hudi-rs 0.5.0; versions tidelake does not know are refused by number."""

from __future__ import annotations

import datetime as dt
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Table
from engine.errors import UnsupportedTableError
from tests.conftest import SAMPLES, extract_sample
from tests.helpers import hudi_rs_read, sorted_rows

SIMPLE_META = ("sample_table__mor__avro__v9_txns_simple_meta",
               "sample_table__cow__v9_txns_simple_meta")
KEY = "_hoodie_record_key"
UTC = dt.timezone.utc

# (filter, whether the V2 stats must prune something): decimal, date, timestamp-micros,
# long, string, boolean columns, and the partition column
FILTERS: list[tuple[list[tuple[str, str, Any]], bool]] = [
    ([("amount", ">", Decimal("1000"))], True),
    ([("amount", "<=", Decimal("89.99"))], True),
    ([("fee_amount", "=", Decimal("0"))], False),
    ([("txn_date", "=", dt.date(2024, 1, 15))], True),
    ([("txn_date", ">", dt.date(2024, 1, 20))], True),
    ([("txn_datetime", "<", dt.datetime(2024, 1, 15, 16, 30, tzinfo=UTC))], True),
    ([("txn_datetime", ">", dt.datetime(2024, 1, 21, 21, 0, tzinfo=UTC))], True),
    ([("txn_ts", ">=", 1700000000010)], False),
    ([("merchant_name", "in", ["Uber", "Grab"])], True),
    ([("is_international", "=", True)], True),
    ([("region", "=", "us"), ("amount", ">", Decimal("100"))], False),
    ([("region", "=", "eu"), ("amount", ">", Decimal("1000"))], True),
]


@pytest.fixture(scope="module", params=SIMPLE_META)
def sample(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hudi 1.1.1 v9 table with record index, column and partition stats (MOR or COW)."""
    return extract_sample(SAMPLES / f"{request.param}.zip", tmp_path_factory.mktemp("v9"),
                          "v9_txns_simple_meta")


def _expression(terms: list[tuple[str, str, Any]]) -> pc.Expression:
    ops = {"=": lambda f, v: f == v, "<": lambda f, v: f < v, "<=": lambda f, v: f <= v,
           ">": lambda f, v: f > v, ">=": lambda f, v: f >= v,
           "in": lambda f, v: f.isin(v)}
    out = None
    for column, op, value in terms:
        term = ops[op](pc.field(column), value)
        out = term if out is None else out & term
    assert out is not None
    return out


def test_v9_sample_filtered_read_equals_unfiltered_filtered_and_hudi_rs(sample: Path) -> None:
    """Before V2 stats were read, every filtered read failed: ``ValueError: metadata record
    'mgnDpF60ARA=431THTTwO5Q=': malformed Avro value``."""
    table = Table.open(str(sample))
    unfiltered = table.read()
    theirs = hudi_rs_read(sample)
    assert unfiltered.num_rows == theirs.num_rows == 12
    columns = unfiltered.column_names
    pruned_any = 0
    for terms, must_prune in FILTERS:
        ours = table.read(filters=terms)
        want = sorted_rows(unfiltered.filter(_expression(terms)), columns, KEY)
        assert sorted_rows(ours, columns, KEY) == want, terms
        assert sorted_rows(theirs.filter(_expression(terms)), columns, KEY) == want, terms
        explained = table.explain(filters=terms)
        pruned = (explained["partitions_pruned_by_partition_stats"]
                  + explained["slices_pruned_by_column_stats"])
        assert explained["files_without_stats"] == 0, terms
        if must_prune:
            assert pruned > 0, (terms, explained)
        pruned_any += pruned
    assert pruned_any > 10


def test_v9_unknown_version_refused_naming_it(sample: Path, tmp_path: Path) -> None:
    copy = tmp_path / "v10"
    shutil.copytree(sample, copy)
    props = copy / ".hoodie" / "hoodie.properties"
    props.write_text(props.read_text().replace("hoodie.table.version=9",
                                               "hoodie.table.version=10"))
    with pytest.raises(UnsupportedTableError, match=r"table version 10 is not supported"):
        Table.open(str(copy))


def test_v9_decimal_stats_prune_by_value_not_bytes(sample: Path) -> None:
    """V2 decimal bounds are unscaled two's-complement bytes: compared as bytes, -1 (``ff``)
    would sort above 5000.00 (``07 a1 20``). A filter between the values proves they are
    compared as numbers: ``amount`` spans 89.99 … 5000.00 in ``region=us``."""
    table = Table.open(str(sample))
    inside = table.read(filters=[("region", "=", "us"), ("amount", "=", Decimal("5000.00"))])
    assert inside.num_rows >= 1
    above = table.explain(filters=[("region", "=", "us"), ("amount", ">", Decimal("5000.00"))])
    assert above["slices_read"] < above["slices"]
    assert pa.types.is_decimal(inside.schema.field("amount").type)
