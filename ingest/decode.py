"""Decoders from Kafka ``value`` bytes to Arrow, with bad records carried as data.

``decoder.decode(values)`` never raises on bad records: it returns a :class:`DecodeResult` with
the good rows (decoded, in input order), the input index of each good row, and one short,
specific reason per bad row - for the dead-letter table. Only *data* errors make a bad record
(malformed JSON or Avro, invalid UTF-8, a value of the wrong type, a missing required field);
any other failure - a bug, a value the decoder cannot handle - raises :class:`DecoderError`
(with the input row it concerns when known), so that it fails the batch instead of sending
every record to the error table. A bad *schema* raises ``ValueError`` when the decoder is
built. Decoders are picklable (built on the driver, used in tasks).

* :class:`JsonDecoder` - one JSON object per value, schema as a Spark DDL string (see
  :func:`ingest.ddl.parse_ddl`), an Avro ``.avsc`` path or dict, or an Arrow schema. Fast path:
  ``pyarrow.json`` over all values at once; when that fails, failing chunks are narrowed down
  and their values screened one by one in Python (:func:`_locate`), so a value decodes the
  same whatever its neighbours, and rare bad values cost little. Extra fields are
  ignored, missing fields are null. TIMESTAMP/DATE take ISO-8601 strings, BINARY base64
  strings, DECIMAL numbers or strings that fit the scale. Schemas with MAP, or DATE/BINARY
  below the top level, decode record by record in Python (correct, slower).
* :class:`AvroDecoder` - Avro binary written with the given schema, or the Confluent wire
  format (magic byte 0, 4-byte big-endian schema id, Avro body) with a map of writer schemas;
  rows are read into the reader schema by field name (absent fields take the reader's default,
  else null). Decoding is column-at-a-time through :mod:`engine.format.avro_codec`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import functools
import io
import json
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from engine.errors import TerminalError
from engine.layout.incoming import MalformedAvroError, avro_schema_to_arrow, decode_records
from ingest.ddl import parse_ddl, sql_type_name

__all__ = [
    "AvroDecoder",
    "DecodeResult",
    "Decoder",
    "DecoderError",
    "JsonDecoder",
    "arrow_schema_from_text",
    "arrow_schema_to_text",
    "decoder_from_spec",
    # Defined in ingest.ddl; re-exported so ``from ingest.decode import parse_ddl`` still works.
    "parse_ddl",
    "sql_type_name",
]

_SMALL = 8  # below this many values a failing piece is diagnosed value by value
_CHUNK = 1024  # values per vectorized decode once a whole batch failed
_SCREEN = 64  # failing pieces this small are screened value by value


class DecoderError(TerminalError):
    """The decoder failed for a reason other than bad data (a bug, an unsupported value).

    ``rows`` are the input rows (of the ``decode`` call) it was decoding when it failed,
    when known; the caller names their Kafka coordinates (:mod:`ingest.prepare`)."""

    def __init__(self, message: str, rows: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.rows = tuple(rows)


def _failed(part: np.ndarray, exc: Exception) -> DecoderError:
    where = f"value {int(part[0])}" if len(part) == 1 else \
        f"values {int(part[0])}..{int(part[-1])}"
    return DecoderError(f"the decoder failed on {where} (not a data error): "
                        f"{type(exc).__name__}: {exc}", [int(i) for i in part])


DataErrors = tuple[type[Exception], ...]


@dataclass(frozen=True)
class DecodeResult:
    """Good rows of one ``decode`` call and the reasons for the bad ones."""

    table: pa.Table
    """Decoded good rows, in input order, with exactly the decoder's schema."""
    good_index: np.ndarray
    """Input row index (int64) of each row of :attr:`table`, ascending."""
    errors: list[tuple[int, str]] = field(default_factory=list)
    """(input row index, reason) for each bad row, ascending by index."""


class Decoder(Protocol):
    """What the sink needs from a decoder."""

    schema: pa.Schema

    def decode(self, values: pa.Array | pa.ChunkedArray) -> DecodeResult:
        """Decode binary ``values``; never raises on bad records."""
        ...


# --- decoders as plain data ---------------------------------------------------------------------


def arrow_schema_to_text(schema: pa.Schema) -> str:
    """An Arrow schema as text: its IPC serialization, base64 (plain data, no code)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def arrow_schema_from_text(text: str) -> pa.Schema:
    """The inverse of :func:`arrow_schema_to_text`; ``ValueError`` for anything else."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except (binascii.Error, TypeError, pa.ArrowException) as exc:
        raise ValueError(f"not a serialized Arrow schema ({type(exc).__name__})") from None


