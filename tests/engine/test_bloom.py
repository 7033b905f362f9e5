"""Bloom filters: bit for bit against Java (sample footers) and a plain-Python reference."""

from __future__ import annotations

import base64
import random
import struct
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.format.bloom import (
    BloomFilter,
    BloomFilterTypeCode,
    bit_size,
    hadoop_murmur2,
    num_hashes,
)
from tests.conftest import SAMPLES

# --- plain-Python reference, written from the Java sources' definitions -------------------

def _i32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def _java_byte(b: int) -> int:
    return b - 256 if b > 127 else b


def ref_murmur(data: bytes, seed: int) -> int:
    """Hadoop MurmurHash.hash(data, length, seed), Java int arithmetic step by step."""
    m = 0x5BD1E995
    length = len(data)
    h = _i32(seed ^ length)
    for i in range(length >> 2):
        k = _java_byte(data[4 * i + 3])
        k = _i32(k << 8) | (data[4 * i + 2] & 0xFF)
        k = _i32(k << 8) | (data[4 * i + 1] & 0xFF)
        k = _i32(k << 8) | (data[4 * i + 0] & 0xFF)
        k = _i32(k * m)
        k ^= (k & 0xFFFFFFFF) >> 24
        k = _i32(k * m)
        h = _i32(h * m)
        h = _i32(h ^ k)
    left = length - ((length >> 2) << 2)
    if left:
        if left >= 3:
            h = _i32(h ^ (_java_byte(data[length - 3]) << 16))
        if left >= 2:
            h = _i32(h ^ (_java_byte(data[length - 2]) << 8))
        h = _i32(h ^ _java_byte(data[length - 1]))
        h = _i32(h * m)
    h = _i32(h ^ ((h & 0xFFFFFFFF) >> 13))
    h = _i32(h * m)
    h = _i32(h ^ ((h & 0xFFFFFFFF) >> 15))
    return h


def ref_positions(key: str, nb_hash: int, vector_size: int) -> list[int]:
    data = key.encode("utf-8")
    out, seed = [], 0
    for _ in range(nb_hash):
        seed = ref_murmur(data, seed)
        rem = abs(seed) % vector_size  # Java: abs(seed % n) == abs(seed) % n
        out.append(rem)
    return out


class RefDynamic:
    """InternalDynamicBloomFilter: add() and write(), transcribed."""

    def __init__(self, vector_size: int, nb_hash: int, nr: int, max_nr: int) -> None:
        self.vs, self.nb, self.nr, self.max_nr = vector_size, nb_hash, nr, max_nr
        self.cur = 0
        self.reached_max = False
        self.cur_index = 0
        self.matrix: list[set[int]] = [set()]

    def _active(self) -> set[int] | None:
        if self.reached_max:
            row = self.matrix[self.cur_index % len(self.matrix)]
            self.cur_index += 1
            return row
        if self.cur >= self.nr and len(self.matrix) * self.nr < self.max_nr:
            return None
        if self.cur >= self.nr and len(self.matrix) * self.nr >= self.max_nr:
            self.reached_max = True
            return self.matrix[0]
        return self.matrix[-1]

    def add(self, key: str) -> None:
        row = self._active()
        if row is None:
            self.matrix.append(set())
            row = self.matrix[-1]
            self.cur = 0
        row.update(ref_positions(key, self.nb, self.vs))
        self.cur += 1

    def write(self) -> bytes:
        header = struct.pack(">iibi", -1, self.nb, 1, self.vs)
        out = bytearray(header + struct.pack(">iii", self.nr, self.cur, len(self.matrix)))
        for bits in self.matrix:
            out += header
            vec = bytearray((self.vs + 7) // 8)
            for i in bits:
                vec[i // 8] |= 1 << (i % 8)
            out += vec
        return bytes(out)


def _random_keys(rng: random.Random, n: int) -> list[str]:
    alphabet = "abcXYZ019:,-_ éß€😀\uffff中"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 41))) for _ in range(n)]


# --- scalar hash ------------------------------------------------------------------------

def test_hadoop_murmur2_random_bytes_matches_reference() -> None:
    rng = random.Random(7)
    for length in range(0, 23):
        for _ in range(20):
            data = bytes(rng.randrange(256) for _ in range(length))
            seed = rng.randrange(-(2**31), 2**31)
            assert hadoop_murmur2(data, seed) == ref_murmur(data, seed)


