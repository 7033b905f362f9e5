"""Jackson's default pretty printer (``engine/format/jackson.py``), the one writer of the JSON
files Hudi's Java code writes pretty-printed: every such file in the Java-written sample
tables (version 6 commit metadata, inflight files, index definitions) comes back byte for
byte, and the files tidelake writes are in that layout."""

from __future__ import annotations

import json
import zipfile

import pytest

from engine.format.jackson import pretty_json
from engine.timeline.commit_metadata import CommitMetadata, WriteStat
from tests.conftest import SAMPLES

_JSON_SUFFIXES = (".commit", ".deltacommit", ".replacecommit", ".inflight", "index.json")


def _java_json_files() -> list[tuple[str, str, bytes]]:
    """(sample, member, bytes) of every pretty-printed JSON file of the samples."""
    found = []
    for sample in sorted(SAMPLES.glob("*.zip")):
        with zipfile.ZipFile(sample) as zf:
            for member in zf.namelist():
                if member.startswith("__MACOSX/") or not member.endswith(_JSON_SUFFIXES):
                    continue
                data = zf.read(member)
                if data.startswith(b"{\n"):  # JSON (version 8's commit files are Avro)
                    found.append((sample.stem, member, data))
    return found


def test_pretty_json_rewrites_every_java_written_json_file_byte_for_byte() -> None:
    files = _java_json_files()
    for sample, member, data in files:
        text = data.decode("utf-8")
        assert pretty_json(json.loads(text)) == text, (sample, member)
    kinds = {member.rsplit(".", 1)[-1] for _, member, _ in files}
    assert {"commit", "deltacommit", "replacecommit", "inflight", "json"} <= kinds
    assert len(files) > 40


@pytest.mark.parametrize("value, text", [
    ({}, "{ }"), ([], "[ ]"), ({"a": []}, '{\n  "a" : [ ]\n}'),
    ({"a": [{"b": {}}, 1]}, '{\n  "a" : [ {\n    "b" : { }\n  }, 1 ]\n}'),
    ({"é\"\t": None}, '{\n  "é\\"\\t" : null\n}'),
])
def test_pretty_json_nests_objects_only_and_escapes_as_jackson(value: object, text: str) -> None:
    assert pretty_json(value) == text


def test_commit_metadata_of_version_6_is_written_as_jackson_writes_it() -> None:
    stats = (WriteStat("f1-0", "p/f1-0_0-1-2_20240101000000000.parquet", "p", num_writes=3),
             WriteStat("f2-0", "p/.f2-0_20240101000000000.log.1_0-1-2", "p", log_version=1,
                       log_offset=0, base_file="", log_files=(".f2-0_x.log.1_0-1-2",)))
    metadata = CommitMetadata(stats, extra_metadata={"schema": '{"type":"record"}'},
                              partition_to_replace_file_ids={"p": ("f0-0",), "q": ()})
    text = metadata.to_json_bytes().decode("utf-8")
    assert pretty_json(json.loads(text)) == text
    assert '"compacted" : false' in text and '"q" : [ ]' in text
    assert CommitMetadata.from_bytes(text.encode("utf-8")) == metadata
