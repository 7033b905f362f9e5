"""Bucket placement is one rule: :mod:`engine.write.placement`.

The engine's write client (``Table.upsert``) and the streaming job's Spark write tasks place
keys with the same function, so a change to the file-id rule is a change to
:func:`engine.write.placement.bucket_group`, and this test covers both paths: each writes the
same records into a fresh table of the same name, and both tables hold exactly the file groups
the rule names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.index.bucket import bucket_id
from engine.write.placement import bucket_group
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.ingest.helpers import CITIES, Event, data_frame, decoder, kafka_rows
from tests.spark_session import spark  # noqa: F401

pytestmark = pytest.mark.filterwarnings(
    "ignore:PySpark does not yet fully support pandas:FutureWarning")

NAME, BUCKETS = "placed", 3


def _groups(path: Path) -> set[tuple[str, str]]:
    return {(s.partition_path, s.file_id) for s in Table.open(str(path)).file_slices()}


@pytest.mark.spark
def test_bucket_placement_table_upsert_and_streaming_sink_name_the_same_groups(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    events = [Event(f"k{i}", 10 + i, CITIES[i % 3], float(i)) for i in range(30)]
    expected = {(e.city, bucket_group({}, NAME, e.city, bucket_id(e.id, BUCKETS)))
                for e in events}

    streamed = tmp_path / NAME / "streamed"
    sink = HudiStreamingSink(SinkConfig(
        str(streamed), decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], table_name=NAME, num_buckets=BUCKETS))
    sink.process_batch(data_frame(spark, kafka_rows(events, "ev", {})), 0)

    upserted = Table.create(str(tmp_path / NAME / "upserted"), name=NAME, record_key="id",
                            precombine="ts", partition_by=["city"],
                            options={"hoodie.index.type": "BUCKET",
                                     "hoodie.bucket.index.num.buckets": str(BUCKETS)})
    upserted.upsert(pa.table({"id": [e.id for e in events], "ts": [e.ts for e in events],
                              "city": [e.city for e in events],
                              "fare": [e.fare for e in events]}))

    assert _groups(streamed) == expected
    assert _groups(Path(upserted.path)) == expected