def test_hadoop_murmur2_high_tail_bytes_sign_extended() -> None:
    # The tails differ only in how 0xE9 is extended; an unsigned port gets another hash.
    data = "é".encode()  # c3 a9: two tail bytes, both >= 0x80
    assert hadoop_murmur2(data, 0) == ref_murmur(data, 0)
    unsigned = _unsigned_tail_murmur(data, 0)
    assert hadoop_murmur2(data, 0) != unsigned


def _unsigned_tail_murmur(data: bytes, seed: int) -> int:
    m, h = 0x5BD1E995, (seed ^ len(data)) & 0xFFFFFFFF
    for i, b in enumerate(reversed(data[-(len(data) & 3):])):
        h ^= b << (8 * i)
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return _i32(h)


def test_sizing_defaults_match_java_values() -> None:
    assert bit_size(60000, 1e-9) == 2587966
    assert num_hashes(2587966, 60000) == 30


# --- vectorized adds against the reference ----------------------------------------------

def test_add_many_random_keys_sets_reference_bits() -> None:
    rng = random.Random(11)
    keys = _random_keys(rng, 300)
    bf = BloomFilter.create(num_entries=1000, fpp=0.01, dynamic=False)
    bf.add_many(keys)
    expected = np.zeros(bf.vector_size, dtype=bool)
    for key in keys:
        expected[ref_positions(key, bf.nb_hash, bf.vector_size)] = True
    raw = BloomFilter.deserialize(bf.serialize(), "SIMPLE").to_bytes()
    got = np.unpackbits(np.frombuffer(raw[13:], np.uint8), bitorder="little",
                        count=bf.vector_size).astype(bool)
    assert np.array_equal(got, expected)
    assert all(bf.might_contain(k) for k in keys)


def test_add_many_dynamic_growth_matches_java_bytes() -> None:
    rng = random.Random(3)
    keys = _random_keys(rng, 95)
    ref = RefDynamic(bit_size(7, 0.01), num_hashes(bit_size(7, 0.01), 7), 7, 20)
    for k in keys:
        ref.add(k)
    whole = BloomFilter.create(num_entries=7, fpp=0.01, max_entries=20)
    whole.add_many(pa.array(keys))
    pieces = BloomFilter.create(num_entries=7, fpp=0.01, max_entries=20)
    start = 0
    for size in (1, 5, 1, 13, 2, 40, 33):
        pieces.add_many(keys[start:start + size])
        start += size
    one_by_one = BloomFilter.create(num_entries=7, fpp=0.01, max_entries=20)
    for k in keys:
        one_by_one.add(k)
    expected = base64.b64encode(ref.write()).decode()
    assert whole.serialize() == expected
    assert pieces.serialize() == expected
    assert one_by_one.serialize() == expected
    # rows of 7 until 3 * 7 >= 20, then round robin; the count restarts at each new row
    assert whole.num_rows == 3 and whole.current_nb_record == 95 - 14


def test_add_many_key_sources_give_same_filter() -> None:
    keys = [f"key-{i}" for i in range(50)] + ["ü", "😀x"]
    results = set()
    sources: list[object] = [
        keys,
        pa.array(keys),
        pa.array(keys, pa.large_string()),
        pa.chunked_array([keys[:10], keys[10:]]),
        pa.array(["pad", *keys]).slice(1),
        pa.array(keys).dictionary_encode(),
    ]
    for source in sources:
        bf = BloomFilter.create(num_entries=100, fpp=0.001)
        bf.add_many(source)
        results.add(bf.serialize())
    assert len(results) == 1


def test_might_contain_many_agrees_with_might_contain() -> None:
    rng = random.Random(5)
    added = _random_keys(rng, 200)
    probes = added[:50] + _random_keys(random.Random(6), 150)
    bf = BloomFilter.create(num_entries=100, fpp=0.01, max_entries=150)
    bf.add_many(added)
    many = bf.might_contain_many(probes)
    assert many.tolist() == [bf.might_contain(k) for k in probes]
    assert many[:50].all()


def test_add_unpaired_surrogate_hashed_as_question_mark() -> None:
    # Java's getBytes(UTF_8) writes '?' for an unpaired surrogate.
    bf = BloomFilter.create(num_entries=10)
    bf.add("a\ud800b")
    assert bf.might_contain("a?b")


@pytest.mark.parametrize("bad", [[""], ["ok", None]])
def test_add_many_empty_or_null_key_raises_value_error(bad: list[str | None]) -> None:
    bf = BloomFilter.create(num_entries=10)
    before = bf.serialize()
    with pytest.raises(ValueError):
        bf.add_many(pa.array(bad, pa.string()))
    assert bf.serialize() == before


# --- serialization ------------------------------------------------------------------------

