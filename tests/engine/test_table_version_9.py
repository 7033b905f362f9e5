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
from tests.helpers import hudi_rs_read, row_tuples, sorted_rows

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


# -- tables tidelake writes at version 9 ---------------------------------------------------------

V9 = {"hoodie.write.table.version": "9", "hoodie.metadata.index.column.stats.enable": "true"}
LOGICAL = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("region", pa.string()),
                     ("day", pa.date32()), ("at", pa.timestamp("us", "UTC")),
                     ("n", pa.int32())])


def _props(path: Path) -> dict[str, str]:
    from engine.layout.properties import loads
    return loads((path / ".hoodie" / "hoodie.properties").read_text(encoding="latin-1"))


def _mdt_files(path: Path) -> dict[str, str]:
    """MDT file (relative path) → the record schema it was written with."""
    from engine.format.hfile import HFileReader
    from engine.format.log_block import BlockType, HeaderKey, iter_blocks
    out = {}
    mdt = path / ".hoodie" / "metadata"
    for f in sorted(mdt.glob("*/*.hfile")):
        out[str(f.relative_to(mdt))] = HFileReader(f.read_bytes()).file_info["schema"].decode()
    for f in sorted(mdt.glob("*/.*.log.*")):
        schemas = {b.header[HeaderKey.SCHEMA] for b in iter_blocks(f.read_bytes())
                   if b.block_type is BlockType.HFILE_DATA}
        if schemas:
            (out[str(f.relative_to(mdt))],) = schemas
    return out


def _logical_rows(start: int, count: int, region: str) -> pa.Table:
    base = dt.datetime(2024, 1, 1, tzinfo=UTC)
    return pa.Table.from_pylist([
        {"key": f"k{i}", "ts": i, "region": region, "day": (base + dt.timedelta(days=i)).date(),
         "at": base + dt.timedelta(hours=i), "n": i} for i in range(start, start + count)],
        schema=LOGICAL)


def test_v9_created_properties_as_hudi_11_and_mdt_in_its_layout(tmp_path: Path) -> None:
    from engine.metadata.codec import read_base_file, read_log_file
    from engine.metadata.records import ColumnStats, ValueType
    from engine.metadata.schema import metadata_schema_json

    table = Table.create(str(tmp_path / "t"), name="v9", record_key="key", precombine="ts",
                         partition_by=["region"], options=V9)
    table.upsert(_logical_rows(0, 5, "a"))
    table.upsert(_logical_rows(3, 5, "b"))
    props = _props(tmp_path / "t")
    assert props["hoodie.table.version"] == props["hoodie.table.initial.version"] == "9"
    assert props["hoodie.table.ordering.fields"] == "ts"
    assert props["hoodie.table.format"] == "native"
    for gone in ("hoodie.table.precombine.field", "hoodie.record.merge.strategy.id",
                 "hoodie.compaction.payload.class"):
        assert gone not in props, gone
    java = json_props(SAMPLES / "expected" / f"{SIMPLE_META[0]}.json")
    assert {k for k in java if not k.startswith("hoodie.table.metadata") and k not in (
        "hoodie.table.index.defs.path", "hoodie.table.create.schema")} <= set(props)
    mdt_props = _props(tmp_path / "t" / ".hoodie" / "metadata")
    assert mdt_props["hoodie.table.version"] == "9"
    files = _mdt_files(tmp_path / "t")
    assert files and set(files.values()) == {metadata_schema_json(value_types=True)}
    kinds = set()
    mdt = tmp_path / "t" / ".hoodie" / "metadata"
    for f in [*mdt.glob("*_stats/*.hfile"), *mdt.glob("*_stats/.*.log.*")]:
        records = (read_base_file(f.read_bytes()) if f.suffix == ".hfile"
                   else [r for _, r in read_log_file(f.read_bytes()) if r is not None])
        for r in records:
            assert isinstance(r.payload, ColumnStats) and r.payload.value_type is not None
            kinds.add((r.payload.column_name, ValueType(r.payload.value_type.ordinal)))
    assert ("day", ValueType.DATE) in kinds and ("at", ValueType.TIMESTAMP_MICROS) in kinds
    assert ("n", ValueType.INT) in kinds and ("ts", ValueType.LONG) in kinds


