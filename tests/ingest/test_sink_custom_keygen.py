"""The streaming sink on tables of Hudi's ``CustomKeyGenerator`` (made as a Java writer of
Hudi 1.x leaves them: :func:`tests.helpers.java_custom_keygen_table`, whose docstring and
``tests/engine/test_keygen_custom.py`` cite the Hudi source followed). The sink opens an
existing table through ``Table.check_writable``, so it answers as ``Table``'s writes do:
SIMPLE parts only are written as Hudi's custom key generator writes them (the bare key of one
key field, ``field=value`` folders under hive-style), any other part is refused before a
batch runs, naming the keys."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine import Table
from engine.errors import UnsupportedTableError
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.helpers import (
    PARTITION_FIELDS,
    hudi_rs_read_custom_keygen,
    java_custom_keygen_table,
    rows_by_key,
)
from tests.ingest.helpers import (
    ROW,
    EventOracle,
    data_frame,
    decoder,
    kafka_rows,
    random_batches,
    table_rows,
)
from tests.spark_session import spark  # noqa: F401

# pyspark warns on the driver, each time a pandas-based plan (mapInArrow) is built, that
# pandas >= 3 is not fully supported.
pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

BUCKET = {"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": "2"}


@pytest.mark.spark
def test_bucket_sink_java_custom_keygen_simple_part_batches_match_oracle_and_hudi_rule(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """Micro-batches of inserts, updates, late versions and deletes into a Java-made custom
    table (``city:SIMPLE``, hive-style, merge-on-read, bucket index): the rows equal the
    oracle (tidelake's read and hudi-rs's), each record key is the bare ``id``
    (``SimpleAvroKeyGenerator``'s, one key field) and each folder ``city=<value>``."""
    path = java_custom_keygen_table(tmp_path / "trips", record_key="id",
                                    partition_fields="city:SIMPLE", hive_style=True,
                                    url_encode=False, table_type="MERGE_ON_READ",
                                    options=BUCKET)
    sink = HudiStreamingSink(SinkConfig(str(path), decoder=decoder(), record_key="id",
                                        precombine="ts", partition_by=["city"]))
    oracle, offsets, clock = EventOracle(), {}, [0]
    for batch_id, events in enumerate(random_batches(random.Random(7), 3, 30, moves=False,
                                                     tombstones=True, clock=clock)):
        sink.process_batch(data_frame(spark, kafka_rows(events, "trips", offsets)), batch_id)
        oracle.apply(events)
        assert sink.last_result is not None and sink.last_result.errors == 0
    assert oracle.rows and table_rows(path) == oracle.rows
    judge = hudi_rs_read_custom_keygen(path, tmp_path)
    assert rows_by_key(judge, "id", ROW, once=True) == oracle.rows
    for data in (Table.open(str(path)).read(), judge):
        for row in data.to_pylist():
            assert row["_hoodie_record_key"] == row["id"]
            assert row["_hoodie_partition_path"] == f"city={row['city']}"


@pytest.mark.parametrize("partition_fields", ["city:TIMESTAMP", "city"])
def test_sink_java_custom_keygen_timestamp_or_untyped_part_refused_naming_keys(
        tmp_path: Path, partition_fields: str) -> None:
    """A custom table with a TIMESTAMP part, or a part without a type: the sink refuses it
    when it opens the table (``Table.check_writable``), naming the key generator and the
    partition fields, before any batch."""
    path = java_custom_keygen_table(tmp_path / "trips", record_key="id",
                                    partition_fields=partition_fields, hive_style=False,
                                    url_encode=False, options=BUCKET)
    with pytest.raises(UnsupportedTableError,
                       match=rf"keygenerator\.type=CUSTOM, {PARTITION_FIELDS}="
                             rf"{partition_fields}: .*key generator"):
        HudiStreamingSink(SinkConfig(str(path), decoder=decoder(), record_key="id",
                                     precombine="ts", partition_by=["city"]))
    assert not [p for p in (path / ".hoodie" / "timeline").iterdir() if p.is_file()]
