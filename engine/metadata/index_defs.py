"""The data table's index definitions, ``.hoodie/.index_defs/index.json`` (Hudi's
``HoodieIndexMetadata``, its path in ``hoodie.table.index.defs.path``): one definition per
MDT index partition that has one, kept as Java keeps it (``docs/table-version-9.md`` §4).

Java 1.0 (table version 8) defines ``column_stats`` (its ``sourceFields``: the indexed
columns) and every secondary or expression index, without a ``version``; Java 1.1 (version
9) adds ``version`` to each (``column_stats`` ``V2``, secondary indexes ``V2``) and defines the
record index (``V1``, ``isPartitioned=false``). ``files``, ``partition_stats`` and
``bloom_filters`` have none (partition stats take column stats' version). A 1.1 writer
reads the version of a partition from here (``existingIndexVersionOrDefault``) and, for a
partition without a definition, takes its default for the table version.

The one writer of the file: :func:`declare` when an index partition is built,
:func:`refresh` after each commit (column stats' ``sourceFields`` follow the columns it
indexed, as Java's ``updateColsToIndex``), :func:`remove` when one is dropped (Java's
``deleteIndexDefinition``: the file stays, with what is left), :func:`align_versions` when
a Java-upgraded table's MDT is first compacted into version 9's layout (its column stats
are V2 from then on). Called under the table
lock. The JSON is Jackson's default pretty printer's, byte for byte.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.config import P_CHECKSUM
from engine.format.jackson import pretty_json
from engine.layout.properties import dumps as dump_properties
from engine.metadata.table import PROPERTIES, read_data_properties
from engine.storage import Storage
from engine.timeline.active import HOODIE
from engine.timeline.version import TableVersion

_log = logging.getLogger(__name__)

P_INDEX_DEFS_PATH = "hoodie.table.index.defs.path"
DEFAULT_PATH = f"{HOODIE}/.index_defs/index.json"

COLUMN_STATS = "column_stats"
PARTITION_STATS = "partition_stats"
RECORD_INDEX = "record_index"

Definition = dict[str, Any]


def column_stats_definition(version: TableVersion, columns: Sequence[str]) -> Definition:
    """The ``column_stats`` definition of a table of ``version`` whose indexed columns are
    ``columns`` (Java: ``createOrUpdateColumnStatsIndexDefinition``)."""
    found: Definition = {"indexName": COLUMN_STATS, "indexType": COLUMN_STATS,
                         "indexFunction": COLUMN_STATS, "sourceFields": list(columns),
                         "indexOptions": {}}
    if version.versioned_index_definitions:
        found["version"] = "V2"
    return found


def record_index_definition(version: TableVersion) -> Definition | None:
    """The ``record_index`` definition (version 9: global, ``V1``); None on version 8,
    where Java 1.0 writes none."""
    if not version.versioned_index_definitions:
        return None
    return {"indexName": RECORD_INDEX, "indexType": RECORD_INDEX, "indexFunction": "",
            "sourceFields": [], "indexOptions": {"isPartitioned": "false"}, "version": "V1"}


# -- the file -----------------------------------------------------------------------------------

def _path(props: Mapping[str, str]) -> str:
    return props.get(P_INDEX_DEFS_PATH) or DEFAULT_PATH


def read(storage: Storage) -> dict[str, Definition]:
    """The definitions by index name, in the file's order (empty without a file);
    :class:`ValueError` if the file is not Hudi's JSON."""
    try:
        path = _path(read_data_properties(storage))
        text = storage.read(path).decode("utf-8")
    except FileNotFoundError:
        return {}
    if not text.strip():
        return {}
    found = json.loads(text)
    if not isinstance(found, dict) or not isinstance(found.get("indexDefinitions") or {}, dict):
        raise ValueError("not a HoodieIndexMetadata document")
    return dict(found.get("indexDefinitions") or {})


