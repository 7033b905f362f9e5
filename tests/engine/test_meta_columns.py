"""The meta columns built into Arrow buffers equal the strings Hudi's rule names."""

import pyarrow as pa
import pytest

from engine.write.meta_columns import constant_strings, numbered_strings


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 99, 100, 101, 1000, 10_001, 1_000_003])
def test_numbered_strings_are_prefix_and_decimal_number(n: int) -> None:
    prefix = "20261128131500000_7_"
    got = numbered_strings(prefix, n)
    got.validate(full=True)
    assert got.to_pylist() == [f"{prefix}{i}" for i in range(n)]
    assert numbered_strings("", n).to_pylist() == [str(i) for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 3, 2500])
def test_constant_strings_repeat_the_value(n: int) -> None:
    for value in ("20261128131500000", "", "päth/ü"):
        got = constant_strings(value, n)
        got.validate(full=True)
        assert got.type == pa.string()
        assert got.to_pylist() == [value] * n
