"""The metadata table's record schema, ``org.apache.hudi.avro.model.HoodieMetadataRecord``.

``engine/format/avro/HoodieMetadataRecord.avsc`` holds, byte for byte, the 7969-byte JSON that
Spark (Hudi 1.0) writes to every MDT HFile's file info ``schema`` and every MDT log block's
``SCHEMA`` header: the five ``_hoodie_*`` meta fields (``["null","string"]``) followed by the
record's own fields, compact, with ``avro.java.string`` annotations. The schema *without* meta
fields (MDT commit metadata ``extraMetadata.schema``) is the same JSON minus those five fields.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import fastavro

__all__ = [
    "META_FIELDS",
    "metadata_record_schema",
    "metadata_schema_json",
    "metadata_schema_without_meta_fields_json",
    "parsed_metadata_schema",
    "parsed_writer_schema",
]

META_FIELDS = (
    "_hoodie_commit_time",
    "_hoodie_commit_seqno",
    "_hoodie_record_key",
    "_hoodie_partition_path",
    "_hoodie_file_name",
)


@functools.cache
def metadata_schema_json(value_types: bool = False) -> str:
    """The MDT record schema with meta fields, verbatim as the files carry it: Hudi 1.0's
    (7969 chars), or with ``value_types`` Hudi 1.1's (8910 chars, table version 9)."""
    name = "HoodieMetadataRecord-1.1.avsc" if value_types else "HoodieMetadataRecord.avsc"
    return resources.files("engine.format").joinpath("avro", name).read_text(encoding="utf-8")


def metadata_record_schema(value_types: bool = False) -> dict[str, Any]:
    """The schema with meta fields as a JSON dict (a fresh copy; mutate freely)."""
    return dict(json.loads(metadata_schema_json(value_types)))


@functools.cache
def metadata_schema_without_meta_fields_json(value_types: bool = False) -> str:
    """The schema without the five meta fields, compact JSON (MDT commit ``schema``)."""
    schema = metadata_record_schema(value_types)
    schema["fields"] = [f for f in schema["fields"] if f["name"] not in META_FIELDS]
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def parsed_metadata_schema(value_types: bool = False) -> Any:
    """The fastavro-parsed schema with meta fields (shared, do not mutate)."""
    return parsed_writer_schema(metadata_schema_json(value_types))


@functools.lru_cache(maxsize=16)
def parsed_writer_schema(text: str) -> Any:
    """The fastavro-parsed form of the record schema ``text`` a metadata file carries (its
    HFile file info ``schema`` or log block ``SCHEMA`` header), parsed once per distinct
    text (shared, do not mutate)."""
    return fastavro.parse_schema(json.loads(text))
