"""Schema evolution on write (docs/engine.md, "Schema evolution"): new nullable columns and
widened types evolve the table, old files read nulls and widened values — ours and hudi-rs's
reads, through copy-on-write rewrites, merge-on-read logs, compaction, clustering and data
skipping — and every other change is refused naming the column before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import InvalidRecordError, SchemaEvolutionError, Table
from engine.errors import UnsupportedTableError
from engine.timeline.active import Timeline
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

COLUMNS = ["key", "ts", "part", "qty", "price", "note"]
V1 = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("part", pa.string()),
                ("qty", pa.int32()), ("price", pa.float32())])
V2 = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("part", pa.string()),
                ("qty", pa.int64()), ("price", pa.float64()), ("note", pa.string())])
OPTIONS = {"hoodie.metadata.index.column.stats.enable": "true",
           "hoodie.parquet.small.file.limit": "1"}  # inserts open new groups: old files stay


def _v1_rows(keys: range, ts: int) -> list[dict[str, Any]]:
    return [{"key": f"k{i:02d}", "ts": ts, "part": f"p{i % 3}", "qty": i,
             "price": i + 0.5} for i in keys]


def _write(table: Table, oracle: Oracle, rows: list[dict[str, Any]], schema: pa.Schema) -> str:
    instant = table.upsert(pa.Table.from_pylist(rows, schema=schema))
    oracle.upsert([{"note": None, **row} for row in rows], instant)
    return instant


def _recorded_schema(table: Table) -> dict[str, Any]:
    timeline = Timeline.load(table.storage, table.config)
    return {f["name"]: f["type"] for f in json.loads(timeline.latest_schema() or "{}")["fields"]}


def _check(table: Table, oracle: Oracle, *, hudi_rs: bool = True) -> None:
    expected = sorted_rows(oracle.snapshot(), COLUMNS)
    ours = table.read()
    assert ours.schema.field("qty").type == pa.int64()
    assert ours.schema.field("price").type == pa.float64()
    assert sorted_rows(ours, COLUMNS) == expected
    if hudi_rs:
        assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == expected
    # Reads by key (the files' row groups by key) with the new column, from old files too.
    keys = [r["key"] for r in expected[::2]]
    assert sorted_rows(table.read(columns=["key", "qty", "note"],
                                  filters=[("key", "in", keys)]), ["key", "qty", "note"]) == \
        [{c: r[c] for c in ("key", "qty", "note")} for r in expected if r["key"] in keys]
    # Data skipping on the new and the widened columns keeps the old files' rows.
    for filters, wanted in (([("note", "=", "n5")], lambda r: r["note"] == "n5"),
                            ([("qty", ">", 2**31)], lambda r: r["qty"] > 2**31),
                            ([("qty", "<", 4)], lambda r: r["qty"] < 4)):
        assert sorted_rows(table.read(filters=filters), COLUMNS) == \
            [r for r in expected if wanted(r)], filters


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_schema_evolution_added_column_and_widened_types_read_as_oracle_and_hudi_rs(
        tmp_path: Path, table_type: str) -> None:
    table = Table.create(str(tmp_path / "t"), name="evolve", table_type=table_type,
                         record_key="key", precombine="ts", partition_by="part",
                         options=OPTIONS)
    oracle = Oracle()
    _write(table, oracle, _v1_rows(range(12), 1), V1)
    _write(table, oracle, _v1_rows(range(0, 12, 4), 2), V1)  # MOR: log blocks of v1
    # v2: a new column, qty int → long (a value past int), price float → double; updates in
    # p0 and p1 only, so p2's files stay as v1 wrote them.
    v2 = [{"key": f"k{i:02d}", "ts": 3, "part": f"p{i % 3}", "qty": 2**33 + i,
           "price": i + 0.25, "note": f"n{i}"} for i in (0, 1, 3, 4)]
    v2 += [{"key": f"k{i:02d}", "ts": 3, "part": f"p{i % 3}", "qty": i, "price": 0.125,
            "note": f"n{i}"} for i in (12, 13, 15)]
    _write(table, oracle, v2, V2)
    assert _recorded_schema(table) == {
        "key": ["null", "string"], "ts": ["null", "long"], "part": ["null", "string"],
        "qty": ["null", "long"], "price": ["null", "double"], "note": ["null", "string"]}
    # hudi-rs 0.5.0 fails on a log block that both lacks a column and holds a narrower type
    # than the table's ("partial-update column 'qty' has type Int32 but the table schema
    # expects Int64"): merge-on-read is checked with it once compaction rewrote those blocks.
    mor = table_type == "MERGE_ON_READ"
    _check(table, oracle, hudi_rs=not mor)

    # A write in the old shape again: int and float are cast up (the table never narrows),
    # the missing column is refused until nulls are asked for.
    old_shape = _v1_rows(range(5, 7), 4)
    with pytest.raises(SchemaEvolutionError, match="'note'") as refused:
        table.upsert(pa.Table.from_pylist(old_shape, schema=V1))
    assert refused.value.column == "note"
    nulls = Table.open(table.path, {"hoodie.write.set.null.for.missing.columns": "true"})
    _write(nulls, oracle, old_shape, V1)
    assert _recorded_schema(table)["qty"] == ["null", "long"]
    _check(table, oracle, hudi_rs=not mor)

    # Table services rewrite old and new files into the evolved schema.
    if mor:
        assert table.compact().did_something
    else:
        assert Table.open(table.path, {"hoodie.clustering.plan.strategy.small.file.limit":
                                       str(10**9)}).cluster().did_something
    _check(table, oracle)
    assert Timeline.load(table.storage, table.config).pending() == []


def test_schema_evolution_refused_changes_name_the_column_and_write_nothing(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="refuse", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by="part")
    oracle = Oracle()
    _write(table, oracle, _v1_rows(range(6), 1), V2.remove(V2.get_field_index("note")))
    files = sorted(p for p in Path(table.path).rglob("*") if p.is_file())
    base = pa.Table.from_pylist(_v1_rows(range(2), 2))
    changes = {
        # narrowed: the long column given as float (int and long are cast up instead)
        "qty": base.set_column(3, "qty", base.column("qty").cast(pa.float32())),
        # another type
        "price": base.set_column(4, "price", pa.array(["cheap", "dear"])),
        # dropped, and renamed (a drop and an add)
        "ts": base.drop_columns(["ts"]).append_column("event_ts", base.column("ts")),
    }
    for column, data in changes.items():
        with pytest.raises(SchemaEvolutionError, match=f"'{column}'") as refused:
            table.upsert(data)
        assert refused.value.column == column
    # Nulls for missing columns never make a key or an ordering value null.
    nulls = Table.open(table.path, {"hoodie.write.set.null.for.missing.columns": "true"})
    for column in ("key", "ts"):
        with pytest.raises(InvalidRecordError, match=f"'{column}'"):
            nulls.upsert(base.drop_columns([column]))
    assert sorted(p for p in Path(table.path).rglob("*") if p.is_file()) == files
    assert Timeline.load(table.storage, table.config).pending() == []
    assert sorted_rows(table.read(), COLUMNS[:5]) == sorted_rows(oracle.snapshot(), COLUMNS[:5])


def test_schema_evolution_writer_started_before_an_evolution_keeps_it_at_commit(
        tmp_path: Path) -> None:
    """A writer that began under the old schema and commits after another writer evolved it
    records the evolved schema (readers take the latest commit's), not its own older one."""
    from engine.write.write_client import UPSERT, WriteClient

    table = Table.create(str(tmp_path / "t"), name="race", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by="part")
    oracle = Oracle()
    _write(table, oracle, _v1_rows(range(6), 1), V1)
    slow = WriteClient(table.storage, table.config, table.write_config)
    timeline, inflight = slow.begin()
    late = [{"key": "k90", "ts": 2, "part": "p9", "qty": 90, "price": 9.5}]
    records, _ = slow.prepare(pa.Table.from_pylist(late, schema=V1), timeline, dedupe=True)
    plan = slow.plan(timeline, inflight, UPSERT, records, None)
    stats = slow.execute_local(plan)
    _write(table, oracle, [{"key": "k00", "ts": 3, "part": "p0", "qty": 2**33, "price": 0.5,
                            "note": "new"}], V2)
    slow.commit(timeline, plan, stats)
    oracle.upsert([{"note": None, **row} for row in late])
    assert _recorded_schema(table)["note"] == ["null", "string"]
    assert _recorded_schema(table)["qty"] == ["null", "long"]
    _check(table, oracle)


BAD_NAMES = ["a.b", "my col", "1st", "x-y"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_column_name_not_an_avro_name_refused_at_create_and_write_naming_it(
        tmp_path: Path, bad: str) -> None:
    """A column (or nested struct field) whose name is no Avro name
    (``[A-Za-z_][A-Za-z0-9_]*``) would make a table hudi-rs cannot read ("Invalid field
    name") and Hudi's Java writer refuses: it is refused naming the column and the rule when
    the table is created with it, when a first batch or an evolving batch would add it, also
    inside a struct; nothing is written, and hudi-rs still reads the table."""
    rule = r"\[A-Za-z_\]\[A-Za-z0-9_\]\*"
    with pytest.raises(SchemaEvolutionError, match=rf"'{bad}'.*{rule}") as refused:
        Table.create(str(tmp_path / "created"), name="t", record_key="k",
                     schema=pa.schema([("k", pa.string()), (bad, pa.int64())]))
    assert refused.value.column == bad
    assert not (tmp_path / "created").exists()
    nested = pa.struct([("ok", pa.int64()), (bad, pa.int64())])
    with pytest.raises(SchemaEvolutionError, match=rf"'s\.element\.{bad}'") as refused:
        Table.create(str(tmp_path / "created"), name="t", record_key="k",
                     schema=pa.schema([("k", pa.string()), ("s", pa.list_(nested))]))
    assert refused.value.column == f"s.element.{bad}"

    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="k", precombine="ts")
    first = pa.table({"k": ["a"], "ts": [1], bad: [1]})
    with pytest.raises(SchemaEvolutionError, match=rf"'{bad}'.*{rule}"):
        table.upsert(first)
    assert Timeline.load(table.storage, table.config).pending() == []
    table.upsert(pa.table({"k": ["a"], "ts": [1], "s": pa.array([{"ok": 1}], pa.struct(
        [("ok", pa.int64())]))}))
    files = sorted(p for p in Path(table.path).rglob("*") if p.is_file())
    for data, column in (
            (pa.table({"k": ["b"], "ts": [2], "s": pa.array([{"ok": 2}], pa.struct(
                [("ok", pa.int64())])), bad: [2]}), bad),
            (pa.table({"k": ["b"], "ts": [2], "s": pa.array([{"ok": 2, bad: 3}], nested)}),
             f"s.{bad}")):
        with pytest.raises(SchemaEvolutionError, match=rf"'{column}'.*{rule}") as refused:
            table.upsert(data)
        assert refused.value.column == column
    assert sorted(p for p in Path(table.path).rglob("*") if p.is_file()) == files
    assert Timeline.load(table.storage, table.config).pending() == []
    assert hudi_rs_read(Path(table.path)).column("k").to_pylist() == ["a"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_write_to_table_whose_schema_holds_no_avro_name_refused_naming_the_column(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    """A table another writer made with a column (or a struct field) whose name is no Avro
    name: tidelake before 4413382 wrote such tables, which this simulates by turning its
    name check off for the first write. Hudi's readers refuse the table (hudi-rs: "Invalid
    field name") and its Java writer cannot parse the schema; tidelake reads it, and
    refuses every write, also one adding no column and a delete, before anything is
    written (``Table.check_writable``), naming the column and the file recording the
    schema: more commits would only grow a table no Hudi reader reads."""
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="k", precombine="ts")
    nested = pa.struct([("ok", pa.int64()), (bad, pa.int64())])
    with monkeypatch.context() as other_tool:
        other_tool.setattr("engine.schema.check_avro_names", lambda columns: None)
        table.upsert(pa.table({"k": ["a"], "ts": [1],
                               "s": pa.array([{"ok": 1, bad: 2}], nested), bad: [1]}))
    with pytest.raises(Exception, match="Invalid field name"):
        hudi_rs_read(Path(table.path))
    assert table.read().select([bad, "s"]).to_pylist() == [{bad: 1, "s": {"ok": 1, bad: 2}}]
    files = sorted(p for p in Path(table.path).rglob("*") if p.is_file())
    # the recorded schema's columns in order: s before bad, so the struct field is named
    named = (rf"\.hoodie/timeline/\d+_\d+\.deltacommit records the table schema with "
             rf"column 's\.{re.escape(bad)}'.*Avro name")
    with pytest.raises(UnsupportedTableError, match=named):
        table.check_writable()
    with pytest.raises(UnsupportedTableError, match=named):
        table.upsert(pa.table({"k": ["b"], "ts": [2],
                               "s": pa.array([{"ok": 3, bad: 4}], nested), bad: [2]}))
    with pytest.raises(UnsupportedTableError, match=named):
        table.delete(pa.table({"k": ["a"]}))
    assert sorted(p for p in Path(table.path).rglob("*") if p.is_file()) == files
    assert table.read().column("k").to_pylist() == ["a"]
