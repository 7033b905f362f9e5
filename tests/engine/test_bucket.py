"""Bucket index hashing against Java's definitions (String/List hashCode, BucketIdentifier)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from engine.index import bucket as bucket_module
from engine.index.bucket import (
    bucket_file_id,
    bucket_file_id_nbcc,
    bucket_from_file_id,
    bucket_id,
    bucket_ids,
    hash_keys,
    java_list_hash,
    java_string_hash,
)
from tests.engine.helpers import ref_bucket, ref_string_hash

# --- String / List hashCode ------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("Aa", 2112),
        ("BB", 2112),  # the classic collision
        ("hello", 99162322),
        ("polygenelubricants", -2147483648),  # hashes to Integer.MIN_VALUE
        ("é", 233),
        ("😀", 31 * 0xD83D + 0xDE00),  # surrogate pair: two code units
        ("\ud800", 0xD800),  # unpaired surrogate, legal in a Java string
    ],
)
def test_java_string_hash_known_values_match_java(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected
    assert ref_string_hash(text) == expected


def test_java_list_hash_known_values_match_java() -> None:
    assert java_list_hash([]) == 1
    assert java_list_hash(["a"]) == 31 + 97 == 128
    assert java_list_hash(["a", "b"]) == 31 * 128 + 98
    assert java_list_hash([None, ""]) == 31 * 31  # null and "" both hash to 0


def test_java_string_hash_random_text_matches_reference() -> None:
    rng = random.Random(2)
    alphabet = "azAZ09:,_-é€中😀𝄞\uffff\u00ff"
    for _ in range(500):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert java_string_hash(s) == ref_string_hash(s)


# --- hash keys (KeyGenUtils.extractRecordKeysByFields, Hudi 1.x) ------------------------

@pytest.mark.parametrize(
    ("key", "fields", "expected"),
    [
        ("abc", None, ["abc"]),
        ("2024-10-24 10:11:11.234", ["ts"], ["2024-10-24 10:11:11.234"]),  # no ','
        ("id:1", ["id"], ["id:1"]),  # one pair, no ',': 1.x hashes the whole key
        ("a,b", None, ["a,b"]),  # no ':'
        ("id:2,name:Bob", None, ["2", "Bob"]),
        ("id:2,name:Bob", ["name"], ["Bob"]),
        ("id:2,name:Bob", ["name", "id"], ["2", "Bob"]),  # key order, not field order
        ("id:2,name:Bob", ["other"], ["id:2,name:Bob"]),  # no match: the whole key
        ("f1:abc,f2:bcd,efg", ["f1", "f2"], ["abc", "bcd,efg"]),  # Hudi's TestBucketIdentifier
        ("f1:101,010,f2:forceToOneBucket", ["f2"], ["forceToOneBucket"]),  # HUDI-8403
        ("col1:val1,col2:2014-10-22 13:50:42,col3:val3", None,
         ["val1", "2014-10-22 13:50:42", "val3"]),
        ("a:__null__,b:__empty__,c:x", None, [None, "", "x"]),
        ("a:1,b:", None, ["1", ""]),
        ("a:1,b:2", "a,b,", ["1", "2"]),  # config string; trailing empty dropped
        ("a:1,b:2", [""], ["1", "2"]),  # [""] means every field
    ],
)
def test_hash_keys_java_examples_match(key: str, fields: list[str] | str | None,
                                       expected: list[str | None]) -> None:
    assert hash_keys(key, fields) == expected


def test_hash_keys_non_terminating_java_key_raises_value_error() -> None:
    # Java loops forever on a skipped pair whose value holds ':' with no later ','.
    with pytest.raises(ValueError, match="does not terminate"):
        hash_keys("a:1,b:2:3", ["c"])


# --- bucket ids ---------------------------------------------------------------------------

def test_bucket_id_known_values_match_java() -> None:
    assert bucket_id("a", 10) == 128 % 10
    assert bucket_id("polygenelubricants", 7) == ref_bucket(["polygenelubricants"], 7)
    assert bucket_id("id:2,name:Bob", 16) == ref_bucket(["2", "Bob"], 16)
    assert bucket_id("😀", 1000) == (31 + 31 * 0xD83D + 0xDE00) % 1000


def _key_corpus(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "ab19:,_ é😀\uffff"
    keys = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(n)]
    keys += [f"id:{i},name:user{i}" for i in range(50)]
    keys += [f"id:{i},name:__null__" for i in range(5)] + ["id:__empty__,name:x"]
    keys += ["ts:2024-10-24 10:11:11,id:5", "id:1", "a:1,b:2:3", "x:é,y:😀", ",", ":", ",:"]
    keys += [str(i) for i in range(50)] + [str(n) for n in range(10**9, 10**9 + 20)]
    return keys


@pytest.mark.parametrize("fields", [None, ["id"], ["name", "id"], ["a", "b", "x"]])
def test_bucket_ids_mixed_keys_match_scalar_definition(fields: list[str] | None) -> None:
    keys = []
    expected = []
    for k in _key_corpus(4, 3000):
        try:
            expected.append(bucket_id(k, 37, fields))
        except ValueError:  # keys Java cannot parse are out of scope
            continue
        keys.append(k)
    got = bucket_ids(pa.array(keys), 37, fields)
    assert got.dtype == np.int32
    assert got.tolist() == expected


def test_bucket_ids_simple_keys_match_reference() -> None:
    keys = [f"{i:x}" * (i % 5 + 1) for i in range(2000)] + ["é", "😀", "\uffff😀"]
    got = bucket_ids(pa.array(keys), 64)
    assert got.tolist() == [ref_bucket([k], 64) for k in keys]


def test_bucket_ids_equal_length_keys_match_reference() -> None:
    keys = [f"{i:036d}" for i in range(0, 10**6, 997)]
    got = bucket_ids(pa.array(keys), 128)
    assert got.tolist() == [ref_bucket([k], 128) for k in keys]


def test_bucket_ids_complex_keys_match_reference() -> None:
    keys = [f"id:{i},name:n{i * 7},city:c{i % 3}" for i in range(500)]
    got = bucket_ids(pa.array(keys), 8, ["city", "id"])
    assert got.tolist() == [ref_bucket([str(i), f"c{i % 3}"], 8) for i in range(500)]


def test_bucket_ids_array_forms_and_batches_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = _key_corpus(9, 200)
    keys = [k for k in keys if k != "a:1,b:2:3"]
    expected = [bucket_id(k, 5) for k in keys]
    monkeypatch.setattr(bucket_module, "_BATCH", 7)
    forms = [
        pa.array(keys),
        pa.array(keys, pa.large_string()),
        pa.chunked_array([keys[:13], keys[13:]]),
        pa.array(["pad", *keys]).slice(1),
        pa.array(keys).dictionary_encode(),
    ]
    for form in forms:
        assert bucket_ids(form, 5).tolist() == expected


def test_bucket_ids_empty_array_returns_empty() -> None:
    assert bucket_ids(pa.array([], pa.string()), 4).tolist() == []


def test_bucket_ids_null_key_raises_value_error() -> None:
    with pytest.raises(ValueError, match="null"):
        bucket_ids(pa.array(["a", None]), 4)


@pytest.mark.parametrize("num_buckets", [0, -3])
def test_bucket_id_non_positive_num_buckets_raises_value_error(num_buckets: int) -> None:
    with pytest.raises(ValueError):
        bucket_id("a", num_buckets)
    with pytest.raises(ValueError):
        bucket_ids(pa.array(["a"]), num_buckets)


# --- file ids -----------------------------------------------------------------------------

def test_bucket_file_id_replaces_uuid_prefix() -> None:
    uid = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
    assert bucket_file_id(5, uid) == "00000005-5f60-4a7b-8c9d-0e1f2a3b4c5d-0"
    assert bucket_file_id(12345678, uid.upper()).startswith("12345678-5f60-4a7b")
    assert bucket_from_file_id(bucket_file_id(42)) == 42
    assert "_" not in bucket_file_id(0)


def test_bucket_file_id_nbcc_fixed_form() -> None:
    assert bucket_file_id_nbcc(3) == "00000003-0000-0000-0000-000000000000-0"
    assert bucket_from_file_id(bucket_file_id_nbcc(3)) == 3


@pytest.mark.parametrize(
    ("bucket", "uid"), [(-1, None), (100_000_000, None), (1, "not-a-uuid")])
def test_bucket_file_id_bad_input_raises_value_error(bucket: int, uid: str | None) -> None:
    with pytest.raises(ValueError):
        bucket_file_id(bucket, uid)


@pytest.mark.parametrize(
    "file_id",
    ["1234567", "abcdefgh-1234", "+0000001-x", "\uff11" * 8 + "-x"],  # fullwidth digits
)
def test_bucket_from_file_id_bad_prefix_raises_value_error(file_id: str) -> None:
    with pytest.raises(ValueError):
        bucket_from_file_id(file_id)
