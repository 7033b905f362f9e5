"""JSON as Hudi's Java code writes its ``.hoodie`` files: Jackson's default pretty printer
(``ObjectMapper.writerWithDefaultPrettyPrinter()``), byte for byte.

The files: the index definitions (``.hoodie/.index_defs/index.json``), the consistent-hashing
metadata (``.hoodie/.bucket_index/consistent_hashing_metadata/<partition>/*.hashing_meta``),
the LSM timeline's manifests (``.hoodie/timeline/history/manifest_<N>``) and version 6's
commit metadata (``HoodieCommitMetadata.toJsonString``).

Jackson's ``DefaultPrettyPrinter``: an object puts each field on its own line, indented two
spaces per level of *object* nesting, as ``"name" : value``, fields separated by ``,`` and
the closing brace on a line of its own at the object's indent; an array stays on one line,
``[ a, b ]`` (its ``FixedSpaceIndenter`` is inline and adds no nesting level, so an object in
an array is indented by the objects around it only); an empty object or array is ``{ }`` or
``[ ]``; nothing follows the last brace. Strings escape ``"``, ``\\`` and control characters
(``\\b \\t \\n \\f \\r``, others ``\\u00XX``) and keep every other character as is (the bytes
are UTF-8), as Python's ``json.dumps(..., ensure_ascii=False)`` does. Numbers are integers in
these files (Python and Java print them alike).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["pretty_json"]


def pretty_json(value: Any) -> str:
    """``value`` (mappings in their key order, lists or tuples, strings, integers, booleans,
    None) as Jackson's default pretty printer writes it."""
    return _write(value, 0)


def _write(value: Any, depth: int) -> str:
    if isinstance(value, Mapping):
        if not value:
            return "{ }"
        pad = "  " * (depth + 1)
        fields = ",\n".join(f"{pad}{json.dumps(str(k), ensure_ascii=False)} : "
                            f"{_write(v, depth + 1)}" for k, v in value.items())
        return "{\n" + fields + "\n" + "  " * depth + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[ ]"
        return "[ " + ", ".join(_write(v, depth) for v in value) + " ]"
    return json.dumps(value, ensure_ascii=False)
