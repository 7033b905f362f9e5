"""The commit protocol (engine.write.commit): no instant of a data table completes without the
metadata table's deltacommit at the same instant first, whoever completes it."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import InstantStateError
from engine.metadata.table import MetadataTable
from engine.timeline.active import MetadataSynced, Timeline
from engine.timeline.commit_metadata import CommitMetadata
from engine.write.commit import commit_instant

ENGINE = Path(__file__).resolve().parents[2] / "engine"
MAY_COMPLETE = {"write/commit.py", "metadata/writer.py"}
"""The commit protocol, and the metadata table's own writer (whose table keeps no MDT)."""


def _table(path: Path) -> Table:
    table = Table.create(str(path), name="commit", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["part"])
    table.upsert(pa.table({"key": ["a", "b"], "ts": [1, 1], "part": ["x", "y"]}))
    return table


def test_commit_protocol_data_action_without_the_metadata_step_is_refused(
        tmp_path: Path) -> None:
    table = _table(tmp_path / "t")
    client = table._client()
    _, inflight = client.begin()
    content = CommitMetadata(operation_type="upsert").encode(table.config.table_version)
    mdt = MetadataTable(table.storage, table.config)
    with client.lock:
        now = Timeline.load(table.storage, table.config)
        with pytest.raises(TypeError, match="synced"):
            now.complete(inflight, content)  # type: ignore[call-arg]
        with pytest.raises(InstantStateError, match=r"engine\.write\.commit"):
            now.complete(inflight, content, MetadataSynced("20000101000000000"))
    after = Timeline.load(table.storage, table.config).find(inflight.requested_time)
    assert after is not None and not after.is_completed
    assert all(i.requested_time != inflight.requested_time for i in mdt.timeline().instants)

    with client.lock:
        done = commit_instant(Timeline.load(table.storage, table.config), inflight, content)
    synced = [i for i in mdt.timeline().instants
              if i.requested_time == inflight.requested_time]
    assert [i.is_completed for i in synced] == [True]
    assert done.completion_time is not None and synced[0].completion_time is not None
    assert synced[0].completion_time < done.completion_time
    client.abort(inflight)  # stops the heartbeat; the completed instant stays
    assert Timeline.load(table.storage, table.config).find(inflight.requested_time) == done


def _completes_or_vouches(tree: ast.AST) -> list[int]:
    """Lines that complete an instant (``.complete(...)``) or make a ``MetadataSynced``."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("complete", "MetadataSynced"):
            lines.append(node.lineno)
    return lines


def test_commit_protocol_is_the_only_way_an_engine_module_completes_an_instant() -> None:
    found = {}
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).as_posix()
        lines = _completes_or_vouches(ast.parse(path.read_text(), rel))
        if lines and rel not in MAY_COMPLETE:
            found[rel] = lines
    assert found == {}
    assert all(_completes_or_vouches(ast.parse((ENGINE / rel).read_text()))
               for rel in MAY_COMPLETE)
