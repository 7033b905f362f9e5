"""The parts of ``bench/ingest.py``, by concern (this package is not named ``ingest``: a
module of that name in ``bench/`` would shadow the real package).

- :mod:`.workload`: the records; :mod:`.producers`: getting them into Kafka;
- :mod:`.throughput` and :mod:`.latency`: the two measured phases;
- :mod:`.metering`: CPU and sink-step timing; :mod:`.profiling`: where the time goes;
- :mod:`.render`: the report.
"""
