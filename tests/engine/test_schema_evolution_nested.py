"""Schema evolution inside nested columns (docs/engine.md, "Schema evolution"): a struct — a
column, a list's element, a map's value — gains a nullable field or widens a field's type
(int → long, int/long → double, float → double) as a top-level column does; older files read
null for the added field and widened values — ours and hudi-rs's reads, through copy-on-write
rewrites, merge-on-read logs of both schemas in one slice (Parquet and Avro blocks),
compaction and clustering; a nested field dropped or changed otherwise is refused naming its
path (``item.qty``, ``tags.element.n``, ``attrs.value.v``) before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import SchemaEvolutionError, Table
from engine.timeline.active import Timeline
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

COLUMNS = ["key", "ts", "part", "item", "tags", "attrs"]


def _schema(*, wide: bool) -> pa.Schema:
    """v1 (``wide=False``): int fields, no ``note``/``extra``/``w``; v2: those fields
    appended, the ints widened to long (``qty``, ``n``) and double (``v``)."""
    qty = pa.int64() if wide else pa.int32()
    item = [("name", pa.string()), ("qty", qty)] + ([("note", pa.string())] if wide else [])
    tag = [("k", pa.string()), ("n", qty)] + ([("extra", pa.string())] if wide else [])
    value = [("v", pa.float64() if wide else pa.int32())] + ([("w", pa.string())] if wide else [])
    return pa.schema([("key", pa.string()), ("ts", pa.int64()), ("part", pa.string()),
                      ("item", pa.struct(item)), ("tags", pa.list_(pa.struct(tag))),
                      ("attrs", pa.map_(pa.string(), pa.struct(value)))])


V1, V2 = _schema(wide=False), _schema(wide=True)


def _row(i: int, ts: int, *, wide: bool) -> dict[str, Any]:
    """A row as written (``wide``: v2's fields filled) — and, for the oracle, as read under
    v2 (:func:`_as_v2`)."""
    big = 2**33 if wide else 0
    row: dict[str, Any] = {
        "key": f"k{i}", "ts": ts, "part": f"p{i % 2}",
        "item": {"name": f"n{i}-{ts}", "qty": i + big},
        "tags": [{"k": f"t{j}", "n": j + big} for j in range(i % 3)] if i % 4 != 3 else None,
        "attrs": [(f"a{j}", {"v": i * 10 + j}) for j in range(i % 2 + 1)],
    }
    if i == 6:
        row["item"] = None  # a null struct stays null, whatever fields it gains
    if wide and row["item"] is not None:
        row["item"]["note"] = f"note{i}"
        for tag in row["tags"] or []:
            tag["extra"] = "x"
        row["attrs"] = [(k, {"v": v["v"] + 0.5, "w": "w"}) for k, v in row["attrs"]]
    return row


def _as_v2(row: dict[str, Any]) -> dict[str, Any]:
    """A v1 row as the evolved table reads it: the added fields null, the widened ones as
    they were (the oracle's form: Python ints read the same as long or double)."""
    out = dict(row, item=None if row["item"] is None else {"note": None, **row["item"]})
    out["tags"] = None if row["tags"] is None else [{"extra": None, **t} for t in row["tags"]]
    out["attrs"] = [(k, {"w": None, **v}) for k, v in row["attrs"]]
    return out


def _norm(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with map values and struct fields in a fixed order, numbers as floats where v2
    holds doubles (``attrs.value.v``), so reads and the oracle compare as values."""
    out = []
    for row in rows:
        r = dict(row)
        r["item"] = dict(sorted(row["item"].items())) if row["item"] is not None else None
        r["tags"] = (None if row["tags"] is None
                     else [dict(sorted(t.items())) for t in row["tags"]])
        r["attrs"] = [(k, {f: (float(x) if f == "v" and x is not None else x)
                           for f, x in sorted(v.items())}) for k, v in row["attrs"]]
        out.append(r)
    return out


HUDI_RS_OLD_LOGS = "reconcile"
"""hudi-rs 0.5.0 fails a merge-on-read slice holding a log block written before a nested
evolution: its merge only renames nested fields, so a struct of another field count ("child-count
mismatch") or a nested narrower leaf ("leaf type Int32 cannot be re-tagged as Int64") fails
the read; base files of the older shape read (docs/engine.md, "Schema evolution")."""


def _check(table: Table, oracle: Oracle, step: str, *, hudi_rs: bool = True) -> None:
    """Our reads (whole, by key) = the oracle; hudi-rs's too (``hudi_rs``), or it fails as
    :data:`HUDI_RS_OLD_LOGS` says."""
    expected = _norm(sorted_rows(oracle.snapshot(), COLUMNS))
    ours = table.read()
    assert ours.schema.field("item").type == V2.field("item").type, step
    assert _norm(sorted_rows(ours, COLUMNS)) == expected, step
    by_key = table.read(filters=[("key", "in", ["k0", "k1", "k5"])])
    assert _norm(sorted_rows(by_key, COLUMNS)) == \
        [r for r in expected if r["key"] in ("k0", "k1", "k5")], f"{step}: by key"
    if hudi_rs:
        assert _norm(sorted_rows(hudi_rs_read(table.path), COLUMNS)) == expected, \
            f"{step} (hudi-rs)"
    else:
        with pytest.raises(Exception, match=HUDI_RS_OLD_LOGS):
            hudi_rs_read(table.path)


def _create(tmp_path: Path, table_type: str, **options: str) -> Table:
    return Table.create(str(tmp_path / "t"), name="nested", table_type=table_type,
                        record_key="key", precombine="ts", partition_by="part",
                        options={"hoodie.parquet.small.file.limit": "1", **options})


def _upsert(table: Table, oracle: Oracle, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    table.upsert(pa.Table.from_pylist(rows, schema=schema))
    oracle.upsert([_as_v2(r) if schema is V1 else r for r in rows])


def _delete(table: Table, oracle: Oracle, keys: list[str]) -> None:
    table.delete(pa.table({"key": keys}))
    oracle.delete(keys)


@pytest.mark.parametrize(("table_type", "block_format"), [("COPY_ON_WRITE", "parquet"),
                                                          ("MERGE_ON_READ", "parquet"),
                                                          ("MERGE_ON_READ", "avro")])
def test_nested_evolution_struct_gains_field_then_delete_reads_as_oracle_and_hudi_rs(
        tmp_path: Path, table_type: str, block_format: str) -> None:
    table = _create(tmp_path, table_type, **{"hoodie.logfile.data.block.format": block_format})
    oracle = Oracle()
    _upsert(table, oracle, [_row(i, 1, wide=False) for i in range(8)], V1)
    _upsert(table, oracle, [_row(i, 2, wide=False) for i in (0, 4)], V1)  # MOR: a v1 log
    # v2 updates keys of p0 only: p1's files stay as v1 wrote them; k8 is new
    _upsert(table, oracle, [_row(i, 3, wide=True) for i in (2, 4, 8)], V2)
    recorded = Table.open(table.path).read_schema()
    assert recorded.field("item").type == V2.field("item").type
    cow = table_type == "COPY_ON_WRITE"  # MOR: p0's slice holds a v1 log block until compacted
    _check(table, oracle, "evolved", hudi_rs=cow)
    # deletes of a key written under v1 only and of one written under v2
    _delete(table, oracle, ["k1", "k4"])
    _check(table, oracle, "deleted", hudi_rs=cow)
    # a v1-shaped write after the evolution: refused (it lacks the new nested fields)
    with pytest.raises(SchemaEvolutionError, match=r"item\.note") as refused:
        table.upsert(pa.Table.from_pylist([_row(5, 4, wide=False)], schema=V1))
    assert refused.value.column == "item.note"
    # ... unless nulls are asked for: the table keeps its v2 types
    nulls = Table.open(table.path, {"hoodie.write.set.null.for.missing.columns": "true"})
    _upsert(nulls, oracle, [_row(5, 4, wide=False)], V1)
    _check(table, oracle, "v1 shape with nulls", hudi_rs=cow)
    if table_type == "MERGE_ON_READ":
        assert table.compact().did_something
    else:
        assert Table.open(table.path, {"hoodie.clustering.plan.strategy.small.file.limit":
                                       str(10**9)}).cluster().did_something
    _check(table, oracle, "rewritten")
    assert Timeline.load(table.storage, table.config).pending() == []


@pytest.mark.parametrize("block_format", ["parquet", "avro"])
def test_nested_widening_mor_slice_with_logs_of_both_schemas(tmp_path: Path,
                                                            block_format: str) -> None:
    """One file slice: a v1 base file, a v1 log block, a v2 log block (the same keys), then a
    v1-shaped upsert cast up to v2: every reader merges the four under v2."""
    table = _create(tmp_path, "MERGE_ON_READ",
                    **{"hoodie.logfile.data.block.format": block_format,
                       "hoodie.write.set.null.for.missing.columns": "true"})
    oracle = Oracle()
    _upsert(table, oracle, [_row(i, 1, wide=False) for i in (0, 2, 4, 6)], V1)
    _upsert(table, oracle, [_row(i, 2, wide=False) for i in (0, 2, 6)], V1)  # k6 stays so
    _upsert(table, oracle, [_row(i, 3, wide=True) for i in (2, 4)], V2)
    _upsert(table, oracle, [_row(0, 4, wide=False)], V1)
    slices = [s for s in table.file_slices() if s.partition_path == "p0"]
    assert len(slices) == 1 and len(slices[0].log_files) == 3
    _check(table, oracle, "four layers", hudi_rs=False)
    assert table.compact().did_something
    _check(table, oracle, "compacted")


def test_nested_removal_or_narrowing_refused_naming_the_field_path(tmp_path: Path) -> None:
    table = _create(tmp_path, "MERGE_ON_READ")
    oracle = Oracle()
    _upsert(table, oracle, [_row(i, 1, wide=True) for i in range(4)], V2)
    files = sorted(p for p in Path(table.path).rglob("*") if p.is_file())

    def changed(path: tuple[str, ...], new: pa.DataType | None) -> pa.Schema:
        """V2 with the field at ``path`` retyped to ``new`` (None: dropped)."""
        def edit(t: pa.DataType, rest: tuple[str, ...]) -> pa.DataType:
            if pa.types.is_list(t):
                return pa.list_(edit(t.value_type, rest[1:]))
            if pa.types.is_map(t):
                return pa.map_(t.key_type, edit(t.item_type, rest[1:]))
            fields = []
            for f in t:
                if f.name != rest[0]:
                    fields.append(f)
                elif len(rest) > 1:
                    fields.append(pa.field(f.name, edit(f.type, rest[1:])))
                elif new is not None:
                    fields.append(pa.field(f.name, new))
            return pa.struct(fields)
        top = V2.get_field_index(path[0])
        return V2.set(top, pa.field(path[0], edit(V2.field(path[0]).type, path[1:])))

    rows = [_row(1, 2, wide=True)]
    cases = [
        ("item.qty", changed(("item", "qty"), None)),  # dropped
        ("item.qty", changed(("item", "qty"), pa.float32())),  # long → float: narrowed
        ("tags.element.n", changed(("tags", "element", "n"), pa.string())),  # another type
        ("attrs.value.v", changed(("attrs", "value", "v"), pa.string())),  # double → string
        ("tags.element.extra", changed(("tags", "element", "extra"), None)),  # dropped
    ]
    for path, schema in cases:
        data = _cast_rows(rows, schema)
        with pytest.raises(SchemaEvolutionError, match=path.replace(".", r"\.")) as refused:
            table.upsert(data)
        assert refused.value.column == path
    # a struct replaced by a plain value, and the reverse
    with pytest.raises(SchemaEvolutionError, match="'item'"):
        table.upsert(pa.Table.from_pylist(
            [dict(rows[0], item="flat")], schema=V2.set(3, pa.field("item", pa.string()))))
    assert sorted(p for p in Path(table.path).rglob("*") if p.is_file()) == files
    assert Timeline.load(table.storage, table.config).pending() == []
    _check(table, oracle, "untouched")


def _cast_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """``rows`` under ``schema``: fields it lacks dropped, retyped ones given a value of the
    new type (the first field of ``schema`` that ``rows`` cannot hold as is)."""
    def fit(value: Any, t: pa.DataType) -> Any:
        if value is None:
            return None
        if pa.types.is_struct(t):
            return {f.name: fit(value.get(f.name), f.type) for f in t}
        if pa.types.is_list(t):
            return [fit(v, t.value_type) for v in value]
        if pa.types.is_map(t):
            return [(k, fit(v, t.item_type)) for k, v in value]
        if pa.types.is_string(t) and not isinstance(value, str):
            return str(value)
        if pa.types.is_integer(t) and not isinstance(value, int):
            return len(str(value))
        if pa.types.is_floating(t) and isinstance(value, int):
            return float(value % 1024)
        return value
    return pa.Table.from_pylist([{f.name: fit(r.get(f.name), f.type) for f in schema}
                                 for r in rows], schema=schema)