def json_props(expected: Path) -> dict[str, str]:
    import json

    from engine.layout.properties import loads
    return loads(json.loads(expected.read_text())["hoodie_properties"])


@pytest.mark.parametrize("table_type", ["MERGE_ON_READ", "COPY_ON_WRITE"])
def test_v9_logical_type_stats_prune_and_match_hudi_rs(tmp_path: Path, table_type: str) -> None:
    """Date and timestamp-micros columns in V2 stats (``IntWrapper`` days, ``LongWrapper``
    micros) skip files; reads = the unfiltered read filtered = hudi-rs, through a compaction
    (MOR) and a clustering."""
    table = Table.create(str(tmp_path / "t"), name="v9", table_type=table_type,
                         record_key="key", precombine="ts", partition_by=["region"],
                         options=V9)
    for n in range(4):
        table.upsert(_logical_rows(n * 10, 10, f"r{n}"))
    table.delete(pa.table({"key": ["k3", "k33"], "region": ["r0", "r3"]}))
    if table_type == "MERGE_ON_READ":
        table.compact()
    table.upsert(_logical_rows(5, 3, "r0"))
    filters: list[list[tuple[str, str, Any]]] = [
        [("day", "<", dt.date(2024, 1, 4))], [("day", "=", dt.date(2024, 2, 5))],
        [("at", ">=", dt.datetime(2024, 1, 2, 15, tzinfo=UTC))],
        [("at", "<", dt.datetime(2024, 1, 1, 3, tzinfo=UTC))], [("n", ">", 35)]]
    for stage in ("written", "clustered"):
        unfiltered = table.read()
        theirs = hudi_rs_read(table.path)
        columns = [c for c in LOGICAL.names]
        assert sorted_rows(unfiltered, columns, "key") == sorted_rows(theirs, columns, "key")
        pruned = 0
        for terms in filters:
            want = sorted_rows(unfiltered.filter(_expression(terms)), columns, "key")
            assert sorted_rows(table.read(filters=terms), columns, "key") == want, (stage, terms)
            explained = table.explain(filters=terms)
            pruned += (explained["slices_pruned_by_column_stats"]
                       + explained["partitions_pruned_by_partition_stats"])
        assert pruned >= len(filters), stage
        table.cluster()


def _upgrade_as_java_11(path: Path) -> None:
    """What a Hudi 1.1 writer's 8 → 9 upgrade does to ``hoodie.properties`` of a tidelake
    table (``EightToNineUpgradeHandler``, docs/table-version-9.md §3.2), MDT first."""
    from engine.layout.properties import dumps

    mdt = path / ".hoodie" / "metadata" / ".hoodie" / "hoodie.properties"
    mdt_props = _props(path / ".hoodie" / "metadata")
    mdt_props["hoodie.table.version"] = "9"
    mdt.write_text(dumps(mdt_props, last_key="hoodie.table.checksum"), encoding="latin-1")
    props = _props(path)
    payload = props.pop("hoodie.compaction.payload.class")
    props.pop("hoodie.record.merge.strategy.id")
    props["hoodie.table.legacy.payload.class"] = payload
    props["hoodie.table.ordering.fields"] = props.pop("hoodie.table.precombine.field")
    props["hoodie.table.version"] = "9"
    (path / ".hoodie" / "hoodie.properties").write_text(
        dumps(props, last_key="hoodie.table.checksum"), encoding="latin-1")
    defs = path / ".hoodie" / ".index_defs" / "index.json"
    if defs.exists():  # populateIndexVersionIfMissing: V1 where the version is missing
        import json

        from engine.metadata.index_defs import dumps as dump_defs
        found = json.loads(defs.read_text(encoding="utf-8"))["indexDefinitions"]
        defs.write_text(dump_defs({k: {**v, "version": "V1"} if "version" not in v else v
                                   for k, v in found.items()}), encoding="utf-8")