def decoder_from_spec(spec: Mapping[str, Any]) -> JsonDecoder | AvroDecoder:
    """A decoder from its plain-data form (``decoder.to_spec()``); ``ValueError`` naming
    what is wrong."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"decoder: expected an object, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind == "json":
        text = spec.get("arrow_schema")
        if not isinstance(text, str):
            raise ValueError("decoder.arrow_schema: expected a serialized Arrow schema")
        return JsonDecoder(arrow_schema_from_text(text))
    if kind == "avro":
        reader, confluent = spec.get("avro_schema"), spec.get("confluent", False)
        schema_map = spec.get("schema_map")
        if not isinstance(reader, dict):
            raise ValueError("decoder.avro_schema: expected an Avro record schema object")
        if not isinstance(confluent, bool):
            raise ValueError("decoder.confluent: expected true or false")
        if schema_map is not None and not isinstance(schema_map, dict):
            raise ValueError("decoder.schema_map: expected an object {schema id: schema}")
        try:
            ids = {int(k): v for k, v in (schema_map or {}).items()}
        except ValueError:
            raise ValueError("decoder.schema_map: schema ids must be integers") from None
        if any(not isinstance(v, dict) for v in ids.values()):
            raise ValueError("decoder.schema_map: expected Avro record schema objects")
        return AvroDecoder(reader, confluent=confluent, schema_map=ids or None)
    raise ValueError(f"decoder.kind: expected 'json' or 'avro', got {kind!r}")


# --- Avro schemas --------------------------------------------------------------------------------


def _load_avro(schema: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """An Avro schema dict from a dict, a JSON text or an ``.avsc`` path."""
    if isinstance(schema, Mapping):
        return dict(schema)
    text = str(schema)
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read Avro schema file {schema!s}: {exc}") from None
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"Avro schema {schema!s} is not JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"Avro schema {schema!s} is not a record schema")
    return loaded


def _arrow_of_avro(avro: Mapping[str, Any]) -> pa.Schema:
    import fastavro

    try:
        fastavro.parse_schema(dict(avro))
        return avro_schema_to_arrow(avro)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise ValueError(f"bad Avro schema: {exc}") from None


# --- shared helpers -----------------------------------------------------------------------------


def _as_binary(values: pa.Array | pa.ChunkedArray) -> pa.BinaryArray:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type != pa.binary():
        values = values.cast(pa.binary())
    return values


def _bounds(values: pa.BinaryArray) -> tuple[pa.Buffer, np.ndarray, np.ndarray]:
    """Data buffer and per-value start/end byte positions of a binary array."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)
    offsets = offsets[values.offset : values.offset + len(values) + 1].astype(np.int64)
    data = values.buffers()[2] or pa.py_buffer(b"")
    return data, offsets[:-1], offsets[1:]


def _bisect(
    index: np.ndarray,
    decode: Callable[[np.ndarray], pa.Table],
    diagnose: Callable[[int, Exception], str],
    pieces: list[tuple[np.ndarray, pa.Table]],
    errors: dict[int, str],
    data_errors: DataErrors,
) -> None:
    """Decode ``index`` at once; on a data error split it, down to single values, to find the
    bad ones. Any other exception raises :class:`DecoderError`."""
    stack = [index]
    while stack:
        part = stack.pop()
        try:
            pieces.append((part, decode(part)))
            continue
        except data_errors as exc:  # a bad value in this piece: narrow it down
            if len(part) == 1:
                errors[int(part[0])] = diagnose(int(part[0]), exc)
                continue
        except Exception as exc:
            raise _failed(part, exc) from exc
        if len(part) <= _SMALL:
            stack.extend(part[i : i + 1] for i in range(len(part) - 1, -1, -1))
        else:
            half = len(part) // 2
            stack.extend((part[half:], part[:half]))


