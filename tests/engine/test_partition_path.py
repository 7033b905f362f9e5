"""Partition path encoding: Java's escaping under urlencode=true, raw values under false,
and no partition value ever reaching the metadata folder or leaving the table."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from engine import InvalidRecordError, Table
from engine.layout.partition import DEFAULT_PARTITION, decode_partition_value, partition_path
from engine.layout.properties import loads
from tests.helpers import hudi_rs_read

URLENCODE = "hoodie.datasource.write.partitionpath.urlencode"


def _create(tmp_path: Path, partition_by: list[str], **options: str) -> Table:
    return Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                        record_key="id", precombine="ts", partition_by=partition_by,
                        options=options)


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def _data_files(folder: Path) -> list[Path]:
    """Data-table files under ``folder``: the metadata table's own files (its ``files``
    partition under ``.hoodie/metadata``, file group ``files-0000-0``) do not count."""
    mdt = folder / "metadata" / "files"
    return [p for p in _files_under(folder) if (".parquet" in p.name or ".log." in p.name
                                                  or p.name == ".hoodie_partition_metadata")
            and not (p.parent == mdt and (p.name.lstrip(".").startswith("files-0000-0_")
                                          or p.name == ".hoodie_partition_metadata"))]


@pytest.mark.parametrize("hive_style", ["true", "false"])
def test_partition_value_dot_hoodie_written_outside_metadata_folder_and_read(
        tmp_path: Path, hive_style: str) -> None:
    table = _create(tmp_path, ["p"],
                    **{"hoodie.datasource.write.hive_style_partitioning": hive_style})
    table.upsert(pa.table({"id": ["a", "b"], "ts": [1, 1], "p": [".hoodie", "x"]}))
    hoodie = Path(table.path) / ".hoodie"
    assert _data_files(hoodie) == []
    for result in (table.read(), hudi_rs_read(table.path)):
        assert sorted(zip(result.column("id").to_pylist(), result.column("p").to_pylist(),
                          strict=True)) == [("a", ".hoodie"), ("b", "x")]


def test_partition_values_dot_hoodie_and_timeline_never_write_into_timeline(
        tmp_path: Path) -> None:
    table = _create(tmp_path, ["p", "q"])
    table.upsert(pa.table({"id": ["a", "b"], "ts": [1, 1], "p": [".hoodie", "."],
                           "q": ["timeline", ".."]}))
    table.upsert(pa.table({"id": ["a"], "ts": [2], "p": [".hoodie"], "q": ["timeline"]}))
    assert _data_files(Path(table.path) / ".hoodie") == []
    for result in (table.read(), hudi_rs_read(table.path)):
        rows = sorted((r["id"], r["ts"], r["p"], r["q"]) for r in result.to_pylist())
        assert rows == [("a", 2, ".hoodie", "timeline"), ("b", 1, ".", "..")]


@pytest.mark.parametrize(("value", "segment"), [
    # Expected segments written out by hand from Java's PartitionPathEncodeUtils.charToEscape
    # (0x00-0x1F, DEL, and "#%'*/:=?\{[]^ as %XX upper-case), plus our leading-dot rule.
    ("2024/01/05", "2024%2F01%2F05"),
    ("a:b", "a%3Ab"),
    ("50%", "50%25"),
    ("[x]^{y}", "%5Bx%5D%5E%7By}"),
    ("q?a=b#c", "q%3Fa%3Db%23c"),
    ("it's \"x\"*", "it%27s %22x%22%2A"),
    ("C:\\dir", "C%3A%5Cdir"),
    ("tab\there\x7f", "tab%09here%7F"),
    ("ünï 😀-_.~", "ünï 😀-_.~"),
    ("a.b", "a.b"),
    (".hoodie", "%2Ehoodie"),
    (".", "%2E"),
    ("..", "%2E."),
    ("", DEFAULT_PARTITION),
    (None, DEFAULT_PARTITION),
])
def test_partition_path_urlencode_matches_java_escape_path_name(value: str | None,
                                                                 segment: str) -> None:
    assert partition_path(["p"], [value], hive_style=False, url_encode=True) == segment
    assert partition_path(["p"], [value], hive_style=True, url_encode=True) == f"p={segment}"
    if value:
        assert decode_partition_value(segment) == value


def test_new_table_records_urlencode_true_and_escapes_values(tmp_path: Path) -> None:
    table = _create(tmp_path, ["p"])
    props = loads((Path(table.path) / ".hoodie" / "hoodie.properties").read_text("latin-1"))
    assert props[URLENCODE] == "true"
    table.upsert(pa.table({"id": ["a"], "ts": [1], "p": ["x:y"]}))
    assert (Path(table.path) / "x%3Ay" / ".hoodie_partition_metadata").is_file()


def test_urlencode_false_table_writes_values_as_java_and_prunes_on_raw_values(
        tmp_path: Path) -> None:
    table = _create(tmp_path, ["p"], **{URLENCODE: "false"})
    props = loads((Path(table.path) / ".hoodie" / "hoodie.properties").read_text("latin-1"))
    assert props[URLENCODE] == "false"
    values = ["x:y", "%41", "a b", "2024-01-05", "a.b..", ""]
    ids = [f"id{i}" for i in range(len(values))]
    table.upsert(pa.table({"id": ids, "ts": [1] * len(ids), "p": values}))
    for folder in ("x:y", "%41", "a b", "2024-01-05", "a.b..", DEFAULT_PARTITION):
        assert (Path(table.path) / folder / ".hoodie_partition_metadata").is_file(), folder
    for value, key in zip(values[:-1], ids, strict=False):
        got = table.read(filters=[("p", "=", value)])
        assert got.column("id").to_pylist() == [key], value
    result = hudi_rs_read(table.path)
    assert dict(zip(result.column("id").to_pylist(), result.column("p").to_pylist(),
                    strict=True)) == dict(zip(ids, values, strict=True))


@pytest.mark.parametrize("value", [".hoodie", ".", "..", "../up", "a/b", "/abs", "x/",
                                   "a\\b", "nul\x00"])
def test_urlencode_false_unsafe_value_refused_naming_it(tmp_path: Path, value: str) -> None:
    table = _create(tmp_path, ["p"], **{URLENCODE: "false"})
    with pytest.raises(InvalidRecordError, match="partition value") as info:
        table.upsert(pa.table({"id": ["a", "b"], "ts": [1, 1], "p": ["ok", value]}))
    assert repr(value) in str(info.value)
    assert table.timeline() == []
    assert _data_files(Path(table.path)) == []