def test_v9_java_upgraded_tidelake_table_appended_in_v9_layout(tmp_path: Path) -> None:
    """A tidelake v8 table a Java 1.1 writer upgraded: tidelake reads it, writes on at 9
    (the MDT's new files in 1.1's schema with V2 stats, beside the V1 ones), reads = the
    oracle = hudi-rs, filtered reads = the unfiltered read filtered."""
    from engine.metadata.schema import metadata_schema_json

    path = tmp_path / "t"
    v8 = {"hoodie.metadata.index.column.stats.enable": "true"}
    table = Table.create(str(path), name="up", record_key="key", precombine="ts",
                         partition_by=["region"], options=v8)
    table.upsert(_logical_rows(0, 6, "a"))
    table.upsert(_logical_rows(4, 6, "b"))
    before = _mdt_files(path)
    assert set(before.values()) == {metadata_schema_json()}
    _upgrade_as_java_11(path)
    table = Table.open(str(path))
    assert table.config.version == 9 and table.config.precombine_field == "ts"
    table.upsert(_logical_rows(8, 6, "a"))
    table.delete(pa.table({"key": ["k1"], "region": ["a"]}))
    table.compact()
    after = _mdt_files(path)
    new = {f: s for f, s in after.items() if f not in before}
    assert new and set(new.values()) == {metadata_schema_json(value_types=True)}
    assert _props(path)["hoodie.table.version"] == "9"
    assert "hoodie.table.precombine.field" not in _props(path)
    expected = {(f"k{i}", "a") for i in (0, 2, 3, 4, 5, *range(8, 14))}
    expected |= {(f"k{i}", "b") for i in range(4, 10)}  # SIMPLE: a key per partition
    ours, theirs = table.read(), hudi_rs_read(path)
    for read in (ours, theirs):
        assert set(row_tuples(read, ["key", "region"])) == expected
    assert row_tuples(ours, LOGICAL.names) == row_tuples(theirs, LOGICAL.names)
    for terms in ([("day", ">", dt.date(2024, 1, 10))], [("at", "<", dt.datetime(
            2024, 1, 1, 5, tzinfo=UTC))], [("region", "=", "b"), ("n", ">=", 8)]):
        want = row_tuples(ours.filter(_expression(terms)), LOGICAL.names)
        assert row_tuples(table.read(filters=terms), LOGICAL.names) == want, terms


def test_v9_upgrade_under_an_open_v8_writer_refused_then_reopened(tmp_path: Path) -> None:
    """A writer opened at version 8 whose table a Java writer upgrades meanwhile: its next
    commit is refused naming both versions, no version-8 MDT record enters the v9 table,
    nothing of the refused write is read; reopened, it writes at 9."""
    from engine.metadata.schema import metadata_schema_json

    path = tmp_path / "t"
    table = Table.create(str(path), name="up", record_key="key", precombine="ts",
                         partition_by=["region"],
                         options={"hoodie.metadata.index.column.stats.enable": "true"})
    table.upsert(_logical_rows(0, 4, "a"))
    before = _mdt_files(path)
    _upgrade_as_java_11(path)
    with pytest.raises(UnsupportedTableError, match=r"hoodie.table.version is 9 but this "
                       r"writer opened the table at version 8"):
        table.upsert(_logical_rows(2, 4, "a"))
    assert _mdt_files(path) == before  # nothing written to the MDT by the refused commit
    assert sorted(hudi_rs_read(path).column("key").to_pylist()) == ["k0", "k1", "k2", "k3"]
    assert sorted(Table.open(str(path)).read().column("key").to_pylist()) == [
        "k0", "k1", "k2", "k3"]
    reopened = Table.open(str(path))
    reopened.upsert(_logical_rows(2, 4, "a"))
    assert sorted(reopened.read().column("key").to_pylist()) == [f"k{i}" for i in range(6)]
    assert sorted(hudi_rs_read(path).column("key").to_pylist()) == [f"k{i}" for i in range(6)]
    new = {f: s for f, s in _mdt_files(path).items() if f not in before}
    assert new and set(new.values()) == {metadata_schema_json(value_types=True)}


@pytest.mark.parametrize(("key", "value"), [
    ("hoodie.table.partial.update.mode", "IGNORE_DEFAULTS"),
    ("hoodie.record.merge.property.hoodie.payload.delete.field", "_change_operation_type"),
    ("hoodie.table.format", "iceberg"),
    ("hoodie.table.base.file.format", "LANCE"),
])
def test_v9_unsupported_properties_refused_naming_the_key(sample: Path, tmp_path: Path,
                                                          key: str, value: str) -> None:
    copy = tmp_path / "t"
    shutil.copytree(sample, copy)
    props = copy / ".hoodie" / "hoodie.properties"
    props.write_text(props.read_text(encoding="latin-1") + f"\n{key}={value}\n",
                     encoding="latin-1")
    with pytest.raises(UnsupportedTableError, match=key):
        Table.open(str(copy))


