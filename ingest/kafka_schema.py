"""The Kafka row schema, written once: Spark's ``kafka`` source's columns as Arrow.

:data:`ARROW_SCHEMA` is what the read tasks of ``tidelake-kafka`` return (its DDL,
:func:`ingest.kafka_source.kafka_ddl`, and Spark ``StructType`` are derived from it;
``tests/ingest/test_kafka_source.py`` checks the Spark form converts back to it unchanged);
:data:`KAFKA_ROW_SCHEMA` is the same less the headers, the rows prepare reads
(:data:`ingest.rows.KAFKA_COLUMNS`) and the Kafka-shaped files tests and benchmarks write.
Imports only pyarrow: read tasks load it first.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["ARROW_SCHEMA", "KAFKA_ROW_SCHEMA"]

KAFKA_ROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
])
"""Kafka rows without their headers (Spark's ``kafka`` source less ``timestampType`` and
``headers``)."""

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
ARROW_SCHEMA = KAFKA_ROW_SCHEMA.append(pa.field("headers", pa.list_(pa.field("element",
                                                                              _HEADER))))
"""Arrow form of :func:`ingest.kafka_source.kafka_ddl`, exactly as Spark expects record
batches from ``read``."""
