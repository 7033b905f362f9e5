"""One read task's share of a micro-batch: an offset range of one topic partition.

Its own module, beside :mod:`ingest.kafka_source` (which plans partitions on the driver) and
:mod:`ingest.kafka_read` (which reads them in executor tasks), so that the processes Spark
starts to plan a query and to run the source's driver side unpickle it without importing
the read path (pyarrow, numpy, the record decoder).
"""

from __future__ import annotations

from pyspark.sql.datasource import InputPartition

__all__ = ["KafkaInputPartition"]


class KafkaInputPartition(InputPartition):
    """One task's work: offsets ``[start, end)`` of one topic partition. Picklable."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
