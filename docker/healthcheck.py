"""The job container's healthcheck: is the streaming job committing?

Healthy (exit 0) when the table's newest completed commit is younger than
``TIDELAKE_HEALTH_MAX_AGE`` seconds (default 120), or when the job is idle because it has
caught up: the offsets its newest streaming commit recorded reach the end of every partition
of its topics. Unhealthy (exit 1) when the table has no commit yet, or when its commits are
older than that while Kafka holds records the table does not have. One line says which.

The job file is ``TIDELAKE_JOB_FILE`` (default ``/etc/tidelake/job.toml``, the image's job).
"""

from __future__ import annotations

import datetime as dt
import os
import sys


def check(job_file: str, max_age_s: float) -> tuple[bool, str]:
    """(healthy, why) for the job of ``job_file``."""
    from engine import Table
    from engine.errors import TableNotFoundError
    from engine.timeline.active import Timeline
    from engine.timeline.instant import parse_instant_time
    from ingest.checkpoint import last_offsets
    from jobs.job_config import load

    config = load(job_file)
    try:
        table = Table.open(config["table.path"])
    except TableNotFoundError:
        return False, f"no table at {config['table.path']} yet: nothing committed"
    timeline = Timeline.load(table.storage, table.config)
    done = [i for i in timeline.completed_data_instants if i.completion_time]
    if not done:
        return False, "no completed commit yet"
    newest = max(done, key=lambda i: str(i.completion_time))
    age = (dt.datetime.now(dt.timezone.utc)
           - parse_instant_time(str(newest.completion_time))).total_seconds()
    if age <= max_age_s:
        return True, f"committing: last commit {newest.requested_time} {age:.0f} s ago"
    behind = _records_behind(config["source.bootstrap_servers"], config["source.topics"],
                             last_offsets(timeline) or {})
    if behind == 0:
        return True, f"idle, caught up with Kafka: last commit {age:.0f} s ago"
    return False, (f"no commit for {age:.0f} s while Kafka holds {behind} records the table "
                   "does not have")


def _records_behind(bootstrap: str, topics: list[str],
                    committed: dict[str, dict[int, int]]) -> int:
    """Records past the committed offsets, per partition, summed (never negative: a broker
    whose ListOffsets lags its log, such as the embedded Tansu, cannot make it so)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=8000,
                             api_version_auto_timeout_ms=5000)
    try:
        partitions = [TopicPartition(topic, p) for topic in topics
                      for p in sorted(consumer.partitions_for_topic(topic) or ())]
        ends = consumer.end_offsets(partitions)
    finally:
        consumer.close()
    return sum(max(int(end) - committed.get(tp.topic, {}).get(tp.partition, 0), 0)
               for tp, end in ends.items())


def main() -> int:
    """Print one line and return 0 (healthy) or 1 (unhealthy)."""
    job_file = os.environ.get("TIDELAKE_JOB_FILE", "/etc/tidelake/job.toml")
    max_age = float(os.environ.get("TIDELAKE_HEALTH_MAX_AGE", "120"))
    try:
        healthy, why = check(job_file, max_age)
    except Exception as exc:  # the healthcheck's answer is its exit code and one line
        healthy, why = False, f"cannot tell: {type(exc).__name__}: {exc}"
    print(("healthy: " if healthy else "unhealthy: ") + why)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