def test_v9_java_sample_appended_indexes_tidelake_does_not_keep_dropped(
        sample: Path, tmp_path: Path) -> None:
    """tidelake writes to a Hudi 1.1.1 table with record index, column/partition stats and
    two secondary indexes: rows = hudi-rs, V2 stats keep pruning, and the secondary indexes
    (which tidelake does not maintain, and which its commits would leave stale for Java
    readers) are undeclared and removed."""
    copy = tmp_path / "t"
    shutil.copytree(sample, copy)
    table = Table.open(str(copy))
    old = table.read(filters=[("txn_id", "=", "TXN-001")])
    row = old.drop_columns([c for c in old.column_names if c.startswith("_hoodie")])
    row = row.set_column(row.column_names.index("amount"), "amount",
                         pa.array([Decimal("7777.00")], row.schema.field("amount").type))
    row = row.set_column(row.column_names.index("merchant_name"), "merchant_name",
                         pa.array(["Zalando"]))
    row = row.set_column(row.column_names.index("txn_ts"), "txn_ts",
                         pc.add(row.column("txn_ts"), 1))
    table.upsert(row)
    declared = _props(copy)["hoodie.table.metadata.partitions"].split(",")
    assert declared == ["column_stats", "files", "partition_stats", "record_index"]
    assert not list((copy / ".hoodie" / "metadata").glob("secondary_index_*"))
    # their definitions go with them (Java would rebuild a lone one at its next write and
    # never two, docs/table-version-9.md §4); the record index's and column stats' stay
    from engine.metadata.index_defs import read as read_defs
    defs = read_defs(Table.open(str(copy)).storage)
    assert list(defs) == ["record_index", "column_stats"]
    assert defs["column_stats"]["version"] == "V2" and defs["record_index"]["version"] == "V1"
    ours, theirs = Table.open(str(copy)).read(), hudi_rs_read(copy)
    assert sorted_rows(ours, ours.column_names, KEY) == sorted_rows(theirs, ours.column_names,
                                                                    KEY)
    assert ours.num_rows == 12
    found = Table.open(str(copy)).read(filters=[("amount", ">", Decimal("7000"))])
    assert sorted(found.column("txn_id").to_pylist()) == ["TXN-001", "TXN-007"]