def _locate(
    index: np.ndarray,
    decode: Callable[[np.ndarray], pa.Table],
    screen: Callable[[int], str | None],
    diagnose: Callable[[int, Exception], str],
    pieces: list[tuple[np.ndarray, pa.Table]],
    errors: dict[int, str],
    data_errors: DataErrors,
) -> None:
    """Decode ``index`` vectorized, locating the bad values when that fails with a data error
    (one of ``data_errors``; any other exception raises :class:`DecoderError`).

    All at once first; on failure in chunks of 1024, failing chunks halved down to 64 values;
    each value of a failing small piece is screened alone (``screen`` gives the reason it is bad,
    or None) and the rest decoded again, bisected to single values if even that fails. With rare
    bad values this costs about three vectorized passes. ``screen`` must never reject what
    ``decode`` accepts, so a value's fate does not depend on its neighbours.
    """
    stack = [index] if len(index) <= _CHUNK else list(
        reversed(np.array_split(index, -(-len(index) // _CHUNK))))
    if len(stack) > 1:
        try:
            pieces.append((index, decode(index)))
            return
        except data_errors:  # narrowed down below
            pass
        except Exception as exc:
            raise _failed(index, exc) from exc
    while stack:
        part = stack.pop()
        try:
            pieces.append((part, decode(part)))
            continue
        except data_errors:  # narrowed down below
            pass
        except Exception as exc:
            raise _failed(part, exc) from exc
        if len(part) > _SCREEN:
            half = len(part) // 2
            stack.extend((part[half:], part[:half]))
            continue
        reasons = [screen(int(i)) for i in part]
        errors.update((int(i), r) for i, r in zip(part, reasons, strict=True) if r is not None)
        rest = part[np.array([r is None for r in reasons], dtype=bool)]
        if len(rest):
            _bisect(rest, decode, diagnose, pieces, errors, data_errors)


def _assemble(
    schema: pa.Schema, pieces: list[tuple[np.ndarray, pa.Table]], errors: dict[int, str]
) -> DecodeResult:
    good = [(idx, table) for idx, table in pieces if len(idx)]
    if not good:
        return DecodeResult(schema.empty_table(), np.empty(0, np.int64), sorted(errors.items()))
    index = np.concatenate([idx for idx, _ in good]).astype(np.int64)
    table = pa.concat_tables([t.cast(schema) for _, t in good])
    order = np.argsort(index, kind="stable")
    if not np.array_equal(order, np.arange(len(order))):
        table, index = table.take(pa.array(order)), index[order]
    return DecodeResult(table.combine_chunks(), index, sorted(errors.items()))


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


class _Malformed(TerminalError, ValueError):
    """A JSON piece that decoded to something other than its records (a data error)."""


class _BadField(TerminalError):
    """A JSON value that does not fit its field; ``path`` is filled in on the way up."""

    def __init__(self, expected: pa.DataType, value: Any) -> None:
        super().__init__()
        self.path, self.expected, self.value = "", expected, value

    def under(self, step: str) -> _BadField:
        self.path = step + ("." if self.path[:1] not in ("", "[") else "") + self.path
        return self

    def __str__(self) -> str:
        if self.value is None:
            return f"field '{self.path}': missing or null"
        return f"field '{self.path}': expected {sql_type_name(self.expected)}, " \
            f"got {_show(self.value)}"


# --- JSON ---------------------------------------------------------------------------------------

_DECIMAL_CONTEXT = decimal.Context(prec=80)
_JSON_KINDS = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
               float: "number", type(None): "null"}
Check = Callable[[Any], Any]


def _compile(arrow_type: pa.DataType, nullable: bool = True) -> Check:
    """A function turning a parsed JSON value into the Python value of ``arrow_type``.

    It raises :class:`_BadField` for values pyarrow.json would reject too; it is never
    stricter than pyarrow.json (see :func:`_locate`), and is built once per schema.
    """
    convert = _compile_value(arrow_type)

    def check(value: Any) -> Any:
        if value is None:
            if nullable:
                return None
            raise _BadField(arrow_type, None)
        return convert(value)

    return check


def _compile_value(t: pa.DataType) -> Check:
    def bad(value: Any) -> Any:
        raise _BadField(t, value)

    def simple(test: Callable[[Any], bool], make: Callable[[Any], Any] = lambda v: v) -> Check:
        return lambda v: make(v) if test(v) else bad(v)

    def parsed(parse: Callable[[str], Any], errors: tuple[type[Exception], ...]) -> Check:
        def convert(value: Any) -> Any:
            if type(value) is str:
                try:
                    return parse(value)
                except errors:
                    pass
            return bad(value)
        return convert

    if pa.types.is_string(t):
        return simple(lambda v: type(v) is str)
    if pa.types.is_integer(t):
        low, high = -(1 << (t.bit_width - 1)), 1 << (t.bit_width - 1)
        return simple(lambda v: type(v) is int and low <= v < high)
    if pa.types.is_floating(t):
        return simple(lambda v: type(v) is float or type(v) is int, float)
    if pa.types.is_boolean(t):
        return simple(lambda v: type(v) is bool)
    if pa.types.is_date(t):
        return parsed(dt.date.fromisoformat, (ValueError,))
    if pa.types.is_binary(t):
        return parsed(lambda v: base64.b64decode(v, validate=True), (binascii.Error, ValueError))
    if pa.types.is_timestamp(t):
        zone = dt.timezone.utc if t.tz else None

        def stamp(text: str) -> dt.datetime:
            value = dt.datetime.fromisoformat(text)
            if value.tzinfo is not None:
                value = value.astimezone(dt.timezone.utc)
            return value.replace(tzinfo=zone)
        return parsed(stamp, (ValueError,))
    if pa.types.is_decimal(t):
        unit = decimal.Decimal(1).scaleb(-t.scale)

        def number(value: Any) -> Any:
            if type(value) in (int, float, str):
                try:
                    exact = decimal.Decimal(str(value))
                    fitted = exact.quantize(unit, context=_DECIMAL_CONTEXT)
                    if fitted == exact and len(fitted.as_tuple().digits) <= t.precision:
                        return fitted
                except decimal.InvalidOperation:
                    pass
            return bad(value)
        return number
    if pa.types.is_map(t):
        item = _compile(t.item_type)

        def mapping(value: Any) -> Any:
            if type(value) is not dict:
                return bad(value)
            out = []
            for key, entry in value.items():
                try:
                    out.append((key, item(entry)))
                except _BadField as err:
                    raise err.under(str(key)) from None
            return out
        return mapping
    if pa.types.is_list(t):
        element = _compile(t.value_type)

        def listing(value: Any) -> Any:
            if type(value) is not list:
                return bad(value)
            try:
                return [element(entry) for entry in value]
            except _BadField as err:  # find which element, only on the error path
                index = next(i for i, e in enumerate(value) if _fails(element, e))
                raise err.under(f"[{index}]") from None
        return listing
    if pa.types.is_struct(t):
        fields = [(f.name, _compile(f.type, f.nullable)) for f in t]

        def record(value: Any) -> Any:
            if type(value) is not dict:
                return bad(value)
            out = {}
            for name, check in fields:
                try:
                    out[name] = check(value.get(name))
                except _BadField as err:
                    raise err.under(name) from None
            return out
        return record
    return bad


def _fails(check: Check, value: Any) -> bool:
    try:
        check(value)
    except _BadField:
        return True
    return False


_JSON_DATA_ERRORS: DataErrors = (pa.ArrowInvalid, _Malformed, _BadField, binascii.Error,
                                 json.JSONDecodeError, UnicodeDecodeError)
"""What a JSON piece with a bad value raises: pyarrow.json's parse and conversion errors
(malformed JSON, invalid UTF-8, a value of the wrong type), base64 and null checks."""


def _check_json_type(arrow_type: pa.DataType, top: bool) -> bool:
    """Raise ValueError for types JSON cannot carry; True if the type needs the Python path."""
    if pa.types.is_map(arrow_type):
        if not pa.types.is_string(arrow_type.key_type):
            raise ValueError(f"JSON objects have STRING keys, not {sql_type_name(arrow_type)}")
        _check_json_type(arrow_type.item_type, top=False)
        return True
    if pa.types.is_list(arrow_type):
        return _check_json_type(arrow_type.value_type, top=False)
    if pa.types.is_struct(arrow_type):
        return any([_check_json_type(f.type, top=False) for f in arrow_type])
    if pa.types.is_date32(arrow_type) or arrow_type == pa.binary():
        return not top
    if not (pa.types.is_string(arrow_type) or pa.types.is_integer(arrow_type)
            or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)
            or pa.types.is_timestamp(arrow_type) or pa.types.is_decimal128(arrow_type)):
        raise ValueError(f"type {arrow_type} is not supported for JSON")
    return False


class JsonDecoder:
    """One JSON object per value into ``schema`` (DDL string, ``.avsc`` path/dict, Arrow)."""

    def __init__(self, schema: str | os.PathLike[str] | Mapping[str, Any] | pa.Schema) -> None:
        if isinstance(schema, pa.Schema):
            arrow = schema
        elif isinstance(schema, Mapping | os.PathLike) or str(schema).strip().endswith(
                ".avsc") or str(schema).lstrip().startswith("{"):
            arrow = _arrow_of_avro(_load_avro(schema))
        else:
            arrow = parse_ddl(str(schema))
        self._python = any([_check_json_type(f.type, top=True) for f in arrow])
        self.schema = arrow
        self._row_type = pa.struct(list(arrow))
        self._checker: Check | None = None
        # pyarrow.json cannot read DATE or base64 BINARY: read strings, convert afterwards.
        self._parse_schema = pa.schema([
            pa.field(f.name, pa.string() if f.type in (pa.date32(), pa.binary()) else f.type)
            for f in arrow])

    def __repr__(self) -> str:
        return f"JsonDecoder({sql_type_name(self._row_type)})"

    def to_spec(self) -> dict[str, Any]:
        """This decoder as plain data (JSON-able), for :func:`decoder_from_spec`."""
        return {"kind": "json", "arrow_schema": arrow_schema_to_text(self.schema)}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_checker": None}  # closures: rebuilt where unpickled

    def _check(self, value: Any) -> Any:
        if self._checker is None:
            self._checker = _compile(self._row_type, nullable=False)
        return self._checker(value)

    def decode(self, values: pa.Array | pa.ChunkedArray) -> DecodeResult:
        """Decode binary JSON values; see :class:`DecodeResult`."""
        values = _as_binary(values)
        data, starts, ends = _bounds(values)
        raw = np.frombuffer(data, dtype=np.uint8)
        nulls = values.is_null().to_numpy(zero_copy_only=False)
        nonempty = ends > starts
        errors: dict[int, str] = {int(i): "null value" for i in np.flatnonzero(nulls)}
        framed = ~nulls & nonempty
        framed[framed] = (raw[starts[framed]] == ord("{")) & (raw[ends[framed] - 1] == ord("}"))
        candidates = [np.flatnonzero(framed)]
        # Values not framed as {...} are rare: padded with white space, or bad. Only values that
        # start with "{" reach pyarrow.json (a bare "null" line can crash pyarrow 26).
        for i in np.flatnonzero(~nulls & ~framed):
            text = bytes(raw[starts[i]:ends[i]]).strip(b" \t\r\n")
            if not text:
                errors[int(i)] = "empty value"
            elif text[:1] == b"{" and text[-1:] == b"}":
                candidates.append(np.array([i]))
            else:
                errors[int(i)] = self._diagnose(values, int(i), None)
        index = np.sort(np.concatenate(candidates)).astype(np.int64)
        pieces: list[tuple[np.ndarray, pa.Table]] = []
        if self._python:
            self._decode_python(values, index, pieces, errors)
        elif len(index):
            # Values spanning lines need pyarrow's slower multi-line mode: parse them apart.
            multiline = np.zeros(len(values), dtype=bool)
            segment = raw[int(starts[0]):int(ends[-1])]
            breaks = np.flatnonzero((segment == 10) | (segment == 13)) + int(starts[0])
            multiline[np.searchsorted(ends, breaks, side="right")] = True
            for flag in (False, True):
                part = index[multiline[index] == flag]
                if len(part):
                    _locate(part, functools.partial(self._parse, values, flag),
                            functools.partial(self._screen, values),
                            functools.partial(self._diagnose, values), pieces, errors,
                            _JSON_DATA_ERRORS)
        return _assemble(self.schema, pieces, errors)

    def _parse(self, values: pa.BinaryArray, multiline: bool, index: np.ndarray) -> pa.Table:
        part = values if len(index) == len(values) else values.take(pa.array(index))
        part.cast(pa.string())  # raises on invalid UTF-8 anywhere, as _screen does
        joined = pc.binary_join_element_wise(part, pa.scalar(b""), pa.scalar(b"\n"))
        data, starts, ends = _bounds(joined)
        size, longest = int(ends[-1] - starts[0]), int((ends - starts).max())
        # Small pieces (while locating bad values) parse faster in one small block, one thread.
        block = max(min(size + 1, 1 << 20), 2 * longest + 2)
        table = pa_json.read_json(
            pa.BufferReader(data.slice(int(starts[0]), size)),
            read_options=pa_json.ReadOptions(block_size=block, use_threads=size > block),
            parse_options=pa_json.ParseOptions(explicit_schema=self._parse_schema,
                                               newlines_in_values=multiline,
                                               unexpected_field_behavior="ignore"))
        if table.num_rows != len(index):
            raise _Malformed(f"{table.num_rows} JSON values in {len(index)} records")
        table.validate(full=True)  # pyarrow.json passes invalid UTF-8 in strings through
        for position, fld in enumerate(self.schema):
            column = table.column(position)
            if fld.type == pa.date32():
                column = pc.cast(column, pa.date32())
            elif fld.type == pa.binary():
                column = pa.array([None if v is None else base64.b64decode(v, validate=True)
                                   for v in column.to_pylist()], pa.binary())
            if not fld.nullable and column.null_count:
                raise _Malformed(f"field '{fld.name}' is null")
            table = table.set_column(position, fld.name, column)
        return table

    def _decode_python(self, values: pa.BinaryArray, index: np.ndarray,
                       pieces: list[tuple[np.ndarray, pa.Table]], errors: dict[int, str]) -> None:
        rows, good = [], []
        for i in index.tolist():
            try:
                rows.append(self._check(json.loads(values[i].as_py())))
                good.append(i)
            except (json.JSONDecodeError, UnicodeDecodeError, _BadField) as exc:
                errors[i] = self._diagnose(values, i, exc)
            except Exception as exc:
                raise _failed(np.array([i]), exc) from exc
        loose = pa.schema([f.with_nullable(True) for f in self.schema])
        pieces.append((np.array(good, np.int64), pa.Table.from_pylist(rows, schema=loose)))

    def _screen(self, values: pa.BinaryArray, i: int) -> str | None:
        """Why value ``i`` is bad, checked in Python; None if it looks good."""
        raw = values[i].as_py()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"invalid UTF-8 at byte {err.start}"
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as err:
            return f"invalid JSON at char {err.pos}: {err.msg}"
        if not isinstance(parsed, dict):
            return f"expected a JSON object, got {_JSON_KINDS.get(type(parsed), 'value')}"
        try:
            self._check(parsed)
        except _BadField as err:
            return str(err)
        return None

    def _diagnose(self, values: pa.BinaryArray, i: int, exc: Exception | None) -> str:
        return self._screen(values, i) or f"rejected by the JSON parser: {_short(exc)}"


def _short(exc: Exception | None) -> str:
    text = "" if exc is None else str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


# --- Avro ---------------------------------------------------------------------------------------


_AVRO_DATA_ERRORS: DataErrors = (MalformedAvroError, pa.ArrowInvalid)
"""What an Avro piece with a bad record raises: bytes that are not a record of the writer
schema, or a value the reader schema's type cannot hold."""
_FASTAVRO_DATA_ERRORS: DataErrors = (ValueError, IndexError, KeyError, OverflowError,
                                     struct.error, UnicodeDecodeError)
"""What fastavro raises reading bytes that are not a record of its schema (a union index or
enum symbol out of range, a bad length, invalid UTF-8)."""


class AvroDecoder:
    """Avro binary values into the Arrow form of ``schema`` (the reader schema).

    ``confluent=False``: every value is one Avro record written with ``schema``.
    ``confluent=True``: values carry the Confluent framing; ``schema_map`` maps each schema id
    to its writer schema (``.avsc`` path, JSON text or dict). An unknown id is a bad record.
    """

    def __init__(
        self,
        schema: str | os.PathLike[str] | Mapping[str, Any],
        confluent: bool = False,
        schema_map: Mapping[int, str | os.PathLike[str] | Mapping[str, Any]] | None = None,
    ) -> None:
        import fastavro

        reader = _load_avro(schema)
        self.schema = _arrow_of_avro(reader)
        self._reader = reader
        self._schema_map = ({int(k): _load_avro(v) for k, v in schema_map.items()}
                            if schema_map else None)
        self.confluent = confluent
        if confluent and not schema_map:
            raise ValueError("confluent=True needs schema_map: {schema id: writer schema}")
        if schema_map and not confluent:
            raise ValueError("schema_map is only used with confluent=True")
        writers = dict(self._schema_map or {}) or {-1: reader}
        self._writers: dict[int, Any] = {}  # fastavro's parsed schemas
        self._defaults: dict[int, dict[str, Any]] = {}
        for schema_id, writer in writers.items():
            _arrow_of_avro(writer)
            self._writers[schema_id] = fastavro.parse_schema(writer)
            written = {f["name"] for f in writer.get("fields", [])}
            self._defaults[schema_id] = {
                f["name"]: f["default"] for f in reader.get("fields", [])
                if f["name"] not in written and f.get("default") is not None}

    def __repr__(self) -> str:
        ids = sorted(self._writers) if self.confluent else []
        return f"AvroDecoder({sql_type_name(pa.struct(list(self.schema)))}, schema ids {ids})"

    def to_spec(self) -> dict[str, Any]:
        """This decoder as plain data (JSON-able), for :func:`decoder_from_spec`."""
        spec: dict[str, Any] = {"kind": "avro", "avro_schema": self._reader,
                                "confluent": self.confluent}
        if self._schema_map is not None:
            spec["schema_map"] = {str(k): v for k, v in self._schema_map.items()}
        return spec

    def decode(self, values: pa.Array | pa.ChunkedArray) -> DecodeResult:
        """Decode binary Avro values; see :class:`DecodeResult`."""
        values = _as_binary(values)
        data, starts, ends = _bounds(values)
        nulls = values.is_null().to_numpy(zero_copy_only=False)
        errors: dict[int, str] = {int(i): "null value" for i in np.flatnonzero(nulls)}
        rows = np.flatnonzero(~nulls)
        groups: dict[int, np.ndarray] = {-1: rows}
        if self.confluent:
            raw = np.frombuffer(data, dtype=np.uint8)
            short = rows[ends[rows] - starts[rows] < 5]
            for i in short:
                size = ends[i] - starts[i]
                errors[int(i)] = f"too short for the Confluent framing ({size} bytes)"
            rows = rows[ends[rows] - starts[rows] >= 5]
            magic = raw[starts[rows]]
            for i in rows[magic != 0]:
                errors[int(i)] = f"bad magic byte {raw[starts[i]]} (not the Confluent framing)"
            rows = rows[magic == 0]
            ids = np.zeros(len(rows), dtype=np.int64)
            for k in range(1, 5):
                ids = (ids << 8) | raw[starts[rows] + k]
            ids = ids.astype(np.int32).astype(np.int64)  # ids are signed 32-bit ints
            starts = starts + 5
            groups = {int(schema_id): rows[ids == schema_id] for schema_id in np.unique(ids)}
            for schema_id in [s for s in groups if s not in self._writers]:
                for i in groups.pop(schema_id):
                    errors[int(i)] = f"unknown schema id {schema_id}"
        pieces: list[tuple[np.ndarray, pa.Table]] = []
        for schema_id, index in groups.items():
            if len(index):
                _locate(index, functools.partial(self._decode, schema_id, data, starts, ends),
                        functools.partial(self._screen, schema_id, data, starts, ends),
                        functools.partial(self._diagnose, schema_id, data, starts, ends),
                        pieces, errors, _AVRO_DATA_ERRORS)
        return _assemble(self.schema, pieces, errors)

    def _decode(self, schema_id: int, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray,
                index: np.ndarray) -> pa.Table:
        table = decode_records(data, starts[index], ends[index], self._writers[schema_id],
                               self.schema)
        for name, default in self._defaults[schema_id].items():
            position = self.schema.get_field_index(name)
            try:
                filled = pa.array([default] * len(table), self.schema.field(name).type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                continue  # a default Arrow cannot hold as is (e.g. a record): stays null
            table = table.set_column(position, self.schema.field(name), filled)
        return table

    def _screen(self, schema_id: int, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray,
                i: int) -> str | None:
        """Why value ``i`` is bad, checked with fastavro; None if it looks good."""
        import fastavro

        stream = io.BytesIO(data.slice(int(starts[i]), int(ends[i] - starts[i])).to_pybytes())
        try:
            fastavro.schemaless_reader(stream, self._writers[schema_id], None)
        except (EOFError, StopIteration):
            return "invalid Avro: the record ends early"
        except _FASTAVRO_DATA_ERRORS as err:  # fastavro's errors on bytes of another shape
            return f"invalid Avro: {_short(err)}"
        left = int(ends[i] - starts[i]) - stream.tell()
        return f"invalid Avro: {left} bytes left after the record (wrong schema?)" if left else None

    def _diagnose(self, schema_id: int, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray,
                  i: int, exc: Exception) -> str:
        return (self._screen(schema_id, data, starts, ends, i)
                or f"invalid Avro: {_short(exc)}")
