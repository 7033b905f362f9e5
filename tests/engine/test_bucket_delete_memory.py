"""How long a merge-on-read BUCKET table remembers a delete (the known limit in
``docs/ingest.md``): the BUCKET index keeps no state, so a delete is remembered only by the
delete block in the key's file slice. Until a compaction folds that slice, a version older
than the delete loses to it at read time; after the compaction the base file simply lacks
the key, and the older version, arriving later, is written and read as live. The table shape
is the streaming job's default (MERGE_ON_READ, BUCKET, non-blocking writers, event-time
ordering), where async compaction runs every 5 deltacommits by default.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from tests.helpers import hudi_rs_read, row_tuples

COLUMNS = ("key", "ts", "v")


def _version(key: str, ts: int, v: str) -> pa.Table:
    return pa.table({"key": [key], "ts": pa.array([ts], pa.int64()), "v": [v]})


@pytest.mark.parametrize("compacted", [False, True])
def test_bucket_mor_delete_then_older_version_revived_only_after_compaction(
        tmp_path: Path, compacted: bool) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="key", precombine="ts",
                         table_type="MERGE_ON_READ",
                         options={"hoodie.index.type": "BUCKET",
                                  "hoodie.bucket.index.num.buckets": "1"})
    table.upsert(_version("k", 5, "x"))
    table.delete(pa.table({"key": ["k"], "ts": pa.array([5], pa.int64())}))  # ordered delete
    if compacted:
        table.compact()  # folds the delete: the new base file has no row, no tombstone, for k
        assert not [s for s in table.file_slices() if s.log_files]
    table.upsert(_version("k", 3, "late"))  # older than the delete
    expected = [("k", 3, "late")] if compacted else []
    assert row_tuples(table.read(columns=["key", "ts", "v"]), COLUMNS) == expected
    assert row_tuples(hudi_rs_read(table.path), COLUMNS) == expected