def test_v9_consistent_hashing_savepoint_clean_and_change_feed(tmp_path: Path) -> None:
    """A version-9 MOR table with the consistent-hashing bucket index: upserts, deletes,
    compaction, a savepoint kept through cleaning, and the change feed; reads = hudi-rs at
    the latest and the savepointed instant."""
    options = {**V9, "hoodie.index.type": "BUCKET",
               "hoodie.index.bucket.engine": "CONSISTENT_HASHING",
               "hoodie.bucket.index.num.buckets": "2", "hoodie.cleaner.commits.retained": "1",
               "hoodie.clean.automatic": "false", "hoodie.archive.automatic": "false"}
    table = Table.create(str(tmp_path / "t"), name="ch9", record_key="key", precombine="ts",
                         partition_by=["region"], options=options)
    first = table.upsert(_logical_rows(0, 20, "a"))
    saved = table.savepoint(first)
    second = table.upsert(_logical_rows(10, 20, "a"))
    table.delete(pa.table({"key": ["k0", "k15"], "region": ["a", "a"]}))
    table.compact()
    table.upsert(_logical_rows(25, 10, "a"))
    table.clean()
    assert saved in table.savepoints()
    ours, theirs = table.read(), hudi_rs_read(table.path)
    assert row_tuples(ours, LOGICAL.names) == row_tuples(theirs, LOGICAL.names)
    assert sorted(ours.column("key").to_pylist()) == sorted(
        f"k{i}" for i in range(35) if i not in (0, 15))
    old = table.read(as_of=first)
    assert row_tuples(old, LOGICAL.names) == row_tuples(hudi_rs_read(table.path, as_of=first),
                                                        LOGICAL.names)
    assert old.num_rows == 20
    completion = {e.instant_time: e.completion_time for e in table.timeline()}
    changes = table.read_changes(completion[first], completion[second])
    assert sorted(changes.column("op").to_pylist()) == ["i"] * 10 + ["u"] * 10
    assert table.read(filters=[("day", ">", dt.date(2024, 1, 30))]).num_rows == 5


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_v9_bulk_insert_insert_then_upsert_with_record_index(tmp_path: Path,
                                                             table_type: str) -> None:
    """Version 9 through the write operations the differential does not run: a bulk insert
    into an empty table with the record index (its HFiles built from the bulk insert), an
    insert, and an upsert that moves keys to another partition through the global record
    index; the data files' rows = hudi-rs, and a point lookup by key finds the moved rows."""
    options = {**V9, "hoodie.index.type": "RECORD_INDEX",
               "hoodie.record.index.update.partition.path": "true"}
    table = Table.create(str(tmp_path / "t"), name="bulk9", table_type=table_type,
                         record_key="key", precombine="ts", partition_by=["region"],
                         options=options)
    assert table.config.version == 9
    table.bulk_insert(_logical_rows(0, 30, "a"))
    table.insert(_logical_rows(30, 5, "b"))
    moved = _logical_rows(0, 10, "b").set_column(1, "ts", pa.array(range(100, 110), pa.int64()))
    table.upsert(moved)
    ours, theirs = table.read(), hudi_rs_read(table.path)
    assert row_tuples(ours, LOGICAL.names) == row_tuples(theirs, LOGICAL.names)
    regions = dict(zip(ours.column("key").to_pylist(), ours.column("region").to_pylist(),
                       strict=True))
    assert len(regions) == 35 and ours.num_rows == 35
    assert all(regions[f"k{i}"] == ("b" if i < 10 or i >= 30 else "a") for i in range(35))
    found = table.read(filters=[("key", "=", "k3")])
    assert found.column("region").to_pylist() == ["b"]
    assert found.column("ts").to_pylist() == [103]


# -- .hoodie/.index_defs/index.json (docs/table-version-9.md §4) -------------------------------

# The columns of the 1.1.1 samples (their hoodie.table.create.schema), in their order.
TXN = pa.schema([("txn_id", pa.string()), ("account_id", pa.string()), ("txn_ts", pa.int64()),
                 ("txn_datetime", pa.timestamp("us", "UTC")), ("txn_date", pa.date32()),
                 ("amount", pa.decimal128(15, 2)), ("currency", pa.string()),
                 ("txn_type", pa.string()), ("merchant_name", pa.string()),
                 ("is_international", pa.bool_()), ("fee_amount", pa.decimal128(10, 2)),
                 ("txn_metadata", pa.string()), ("region", pa.string())])
V8_SAMPLE = "quickstart_trips_table__mor__avro__v8_trips_8i3u1d"


def _txn_rows(ids: range, region: str) -> pa.Table:
    at = dt.datetime(2024, 1, 15, 16, tzinfo=UTC)
    return pa.Table.from_pylist([
        {"txn_id": f"TXN-{i:03d}", "account_id": f"A{i}", "txn_ts": 1700000000000 + i,
         "txn_datetime": at + dt.timedelta(hours=i), "txn_date": (at + dt.timedelta(days=i))
         .date(), "amount": Decimal(f"{i}.50"), "currency": "USD", "txn_type": "debit",
         "merchant_name": f"M{i % 3}", "is_international": i % 2 == 0,
         "fee_amount": Decimal("1.00"), "txn_metadata": "{}", "region": region}
        for i in ids], schema=TXN)


def _index_defs(path: Path) -> str:
    return (path / ".hoodie" / ".index_defs" / "index.json").read_text(encoding="utf-8")


def _sample_index_defs(name: str, tmp_path: Path) -> str:
    import zipfile
    with zipfile.ZipFile(SAMPLES / f"{name}.zip") as zf:
        (member,) = [m for m in zf.namelist() if m.endswith(".index_defs/index.json")
                     and not m.startswith("__MACOSX/")]
        return zf.read(member).decode("utf-8")


