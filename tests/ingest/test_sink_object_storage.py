"""The streaming sink writing to an s3:// table (moto on loopback): micro-batches through
Spark match the oracle and hudi-rs, bad records land in an s3:// error table, options never
show, and locations the engine cannot serve are refused naming the setting."""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine import Table
from engine.errors import UnsupportedStorageError
from ingest.decode import JsonDecoder
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.helpers import hudi_rs_read, rows_by_key
from tests.ingest.helpers import ROW, Event, EventOracle, decoder, kafka_rows, random_batches
from tests.s3 import ACCESS_KEY_ID, SECRET_ACCESS_KEY, S3Location
from tests.soak import soak
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]


@pytest.mark.spark
# RECORD_INDEX (executor-side MDT lookups on S3, ~40 s) at the soak size only.
@pytest.mark.parametrize("index", soak(["BUCKET"], ["BUCKET", "RECORD_INDEX"]))
def test_sink_batches_on_s3_match_oracle_and_hudi_rs_errors_to_s3_error_table(
        spark: Any, s3: S3Location, index: str) -> None:  # noqa: F811
    config = SinkConfig(s3.uri("trips"), decoder=decoder(), record_key="id", precombine="ts",
                        partition_by=["city"], index=index,
                        error_table_path=s3.uri("trips_errors"),
                        storage_options=s3.storage_options)
    assert SECRET_ACCESS_KEY not in repr(config)
    sink = HudiStreamingSink(config)
    oracle, offsets = EventOracle(), {0: 0, 1: 0}
    rng, clock = random.Random(11), [0]
    for batch_id, events in enumerate(random_batches(rng, 3, 40, moves=False,
                                                     tombstones=True, clock=clock)):
        if batch_id == 1:
            events = [*events, Event("bad", raw=b"{not json")]
        events = [Event(e.id, e.ts, e.city, e.fare, e.delete, e.tombstone, e.raw,
                        kafka_partition=len(e.id) % 2) for e in events]
        sink.process_batch(spark.createDataFrame(kafka_rows(events, "trips", offsets)),
                           batch_id)
        oracle.apply(events)
    table = Table.open(s3.uri("trips"), storage_options=s3.storage_options)
    assert rows_by_key(table.read(columns=["id", *ROW]), "id", ROW, once=True) == oracle.rows
    assert rows_by_key(hudi_rs_read(s3.uri("trips"), storage_options=s3.storage_options),
                       "id", ROW) == oracle.rows
    errors = Table.open(s3.uri("trips_errors"), storage_options=s3.storage_options).read()
    assert errors.num_rows == 1
    for body in s3.server.objects(s3.bucket).values():
        assert SECRET_ACCESS_KEY.encode() not in body and ACCESS_KEY_ID.encode() not in body


@pytest.mark.parametrize("field", ["table_path", "error_table_path"])
def test_sink_config_unsupported_location_refused_naming_the_setting(field: str) -> None:
    args = {"table_path": "/data/trips", field: "hdfs://nn/trips"}
    with pytest.raises(UnsupportedStorageError, match=rf"^{field}: hdfs://nn/trips: hdfs:// "
                       "locations are not supported"):
        SinkConfig(decoder=JsonDecoder("id STRING, ts BIGINT"), record_key="id", **args)
