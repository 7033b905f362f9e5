"""Spark DDL schema strings to Arrow schemas, and Arrow types and schemas back to Spark's.

:func:`parse_ddl` reads schema strings such as ``"id STRING, ts BIGINT NOT NULL, tags
ARRAY<STRING>"`` (the schema form :class:`ingest.decode.JsonDecoder` takes);
:func:`sql_type_name` names Arrow types the Spark way, for error reasons. No Spark needed,
but for :func:`spark_schema` (the one Arrow → ``StructType`` conversion of ingest: the
outputs of ``mapInArrow`` and the schemas of the read source).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "parse_ddl",
    "spark_schema",
    "sql_type_name",
]


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark ``StructType`` of an Arrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|('(?:[^'\\]|\\.)*')"
                    r"|([<>(),:]))")
_SIMPLE: dict[str, pa.DataType] = {
    "STRING": pa.string(), "VARCHAR": pa.string(), "CHAR": pa.string(), "BIGINT": pa.int64(),
    "LONG": pa.int64(), "INT": pa.int32(), "INTEGER": pa.int32(), "SMALLINT": pa.int16(),
    "SHORT": pa.int16(), "TINYINT": pa.int8(), "BYTE": pa.int8(), "DOUBLE": pa.float64(),
    "FLOAT": pa.float32(), "REAL": pa.float32(), "BOOLEAN": pa.bool_(), "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"), "TIMESTAMP_LTZ": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_NTZ": pa.timestamp("us"), "BINARY": pa.binary(),
}


class _DdlParser:
    """Recursive-descent parser over the tokens of one DDL string."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, int]] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                if not text[pos:].strip():
                    break
                raise self.error(f"unexpected character {text[pos:].lstrip()[0]!r}", pos)
            self.tokens.append((match.group(match.lastindex or 0), match.start(match.lastindex
                                                                              or 0)))
            pos = match.end()
        self.i = 0

    def error(self, message: str, pos: int | None = None) -> ValueError:
        if pos is None:
            pos = self.tokens[self.i][1] if self.i < len(self.tokens) else len(self.text)
        return ValueError(f"bad schema DDL at char {pos}: {message} in {self.text!r}")

    def peek(self) -> str:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if not token or (expected is not None and token.upper() != expected):
            wanted = repr(expected) if expected else "more"
            raise self.error(f"expected {wanted}, got {token or 'end of text'!r}")
        self.i += 1
        return token

    def fields(self, closing: str) -> list[pa.Field]:
        out: list[pa.Field] = []
        while self.peek() != closing:
            if out:
                self.take(",")
            name = self.take()
            if name in "<>(),:":
                raise self.error(f"expected a field name, got {name!r}")
            name = name[1:-1].replace("``", "`") if name.startswith("`") else name
            if self.peek() == ":":
                self.take()
            arrow_type = self.type()
            nullable = True
            if self.peek().upper() == "NOT":
                self.take()
                self.take("NULL")
                nullable = False
            if self.peek().upper() == "COMMENT":
                self.take()
                if not self.take().startswith("'"):
                    raise self.error("COMMENT needs a quoted string")
            if name in {f.name for f in out}:
                raise self.error(f"duplicate field {name!r}")
            out.append(pa.field(name, arrow_type, nullable=nullable))
        return out

    def numbers(self, count: int) -> list[int]:
        self.take("(")
        found = [int(self.take())]
        while self.peek() == "," and len(found) < count:
            self.take()
            found.append(int(self.take()))
        self.take(")")
        return found

    def type(self) -> pa.DataType:
        pos = self.tokens[self.i][1] if self.i < len(self.tokens) else len(self.text)
        name = self.take().upper()
        if name in ("DECIMAL", "DEC", "NUMERIC"):
            precision, scale = [*self.numbers(2), 0][:2] if self.peek() == "(" else (10, 0)
            if not 0 < precision <= 38 or not 0 <= scale <= precision:
                raise self.error(f"bad DECIMAL({precision},{scale})", pos)
            return pa.decimal128(precision, scale)
        if name in ("ARRAY", "MAP", "STRUCT"):
            self.take("<")
            if name == "ARRAY":
                inner: pa.DataType = pa.list_(self.type())
            elif name == "MAP":
                key = self.type()
                self.take(",")
                inner = pa.map_(key, self.type())
            else:
                inner = pa.struct(self.fields(">"))
            self.take(">")
            return inner
        if name not in _SIMPLE:
            raise self.error(f"unknown type {name!r}", pos)
        if name in ("VARCHAR", "CHAR"):
            self.numbers(1)
        return _SIMPLE[name]


def parse_ddl(ddl: str) -> pa.Schema:
    """Arrow schema of a Spark DDL string (``"id STRING, ts BIGINT NOT NULL, tags ARRAY<STRING>"``
    or ``"STRUCT<...>"``). Types: STRING, VARCHAR(n), CHAR(n), BIGINT/LONG, INT/INTEGER,
    SMALLINT, TINYINT, DOUBLE, FLOAT/REAL, BOOLEAN, DATE, TIMESTAMP (UTC), TIMESTAMP_NTZ,
    DECIMAL(p,s), BINARY, ARRAY<T>, MAP<K,V>, STRUCT<name: T, ...>. Raises ValueError with the
    position of the problem."""
    parser = _DdlParser(ddl)
    if parser.peek().upper() == "STRUCT" and len(parser.tokens) > 1 and parser.tokens[1][0] == "<":
        parser.take()
        parser.take("<")
        fields = parser.fields(">")
        parser.take(">")
    else:
        fields = parser.fields("")
    if parser.peek():
        raise parser.error(f"unexpected {parser.peek()!r}")
    if not fields:
        raise ValueError("bad schema DDL: no fields")
    return pa.schema(fields)


def sql_type_name(arrow_type: pa.DataType) -> str:
    """Spark SQL name of an Arrow type, as used in error reasons (``BIGINT``, ``ARRAY<INT>``)."""
    for name in ("STRING", "BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT", "BOOLEAN",
                 "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "BINARY"):
        if _SIMPLE[name] == arrow_type:
            return name
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision},{arrow_type.scale})"
    if pa.types.is_map(arrow_type):
        return f"MAP<{sql_type_name(arrow_type.key_type)}, {sql_type_name(arrow_type.item_type)}>"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return f"ARRAY<{sql_type_name(arrow_type.value_type)}>"
    if pa.types.is_struct(arrow_type):
        return "STRUCT<" + ", ".join(f"{f.name}: {sql_type_name(f.type)}" for f in arrow_type) + ">"
    return str(arrow_type).upper()