@pytest.mark.parametrize("name", [*SIMPLE_META,
                                  "sample_table__mor__avro__v9_nonpartitioned_rollback",
                                  "sample_table__cow__v9_timebasedkeygen_nonhivestyle",
                                  V8_SAMPLE])
def test_index_defs_written_as_jackson_writes_them(name: str, tmp_path: Path) -> None:
    """Every Java-written index.json (1.1.1 and 1.0) re-serialises byte for byte."""
    import json

    from engine.metadata.index_defs import dumps
    text = _sample_index_defs(name, tmp_path)
    assert dumps(json.loads(text)["indexDefinitions"]) == text


@pytest.mark.parametrize("version", [8, 9])
def test_index_defs_of_a_created_table_as_hudi_writes_them_and_dropped_with_the_partition(
        tmp_path: Path, version: int) -> None:
    """A table tidelake creates with column stats and the record index gets the
    definitions Java writes for the same table: version 9 as Hudi 1.1.1's samples (less
    their secondary indexes, and less the decimal columns, which tidelake does not index),
    version 8 as Hudi 1.0's (no ``version``, no record index entry). Disabling column stats
    drops its definition with the partition; the file stays."""
    import json

    path = tmp_path / "t"
    options = {"hoodie.write.table.version": str(version),
               "hoodie.metadata.index.column.stats.enable": "true",
               "hoodie.metadata.record.index.enable": "true"}
    table = Table.create(str(path), name="txns", record_key="txn_id", precombine="txn_ts",
                         partition_by=["region"], options=options)
    table.upsert(_txn_rows(range(1, 5), "us"))
    table.upsert(_txn_rows(range(5, 9), "eu"))
    table.upsert(_txn_rows(range(3, 5), "us"))
    props = _props(path)
    assert props["hoodie.table.index.defs.path"] == ".hoodie/.index_defs/index.json"
    ours = json.loads(_index_defs(path))["indexDefinitions"]
    if version == 9:
        java = json.loads(_sample_index_defs(SIMPLE_META[0], tmp_path))["indexDefinitions"]
        java = {k: v for k, v in java.items() if not k.startswith("secondary_index_")}
        java["column_stats"]["sourceFields"] = [
            c for c in java["column_stats"]["sourceFields"]
            if c not in ("amount", "fee_amount")]
    else:
        java = json.loads(_sample_index_defs(V8_SAMPLE, tmp_path))["indexDefinitions"]
        java = {"column_stats": {**java["column_stats"], "sourceFields": [
            *java["column_stats"]["sourceFields"][:3],
            *(c for c in TXN.names if c not in ("amount", "fee_amount"))]}}
    assert ours == java
    assert list(ours["column_stats"]) == list(java["column_stats"])  # Jackson's key order
    assert "partition_stats" in props["hoodie.table.metadata.partitions"]
    Table.open(str(path), {"hoodie.metadata.index.column.stats.enable": "false"}).upsert(
        _txn_rows(range(9, 10), "us"))
    left = json.loads(_index_defs(path))["indexDefinitions"]
    assert "column_stats" not in left and "column_stats" not in _props(path)[
        "hoodie.table.metadata.partitions"]
    assert left == {k: v for k, v in java.items() if k != "column_stats"}
    ours_rows, theirs = Table.open(str(path)).read(), hudi_rs_read(path)
    assert row_tuples(ours_rows, TXN.names) == row_tuples(theirs, TXN.names)
    assert ours_rows.num_rows == 9