def test_serialize_layout_header_and_size() -> None:
    raw = base64.b64decode(BloomFilter.create().serialize())
    assert len(raw) == 38 + 323496
    assert struct.unpack(">iibi", raw[:13]) == (-1, 30, 1, 2587966)
    assert struct.unpack(">iii", raw[13:25]) == (60000, 0, 1)
    assert raw[25:38] == raw[:13]


@pytest.mark.parametrize("dynamic", [True, False])
def test_deserialize_round_trip_identical(dynamic: bool) -> None:
    bf = BloomFilter.create(num_entries=50, fpp=0.001, max_entries=120, dynamic=dynamic)
    bf.add_many([str(i) for i in range(130)])
    code = "DYNAMIC_V0" if dynamic else None
    back = BloomFilter.deserialize(bf.serialize(), code)
    assert back.serialize() == bf.serialize()
    assert back.type_code is (BloomFilterTypeCode.DYNAMIC_V0 if dynamic
                              else BloomFilterTypeCode.SIMPLE)
    assert all(back.might_contain(str(i)) for i in range(130))


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("not base64!", "DYNAMIC_V0"),
        (BloomFilter.create(num_entries=10).serialize()[:-8], "DYNAMIC_V0"),
        (BloomFilter.create(num_entries=10).serialize(), "DYNAMIC_V9"),
        (base64.b64encode(struct.pack(">iibi", 3, 1, 1, 8) + b"\0").decode(), None),
        (base64.b64encode(BloomFilter.create(10, dynamic=False).to_bytes() + b"x").decode(),
         "SIMPLE"),
    ],
    ids=["bad-base64", "truncated", "unknown-type", "old-jenkins-layout", "trailing-bytes"],
)
def test_deserialize_malformed_raises_value_error(text: str, code: str | None) -> None:
    with pytest.raises(ValueError):
        BloomFilter.deserialize(text, code)


def test_deserialize_then_add_follows_java_without_max_entries() -> None:
    # maxNr is not serialized: Java's deserialized filter has 0 and goes round robin.
    bf = BloomFilter.create(num_entries=3, fpp=0.01, max_entries=100)
    bf.add_many(["a", "b", "c"])
    back = BloomFilter.deserialize(bf.serialize(), "DYNAMIC_V0")
    back.add_many(["d", "e"])
    assert back.num_rows == 1 and back.current_nb_record == 5


# --- real Java-written footers -----------------------------------------------------------

@pytest.fixture(scope="module")
def sample_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Every Parquet base file of the sample tables that carries a bloom filter footer."""
    dest = tmp_path_factory.mktemp("bloom-samples")
    files = []
    for zip_path in sorted(SAMPLES.glob("*.zip")):
        with zipfile.ZipFile(zip_path) as zf:
            for member in zf.namelist():
                if member.endswith(".parquet") and not member.startswith("__MACOSX/"):
                    target = Path(zf.extract(member, dest / zip_path.stem))
                    if b"org.apache.hudi.bloomfilter" in (pq.read_metadata(target).metadata
                                                          or {}):
                        files.append(target)
    assert files, "no sample base file carries a bloom filter"
    return files


def _footer(path: Path) -> tuple[str, str | None, list[str]]:
    meta = pq.read_metadata(path).metadata or {}
    code = meta.get(b"hoodie_bloom_filter_type_code")
    keys = pq.read_table(path, columns=["_hoodie_record_key"]).column(0).to_pylist()
    return (meta[b"org.apache.hudi.bloomfilter"].decode(), code.decode() if code else None,
            keys)


def test_sample_footer_contains_every_key_and_no_unrelated_key(
        sample_files: list[Path]) -> None:
    rng = random.Random(1)
    unrelated = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(200)]
    unrelated += [f"id:{i},name:Nobody" for i in range(50)] + [str(i) for i in range(100, 400)]
    for path in sample_files:
        text, code, keys = _footer(path)
        bf = BloomFilter.deserialize(text, code)
        assert bf.type_code is BloomFilterTypeCode.DYNAMIC_V0
        assert bf.bit_count() == bf.nb_hash * len(set(keys)), path.name
        assert all(bf.might_contain(k) for k in keys), path.name
        assert not bf.might_contain_many([k for k in unrelated if k not in keys]).any()


def test_sample_footer_rebuilt_from_row_order_is_identical(sample_files: list[Path]) -> None:
    for path in sample_files:
        text, _, keys = _footer(path)
        bf = BloomFilter.create()  # Hudi defaults: 60000 entries, fpp 1e-9, max 100000
        bf.add_many(keys)
        assert bf.serialize() == text, path.name