def _editable(storage: Storage) -> dict[str, Definition] | None:
    """:func:`read` for a change; None (logged) when the file cannot be read as Hudi's,
    which is then left as it is: a commit never fails on it, nor overwrites what another
    writer put there."""
    try:
        return read(storage)
    except (ValueError, UnicodeDecodeError) as exc:
        _log.warning("%s: %s left unchanged (%s)", storage.base_path, DEFAULT_PATH, exc)
        return None


def dumps(definitions: Mapping[str, Definition]) -> str:
    """``{"indexDefinitions": definitions}`` as Jackson's ``writerWithDefaultPrettyPrinter``
    writes it (:func:`engine.format.jackson.pretty_json`)."""
    return pretty_json({"indexDefinitions": dict(definitions)})


def _write(storage: Storage, definitions: Mapping[str, Definition]) -> None:
    """Write the file, then record its path in ``hoodie.properties`` if missing (Java's
    ``buildIndexDefinition`` order)."""
    props = read_data_properties(storage)
    storage.write_replace(_path(props), dumps(definitions).encode("utf-8"))
    if P_INDEX_DEFS_PATH not in props:
        props[P_INDEX_DEFS_PATH] = DEFAULT_PATH
        storage.write_replace(PROPERTIES,
                              dump_properties(props, last_key=P_CHECKSUM).encode("latin-1"))


_SEEN: dict[tuple[str, str], Definition] = {}
"""(table base path, index name) → the definition this process last declared there (found
there, written, or not written because the file was unreadable): what lets :func:`refresh`
skip reading the file at every commit."""


def declare(storage: Storage, definition: Definition) -> bool:
    """Add or replace one definition (kept where it stands; a new one goes last, as
    Java's map read from the file keeps it). Partition stats follow column stats' version
    (Java refuses the file otherwise). Returns True if the file changed."""
    name = definition["indexName"]
    _SEEN[(storage.base_path, name)] = definition
    definitions = _editable(storage)
    if definitions is None:
        return False
    if definitions.get(name) == definition:
        return False
    definitions[name] = definition
    if name == COLUMN_STATS:
        _match_partition_stats(definitions)
    _write(storage, definitions)
    return True


def refresh(storage: Storage, definition: Definition) -> bool:
    """:func:`declare` after a commit (Java's ``updateColsToIndex``: column stats'
    ``sourceFields`` follow the columns each commit indexed), reading the file only when
    the definition differs from the one this process last saw there. Returns True if the
    file changed."""
    if _SEEN.get((storage.base_path, definition["indexName"])) == definition:
        return False
    return declare(storage, definition)


def remove(storage: Storage, names: Iterable[str]) -> bool:
    """Drop the definitions of ``names`` (MDT partitions just dropped); the file stays with
    the others, as Java's ``deleteIndexDefinition`` leaves it. Returns True if it
    changed."""
    names = list(names)
    if not names:
        return False
    for name in names:
        _SEEN.pop((storage.base_path, name), None)
    definitions = _editable(storage)
    if definitions is None:
        return False
    gone = [n for n in names if n in definitions]
    if not gone:
        return False
    for name in gone:
        del definitions[name]
    _write(storage, definitions)
    return True


def align_versions(storage: Storage, version: TableVersion) -> bool:
    """On a table Java upgraded to version 9, whose ``column_stats`` definition the upgrade
    stamped ``V1``: record ``V2``, what tidelake writes there from now on (and partition
    stats alike). Returns True if the file changed."""
    if not version.versioned_index_definitions:
        return False
    definitions = _editable(storage)
    if definitions is None:
        return False
    current = definitions.get(COLUMN_STATS)
    if current is None or current.get("version") == "V2":
        return False
    definitions[COLUMN_STATS] = {**current, "version": "V2"}
    _SEEN.pop((storage.base_path, COLUMN_STATS), None)
    _match_partition_stats(definitions)
    _write(storage, definitions)
    return True


def _match_partition_stats(definitions: dict[str, Definition]) -> None:
    stats, partition_stats = definitions.get(COLUMN_STATS), definitions.get(PARTITION_STATS)
    if stats is None or partition_stats is None:
        return
    if "version" in stats:
        partition_stats["version"] = stats["version"]
    else:
        partition_stats.pop("version", None)