def test_index_defs_follow_schema_evolution_and_the_java_upgrade(tmp_path: Path) -> None:
    """Column stats' ``sourceFields`` follow the columns each commit indexes (a table
    created empty gets them with its first commit; an added column joins), and a v8
    table whose definitions Java's 8 → 9 upgrade stamped ``V1`` records ``V2`` once
    tidelake writes its V2 stats."""
    import json

    path = tmp_path / "t"
    v8 = {"hoodie.metadata.index.column.stats.enable": "true"}
    table = Table.create(str(path), name="up", record_key="key", precombine="ts",
                         partition_by=["region"], options=v8)
    table.upsert(_logical_rows(0, 3, "a"))
    defs = json.loads(_index_defs(path))["indexDefinitions"]
    meta = ["_hoodie_commit_time", "_hoodie_partition_path", "_hoodie_record_key"]
    assert defs == {"column_stats": {
        "indexName": "column_stats", "indexType": "column_stats",
        "indexFunction": "column_stats", "sourceFields": [*meta, *LOGICAL.names],
        "indexOptions": {}}}
    wider = _logical_rows(3, 2, "a").append_column("extra", pa.array([1.5, 2.5]))
    Table.open(str(path), v8).upsert(wider)
    defs = json.loads(_index_defs(path))["indexDefinitions"]
    assert defs["column_stats"]["sourceFields"] == [*meta, *LOGICAL.names, "extra"]
    _upgrade_as_java_11(path)
    assert json.loads(_index_defs(path))["indexDefinitions"]["column_stats"]["version"] == "V1"
    Table.open(str(path)).upsert(
        _logical_rows(5, 2, "b").append_column("extra", pa.array([3.5, 4.5])))
    defs = json.loads(_index_defs(path))["indexDefinitions"]
    assert defs["column_stats"]["version"] == "V2"
    assert Table.open(str(path)).read().num_rows == 7
    assert hudi_rs_read(path).num_rows == 7


def test_v9_sample_column_stats_rederived_from_the_files_equal_java_records(
        sample: Path) -> None:
    """Java 1.1.1's V2 column_stats records of the sample's base files, re-derived by
    tidelake from each file's footer and put in the V2 layout (``with_value_type``): equal
    record for record on every column tidelake indexes (all but the decimals)."""
    from engine.metadata.codec import read_base_file, read_log_file
    from engine.metadata.file_stats import base_file_stats, columns_to_index
    from engine.metadata.records import ColumnStats, with_value_type

    java: dict[tuple[str, str], ColumnStats] = {}
    folder = sample / ".hoodie" / "metadata" / "column_stats"
    files = sorted(folder.glob("*.hfile")) + sorted(folder.glob(".*.log.*"))
    for f in files:  # bases before logs; every data file's record is written once
        records = (read_base_file(f.read_bytes()) if f.suffix == ".hfile"
                   else [r for _, r in read_log_file(f.read_bytes()) if r is not None])
        for r in records:
            assert isinstance(r.payload, ColumnStats)
            java[(r.payload.file_name or "", r.payload.column_name or "")] = r.payload
    data_columns = pa.schema([f for f in TXN if f.name != "region"] + [TXN.field("region")])
    columns = columns_to_index(data_columns)
    assert "amount" not in columns and "txn_datetime" in columns
    checked = 0
    for parquet in sorted(sample.glob("*/*.parquet")):
        ours = base_file_stats(str(parquet), columns)
        for column in columns:
            theirs = java.get((parquet.name, column))
            if theirs is None or theirs.is_deleted:
                continue
            mine = with_value_type(ours[column])
            got = (mine.min_value, mine.max_value, mine.value_type, mine.value_count,
                   mine.null_count, mine.total_size, mine.total_uncompressed_size)
            want = (theirs.min_value, theirs.max_value, theirs.value_type,
                    theirs.value_count, theirs.null_count, theirs.total_size,
                    theirs.total_uncompressed_size)
            assert got == want, (parquet.name, column)
            checked += 1
    assert checked >= 3 * len(columns)


def test_index_defs_unreadable_left_as_is_and_writes_go_on(tmp_path: Path) -> None:
    """An index.json that is not Hudi's JSON is never overwritten and never fails a
    commit (logged); the rows stay = hudi-rs."""
    path = tmp_path / "t"
    table = Table.create(str(path), name="bad", record_key="key", precombine="ts",
                         partition_by=["region"], options=V9)
    table.upsert(_logical_rows(0, 3, "a"))
    defs = path / ".hoodie" / ".index_defs" / "index.json"
    defs.write_text("{ not json", encoding="utf-8")
    Table.open(str(path)).upsert(
        _logical_rows(3, 2, "a").append_column("extra", pa.array([1.5, 2.5])))
    assert defs.read_text(encoding="utf-8") == "{ not json"
    assert row_tuples(Table.open(str(path)).read(), LOGICAL.names) == row_tuples(
        hudi_rs_read(path), LOGICAL.names)
