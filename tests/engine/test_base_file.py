"""Parquet base files: Hudi footer keys as Java writes them, atomic publishing, reading back."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine.format.base_file import (
    META_COLUMNS,
    BaseFileWriteResult,
    FooterKeys,
    java_min_max,
    read_base_file,
    read_base_file_keys,
    read_footer_keys,
    write_base_file,
)
from engine.format.bloom import BloomFilter, BloomFilterTypeCode
from tests.conftest import SAMPLES
from tests.engine.helpers import dictionary_encoded

NAME = "00000001-1b2c-4d5e-8f90-123456789abc-0_0-1-1_20250101000000000.parquet"


def _table(keys: Sequence[str | None], name: str = NAME, **data: list[object]) -> pa.Table:
    n = len(keys)
    columns = {
        "_hoodie_commit_time": ["20250101000000000"] * n,
        "_hoodie_commit_seqno": [f"20250101000000000_0_{i}" for i in range(n)],
        "_hoodie_record_key": list(keys),
        "_hoodie_partition_path": [""] * n,
        "_hoodie_file_name": [name] * n,
    }
    table = pa.table({k: pa.array(v, pa.string()) for k, v in columns.items()})
    for col, values in (data or {"v": list(range(n))}).items():
        table = table.append_column(col, pa.array(values))
    return table


def _footer(path: Path | str) -> dict[str, str]:
    meta = pq.read_metadata(path).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items()}


# --- writing ------------------------------------------------------------------------------

def test_write_base_file_footer_has_hudi_keys_and_arrow_schema(tmp_path: Path) -> None:
    keys = [f"key-{i:03d}" for i in range(200, 0, -1)]
    path = tmp_path / NAME
    result = write_base_file(str(path), _table(keys))
    footer = _footer(path)
    assert footer["hoodie_bloom_filter_type_code"] == "DYNAMIC_V0"
    assert footer["hoodie_min_record_key"] == "key-001"
    assert footer["hoodie_max_record_key"] == "key-200"
    assert "ARROW:schema" in footer
    assert "org.apache.hudi.bloomfilter" not in footer["ARROW:schema"]  # not duplicated
    expected = BloomFilter.create(num_entries=200)  # sized for the file's 200 keys
    expected.add_many(keys)
    assert footer["org.apache.hudi.bloomfilter"] == expected.serialize()
    assert result == BaseFileWriteResult(str(path), path.stat().st_size, 200, "key-001",
                                         "key-200")


def test_write_base_file_round_trip_rows_equal(tmp_path: Path) -> None:
    table = _table(["b", "a", "c"], v=[1.5, None, 3.0], s=["x", "y", None])
    path = tmp_path / NAME
    write_base_file(str(path), table, compression="zstd", row_group_size=2)
    back = read_base_file(str(path))
    assert back.equals(table)
    assert pq.ParquetFile(path).metadata.num_row_groups == 2
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"


def _columns_of_mixed_cardinality(n: int) -> dict[str, list[object]]:
    return {"city": [f"city-{i % 7}" for i in range(n)],        # 7 values: a dictionary
            "uuid": [f"uuid-{i:06d}" for i in range(n)],        # unique: plain
            "half": [f"h-{i // 2}" for i in range(n)],          # each twice: a dictionary
            "n": list(range(n))}                                # numeric: plain


def test_write_base_file_dictionary_encodes_repeated_strings_only(tmp_path: Path) -> None:
    n = 3000
    path = tmp_path / NAME
    write_base_file(str(path), _table([f"k{i}" for i in range(n)],
                                      **_columns_of_mixed_cardinality(n)))
    assert dictionary_encoded(path) == {
        "_hoodie_commit_time": True, "_hoodie_commit_seqno": False,
        "_hoodie_record_key": False, "_hoodie_partition_path": True,
        "_hoodie_file_name": True, "city": True, "uuid": False, "half": True, "n": False}
    assert read_base_file(str(path)).column("city").to_pylist()[:8] == [
        f"city-{i % 7}" for i in range(8)]


def test_write_base_file_bloom_false_writes_no_hudi_keys(tmp_path: Path) -> None:
    path = tmp_path / NAME
    result = write_base_file(str(path), _table([None, None]), bloom=False)
    assert not any(k.startswith(("hoodie_", "org.apache.hudi")) for k in _footer(path))
    assert (result.min_key, result.max_key) == (None, None)
    assert read_footer_keys(str(path)) == FooterKeys(None, None, None)


def test_write_base_file_empty_table_writes_empty_filter(tmp_path: Path) -> None:
    path = tmp_path / NAME
    result = write_base_file(str(path), _table([]))
    keys = read_footer_keys(str(path))
    assert result.num_rows == 0 and keys.min_key is None and keys.max_key is None
    assert keys.bloom is not None and keys.bloom.bit_count() == 0


def test_write_base_file_existing_path_raises_and_leaves_only_original(tmp_path: Path) -> None:
    path = tmp_path / NAME
    write_base_file(str(path), _table(["a"]))
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        write_base_file(str(path), _table(["b"]))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [NAME]


def test_write_base_file_writer_error_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises((ValueError, OSError, pa.ArrowException)):
        write_base_file(str(tmp_path / NAME), _table(["a"]), compression="no-such-codec")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "table",
    [
        _table(["a"]).drop_columns(["_hoodie_commit_seqno"]),
        _table(["a"]).select([1, 0, 2, 3, 4, 5]),
        _table(["a"]).set_column(2, "_hoodie_record_key", pa.array([1])),
        _table(["a"], name="other.parquet"),
        _table(["a", None]),
        _table(["a", ""]),
    ],
    ids=["missing-meta", "wrong-order", "key-not-string", "wrong-file-name", "null-key",
         "empty-key"],
)
def test_write_base_file_bad_table_raises_value_error(tmp_path: Path, table: pa.Table) -> None:
    with pytest.raises(ValueError):
        write_base_file(str(tmp_path / NAME), table)
    assert os.listdir(tmp_path) == []


def _dictionary_file_names(table: pa.Table, dictionary: list[str], indices: list[int]
                           ) -> pa.Table:
    column = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()),
                                            pa.array(dictionary, pa.string()))
    return table.set_column(4, "_hoodie_file_name", column)


def test_write_base_file_dictionary_file_names_checked_by_value(tmp_path: Path) -> None:
    # A copy-on-write merge passes _hoodie_file_name as a one-value dictionary column: the
    # check reads the dictionary, and a dictionary holding another name used by a row is
    # still refused (one holding it unused is not: the rows carry the right name).
    good = _dictionary_file_names(_table(["a", "b"]), [NAME], [0, 0])
    write_base_file(str(tmp_path / "1" / NAME), good)
    unused = _dictionary_file_names(_table(["a", "b"]), [NAME, "other.parquet"], [0, 0])
    write_base_file(str(tmp_path / "2" / NAME), unused)
    used = _dictionary_file_names(_table(["a", "b"]), [NAME, "other.parquet"], [0, 1])
    with pytest.raises(ValueError, match=r"other\.parquet"):
        write_base_file(str(tmp_path / "3" / NAME), used)
    assert not (tmp_path / "3" / NAME).exists()


def test_java_min_max_astral_vs_high_bmp_uses_utf16_order() -> None:
    # UTF-16: "😀" starts with 0xD83D < 0xFFFF; UTF-8 byte order says the opposite.
    keys = pa.array(["\uffff", "😀", "b", "\ue000x"])
    assert pc.min_max(keys)["max"].as_py() == "😀"
    assert java_min_max(keys) == ("b", "\uffff")
    assert java_min_max(pa.chunked_array([["z"], ["\uffff", "😀"], [None]])) == ("z", "\uffff")


def test_java_min_max_plain_keys_use_byte_order() -> None:
    assert java_min_max(pa.array(["b", "é", "a", None, "😀"])) == ("a", "😀")
    assert java_min_max(pa.array([None], pa.string())) == (None, None)


def test_write_base_file_min_max_in_java_order(tmp_path: Path) -> None:
    path = tmp_path / NAME
    result = write_base_file(str(path), _table(["😀1", "\uffff2", "a"]))
    assert (result.min_key, result.max_key) == ("a", "\uffff2")
    footer = _footer(path)
    assert footer["hoodie_max_record_key"] == "\uffff2"


# --- reading ------------------------------------------------------------------------------

def test_read_base_file_columns_and_filters_select_rows(tmp_path: Path) -> None:
    part = tmp_path / "city=chennai"
    part.mkdir()
    path = part / NAME
    write_base_file(str(path), _table(["a", "b", "c"], v=[1, 2, 3]))
    got = read_base_file(str(path), columns=["_hoodie_record_key", "v"],
                         filters=[("v", ">=", 2)])
    assert got.column_names == ["_hoodie_record_key", "v"]  # no "city" from the folder
    assert got.column("_hoodie_record_key").to_pylist() == ["b", "c"]
    expr = read_base_file(str(path), filters=pc.field("_hoodie_record_key") == "a")
    assert expr.column("v").to_pylist() == [1]
    assert expr.column_names[:5] == list(META_COLUMNS)


def test_read_footer_keys_legacy_simple_filter_read(tmp_path: Path) -> None:
    bloom = BloomFilter.create(num_entries=10, dynamic=False)
    bloom.add("k1")
    path = tmp_path / "legacy.parquet"
    table = _table(["k1"]).replace_schema_metadata({
        "com.uber.hoodie.bloomfilter": bloom.serialize(),
        "hoodie_min_record_key": "k1",
    })
    pq.write_table(table, path)
    keys = read_footer_keys(str(path))
    assert keys.min_key == "k1" and keys.max_key is None
    assert keys.bloom is not None and keys.bloom.type_code is BloomFilterTypeCode.SIMPLE
    assert keys.bloom.might_contain("k1") and not keys.bloom.might_contain("k2")


def test_read_footer_keys_corrupt_filter_raises_value_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(_table(["k"]).replace_schema_metadata(
        {"org.apache.hudi.bloomfilter": "AAAA", "hoodie_bloom_filter_type_code": "DYNAMIC_V0"}),
        path)
    with pytest.raises(ValueError, match=r"bad\.parquet"):
        read_footer_keys(str(path))


# --- real Spark-written base files --------------------------------------------------------

@pytest.fixture(scope="module")
def sample_base_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    dest = tmp_path_factory.mktemp("base-samples")
    files = []
    for zip_path in sorted(SAMPLES.glob("*.zip")):
        with zipfile.ZipFile(zip_path) as zf:
            for member in zf.namelist():
                if member.endswith(".parquet") and not member.startswith("__MACOSX/"):
                    files.append(Path(zf.extract(member, dest / zip_path.stem)))
    assert files, f"no sample base files under {SAMPLES}"
    return files


def test_read_footer_keys_sample_files_match_footer(sample_base_files: list[Path]) -> None:
    with_bloom = 0
    for path in sample_base_files:
        footer = _footer(path)
        keys = read_footer_keys(str(path))
        assert keys.min_key == footer.get("hoodie_min_record_key")
        assert keys.max_key == footer.get("hoodie_max_record_key")
        if "org.apache.hudi.bloomfilter" not in footer:
            assert keys.bloom is None
            continue
        with_bloom += 1
        assert keys.bloom is not None
        record_keys = read_base_file(str(path), columns=["_hoodie_record_key"])
        assert keys.bloom.might_contain_many(record_keys.column(0)).all()
    assert with_bloom > 0


def test_write_base_file_sample_rows_reproduce_sample_footer(
        sample_base_files: list[Path], tmp_path: Path) -> None:
    rewritten = 0
    for i, path in enumerate(sample_base_files):
        footer = _footer(path)
        if "org.apache.hudi.bloomfilter" not in footer:
            continue
        table = read_base_file(str(path))
        out = tmp_path / str(i) / path.name  # same name: _hoodie_file_name must match
        out.parent.mkdir()
        # Java sizes every filter for 60,000 keys; given that filter, the footer is Java's.
        java = BloomFilter.create()
        java.add_many(table.column("_hoodie_record_key"))
        result = write_base_file(str(out), table, bloom_filter=java)
        ours = _footer(out)
        for key in ("org.apache.hudi.bloomfilter", "hoodie_bloom_filter_type_code",
                    "hoodie_min_record_key", "hoodie_max_record_key"):
            # (.get: Java 1.1.1 writes no min/max key for a file without rows)
            assert ours.get(key) == footer.get(key), (path.name, key)
        # By default the filter is sized for the file's keys: same type, every key in it.
        sized = tmp_path / str(i) / "sized" / path.name
        sized.parent.mkdir()
        write_base_file(str(sized), table)
        own = read_footer_keys(str(sized))
        assert own.bloom is not None and own.bloom.num_entries == max(1, min(table.num_rows,
                                                                           60_000))
        assert _footer(sized)["hoodie_bloom_filter_type_code"] == "DYNAMIC_V0"
        assert own.bloom.might_contain_many(table.column("_hoodie_record_key")).all()
        assert read_base_file(str(out)).equals(table)
        assert result.num_rows == table.num_rows
        rewritten += 1
    assert rewritten > 0


def test_read_base_file_keys_many_row_groups_equals_filtered_full_read(tmp_path):
    """The two-pass key read returns exactly the rows a full read then filter returns, for
    keys spread over row groups, keys in no group, and a column subset."""
    import random

    rng = random.Random(7)
    n = 5000
    keys = [f"k{rng.getrandbits(48):012x}" for _ in range(n)]
    name = "f1-0_0-0-0_001.parquet"
    table = pa.table({
        "_hoodie_commit_time": ["001"] * n, "_hoodie_commit_seqno": [f"001_{i}" for i in range(n)],
        "_hoodie_record_key": keys, "_hoodie_partition_path": [""] * n,
        "_hoodie_file_name": [name] * n, "v": list(range(n))})
    path = str(tmp_path / name)
    write_base_file(path, table, row_group_size=700)
    assert pq.ParquetFile(path).metadata.num_row_groups == 8
    oracle = pq.read_table(path)
    wanted = [*rng.sample(keys, 9), "absent", "k", "zzzz"]
    for columns in (None, ["_hoodie_record_key", "v"]):
        got = read_base_file_keys(path, pa.array(wanted), columns=columns)
        expected = oracle.filter(pc.is_in(oracle.column("_hoodie_record_key"),
                                          value_set=pa.array(wanted)))
        if columns is not None:
            expected = expected.select(columns)
        assert got.num_rows == 9
        assert got.sort_by("v").to_pylist() == expected.sort_by("v").to_pylist()
    assert read_base_file_keys(path, pa.array(["absent"])).num_rows == 0
    # A few keys are looked for a row group at a time (stopping once all were seen): the
    # same rows, whichever groups hold them.
    for few in ([keys[0]], [keys[-1]], [keys[2500], "absent"], rng.sample(keys, 8)):
        got = read_base_file_keys(path, pa.array(few))
        expected = oracle.filter(pc.is_in(oracle.column("_hoodie_record_key"),
                                          value_set=pa.array(few)))
        assert got.sort_by("v").to_pylist() == expected.sort_by("v").to_pylist()


def test_cow_merge_keeps_old_files_dictionary_columns_and_hudi_rs_reads(tmp_path: Path) -> None:
    """A copy-on-write rewrite takes its string columns' dictionary choice from the file it
    replaces (judged on a full sample when that file was written), not from a new sample of
    the merged rows, whose first rows here (the updates' values) are all distinct; a small
    old file is judged again."""
    from engine import Table
    from tests.helpers import hudi_rs_read, sorted_rows

    n = 10_000
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "SIMPLE"})
    keys = [f"k{i:05d}" for i in range(n)]
    table.insert(pa.table({"key": keys, "ts": [1] * n, "tag": [f"t{i % 3}" for i in range(n)],
                           "uuid": [f"u{i}" for i in range(n)]}))

    def encodings() -> dict[str, bool]:
        (slc,) = table.file_slices()
        assert slc.base_file is not None
        found = dictionary_encoded(table.storage.full(slc.base_file.path))
        return {c: found[c] for c in ("tag", "uuid")}

    assert encodings() == {"tag": True, "uuid": False}
    # every row updated: the merged file's rows are the batch's, tags all distinct
    table.upsert(pa.table({"key": keys, "ts": [2] * n, "tag": [f"new-{i}" for i in range(n)],
                           "uuid": [f"u{i % 5}" for i in range(n)]}))
    assert encodings() == {"tag": True, "uuid": False}
    assert sorted_rows(hudi_rs_read(table.path), ["key", "ts", "tag", "uuid"]) == \
        sorted_rows(table.read(), ["key", "ts", "tag", "uuid"])
    # a small file is judged again on its rows
    small = Table.create(str(tmp_path / "s"), name="s", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "SIMPLE"})
    small.insert(pa.table({"key": keys[:10], "ts": [1] * 10, "tag": ["x"] * 10,
                           "uuid": ["u"] * 10}))
    small.upsert(pa.table({"key": keys[:10], "ts": [2] * 10, "tag": [f"y{i}" for i in range(10)],
                           "uuid": ["u"] * 10}))
    (slc,) = small.file_slices()
    assert slc.base_file is not None
    found = dictionary_encoded(small.storage.full(slc.base_file.path))
    assert (found["tag"], found["uuid"]) == (False, True)
