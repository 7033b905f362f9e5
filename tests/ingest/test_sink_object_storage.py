"""The streaming sink takes local table locations only, so far: an object store URI is refused
up front, naming the setting (the engine's Table takes it; the sink stages error files and
runs Spark-side code that is not routed through the table's storage options yet)."""

from __future__ import annotations

import pytest

from engine.errors import UnsupportedStorageError
from ingest.decode import JsonDecoder
from ingest.sink_config import SinkConfig


@pytest.mark.parametrize("field", ["table_path", "error_table_path"])
def test_sink_config_object_store_location_refused_naming_the_setting(field: str) -> None:
    args = {"table_path": "/data/trips", field: "s3://lake/trips"}
    with pytest.raises(UnsupportedStorageError, match=rf"^{field}: s3://lake/trips: s3:// "
                       "locations are not supported yet by the streaming job"):
        SinkConfig(decoder=JsonDecoder("id STRING, ts BIGINT"), record_key="id", **args)
