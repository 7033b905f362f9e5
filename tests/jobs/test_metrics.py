"""The metrics endpoint of a running ``tidelake ingest`` job: scraped over HTTP while the job
runs, every metric of docs/ingest.md "Metrics" is there, and its values are those of the
progress lines the same run printed, of what the test produced, and of the table's commits."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import Table
from engine.config import WriteConfig
from engine.errors import InvalidOptionError
from engine.timeline.active import Timeline
from ingest.checkpoint import SINK_CHECKPOINT_KEY, STREAMER_CHECKPOINT_KEY
from ingest.kafka_produce import create_topic, produce
from jobs.cli import main
from jobs.metrics import hudi_name
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.spark_python import pythonpath

ROOT = Path(__file__).resolve().parents[2]

JOB = """
[source]
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
max_offsets_per_trigger = {per_batch}
[decode]
schema = "id STRING, ts BIGINT"
[table]
path = "{out}/t"
name = "trips"
record_key = ["id"]
precombine = "ts"
[checkpoint]
location = "{out}/cp"
[trigger]
processing_time = "1 second"
[metrics]
enabled = true
port = {port}
[spark.conf]
"spark.sql.shuffle.partitions" = "1"
"""

OURS = ("tidelake_batches_total", "tidelake_batches_skipped_total", "tidelake_records_total",
        "tidelake_errors_total", "tidelake_commit_retries_total",
        "tidelake_batch_duration_seconds_count", "tidelake_batch_duration_seconds_sum",
        "tidelake_commit_duration_seconds_count", "tidelake_commit_duration_seconds_sum",
        "tidelake_last_batch_records", "tidelake_last_batch_errors",
        "tidelake_last_batch_duration_seconds", "tidelake_last_commit_duration_seconds",
        "tidelake_last_batch_timestamp_seconds", "tidelake_last_batch_file_groups",
        "tidelake_last_batch_max_slice_log_files", "tidelake_kafka_lag_records",
        "tidelake_service_scheduled_total", "tidelake_service_runs_total",
        "tidelake_service_failures_total", "tidelake_service_failures_in_a_row",
        "tidelake_service_running", "tidelake_service_running_seconds",
        "tidelake_pending_instants", "tidelake_backpressure_waits_total",
        "tidelake_backpressure_wait_seconds_total")
HUDIS = tuple(hudi_name("trips", action, metric) for action, metric in (
    *(("deltacommit", m) for m in (
        "totalPartitionsWritten", "totalFilesInsert", "totalFilesUpdate", "totalRecordsWritten",
        "totalUpdateRecordsWritten", "totalInsertRecordsWritten", "totalRecordsDeleted",
        "totalBytesWritten", "duration", "commitTime")),
    ("deltastreamer", "kafkaDelayCount"), ("deltastreamer", "duration"),
    ("compaction", "pendingCompactionInstantCount"),
    ("clustering", "pendingClusteringInstantCount"), ("clean", "pendingCleanInstantCount"),
    ("rollback", "pendingRollbackInstantCount")))
LABELS = {"table", "topic", "partition", "service", "action"}

_LINE = re.compile(r"^batch (\d+): ([\d,]+) records, .*, lag ([\d,]+), ([\d,]+) errors, "
                   r"(\d+) file groups written")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset({"table": "trips", **labels}.items()))]


def _lines(out: Path) -> dict[int, tuple[int, int, int, int]]:
    """Printed progress lines by batch number: (records, lag, errors, file groups)."""
    found = {}
    for line in out.read_text().splitlines():
        if match := _LINE.match(line):
            n, *values = (int(g.replace(",", "")) for g in match.groups())
            found[n] = tuple(values)
    return found  # type: ignore[return-value]


def _services_done(out: Path, batch: int) -> dict[str, int]:
    """``{service: runs}`` of the services part of batch ``batch``'s line (``clean 3 done``)."""
    line = next(x for x in out.read_text().splitlines() if x.startswith(f"batch {batch}: "))
    part = line.partition("; services: ")[2]
    return {name: int(n) for name, n in re.findall(r"(\w+) (\d+) done", part)}


def _wait_for_line(out: Path, process: subprocess.Popen[bytes], batch: int,
                   timeout: float = 240) -> tuple[int, int, int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if batch in (lines := _lines(out)):
            return lines[batch]
        assert process.poll() is None, out.read_text()
        time.sleep(0.2)
    raise AssertionError(f"no line for batch {batch} within {timeout} s:\n{out.read_text()}")


def _commit_of_batch(table: Path, batch_id: int) -> tuple[dict[str, int], int]:
    """The table's own record of a micro-batch: the Kafka offsets its commit recorded per
    partition, and the file groups it wrote."""
    t = Table.open(str(table))
    timeline = Timeline.load(t.storage, t.config)
    for instant in timeline.completed_data_instants:
        meta = timeline.commit_metadata(instant)
        extra = meta.extra_metadata
        if SINK_CHECKPOINT_KEY in extra and not meta.compacted and int(
                json.loads(extra[SINK_CHECKPOINT_KEY])["default_single_writer"]) == batch_id:
            _, *parts = extra[STREAMER_CHECKPOINT_KEY].split(",")
            offsets = {p: int(o) for p, o in (part.split(":") for part in parts)}
            return offsets, len({(s.partition_path, s.file_id) for s in meta.write_stats})
    raise AssertionError(f"no commit of batch {batch_id} in {table}")


def _check(samples: Samples, out: Path, batch: int, topic: str, produced: dict[str, int],
           table: Path) -> None:
    lines = _lines(out)
    records, lag, errors, file_groups = lines[batch]
    before = lines[batch - 1] if batch > 1 else (0, 0, 0, 0)
    assert _value(samples, "tidelake_last_batch_records") == records - before[0]
    assert _value(samples, "tidelake_last_batch_errors") == errors - before[2]
    # services run beside the batches: a scrape shows at least what the line said
    for service, done in _services_done(out, batch).items():
        assert _value(samples, "tidelake_service_runs_total", service=service) >= done
    assert _value(samples, "tidelake_batches_total") == batch
    assert _value(samples, "tidelake_records_total") == records
    assert _value(samples, "tidelake_errors_total") == errors
    assert _value(samples, "tidelake_last_batch_file_groups") == file_groups
    assert _value(samples, "tidelake_commit_retries_total") == 0
    by_partition = {p: _value(samples, "tidelake_kafka_lag_records", topic=topic, partition=p)
                    for p in produced}
    assert sum(by_partition.values()) == lag
    assert samples[(hudi_name("trips", "deltastreamer", "kafkaDelayCount"), frozenset())] == lag
    # the oracle: what was produced, and what the table's commit of this batch recorded
    assert records + lag == sum(produced.values())
    offsets, groups = _commit_of_batch(table, batch - 1)
    assert by_partition == {p: produced[p] - offsets[p] for p in produced}
    assert file_groups == groups


@pytest.mark.slow  # one job run: a JVM start, 3 micro-batches (~40 s quiet, 130 s at load 10)
@pytest.mark.spark
@pytest.mark.kafka
def test_metrics_endpoint_scraped_during_job_matches_progress_lines_and_table(
        tmp_path: Path, kafka_bootstrap: str) -> None:  # noqa: F811
    topic = unique_topic("metrics")
    create_topic(kafka_bootstrap, topic, 2)
    records = [(b"k%d" % i, b'{"id": "k%d", "ts": %d}' % (i, i), i % 2) for i in range(400)]
    records += [(b"bad0", b"{not json", 0), (b"bad1", b"{not json", 1)]
    produce(kafka_bootstrap, topic, records)
    produced = {"0": 201, "1": 201}
    port = _free_port()
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(bootstrap=kafka_bootstrap, topic=topic, out=tmp_path / "out",
                              port=port, per_batch=150))
    out = tmp_path / "stdout"
    table = tmp_path / "out" / "t"
    with out.open("wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "ingest", str(job)], stdout=stdout,
            stderr=subprocess.PIPE, cwd=tmp_path, start_new_session=True,
            env={**os.environ, "PYTHONPATH": pythonpath(ROOT)})
        try:
            _wait_for_line(out, process, 1)
            first = _scrape(port)  # while the job reads: lag left in Kafka
            batch = int(_value(first, "tidelake_batches_total"))
            _wait_for_line(out, process, batch)
            _check(first, out, batch, topic, produced, table)
            while _lines(out)[max(_lines(out))][1] != 0:  # until a line says lag 0
                _wait_for_line(out, process, max(_lines(out)) + 1)
            last = _scrape(port)
            batch = int(_value(last, "tidelake_batches_total"))
            _wait_for_line(out, process, batch)
            _check(last, out, batch, topic, produced, table)
            os.kill(process.pid, signal.SIGTERM)
            assert process.wait(timeout=120) == 143
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            assert process.stderr is not None
            with process.stderr:
                stderr = process.stderr.read()
    printed = out.read_text()
    assert stderr == b"", stderr
    assert f"metrics: http://localhost:{port}/metrics" in printed.splitlines()
    assert _value(last, "tidelake_records_total") == 402
    assert _value(last, "tidelake_errors_total") == 2
    assert _value(first, "tidelake_kafka_lag_records", topic=topic, partition="0") > 0
    names = {name for name, _ in last}
    assert [n for n in (*OURS, *HUDIS) if n not in names] == []
    assert {k for _, labels in last for k, _ in labels} <= LABELS
    # every key of the last batch is new: Hudi's per-commit totals count them as inserts
    last_records = _value(last, "tidelake_last_batch_records")
    last_errors = _value(last, "tidelake_last_batch_errors")
    written = samples_of(last, "deltacommit", "totalRecordsWritten")
    assert written == samples_of(last, "deltacommit", "totalInsertRecordsWritten")
    assert written == last_records - last_errors
    assert samples_of(last, "deltacommit", "totalUpdateRecordsWritten") == 0
    assert _value(last, "tidelake_batch_duration_seconds_count") == batch
    assert 0 < _value(last, "tidelake_last_commit_duration_seconds") <= _value(
        last, "tidelake_last_batch_duration_seconds")


def samples_of(samples: Samples, action: str, metric: str) -> float:
    return samples[(hudi_name("trips", action, metric), frozenset())]


def test_metrics_port_in_use_is_an_error_naming_the_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        job = tmp_path / "job.toml"
        job.write_text(JOB.format(bootstrap="127.0.0.1:9", topic="t", out=tmp_path / "out",
                                  port=port, per_batch=10))
        from jobs.ingest_job import serve_metrics
        from jobs.job_config import load

        with pytest.raises(InvalidOptionError) as caught:
            serve_metrics(load(job))
    assert caught.value.key == "metrics.port"
    assert f"cannot serve metrics on port {port}" in str(caught.value)
    assert main(["ingest", str(job), "--metrics.port", "70000"]) == 2
    assert "option 'metrics.port': expected a TCP port from 1 to 65535, got '70000'" in \
        capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_metrics_options_refuse_other_hudi_reporters_naming_the_option() -> None:
    with pytest.raises(InvalidOptionError) as caught:
        WriteConfig.from_options({"hoodie.metrics.reporter.type": "GRAPHITE"})
    assert caught.value.key == "hoodie.metrics.reporter.type"
    assert "GRAPHITE reporter is not available" in str(caught.value)
    assert WriteConfig.from_options({"hoodie.metrics.reporter.type": "prometheus"}
                                    ).metrics_reporter_type == "PROMETHEUS"
    assert hudi_name("1t.x", "deltacommit", "duration") == "_1t_x_deltacommit_duration"


def test_metrics_settings_from_job_section_or_hudi_keys_off_by_default(tmp_path: Path) -> None:
    from jobs.ingest_job import metrics_settings
    from jobs.job_config import load

    base = JOB.replace("[metrics]\nenabled = true\nport = {port}\n", "")
    job = tmp_path / "job.toml"
    job.write_text(base.format(bootstrap="127.0.0.1:9", topic="t", out=tmp_path, per_batch=1))
    settings = metrics_settings(load(job))
    assert (settings.enabled, settings.port, settings.prefix) == (False, 9090, "")
    assert metrics_settings(load(job, {"metrics.enabled": "true", "metrics.port": "9464"})
                            ).port == 9464
    job.write_text(base.format(bootstrap="127.0.0.1:9", topic="t", out=tmp_path, per_batch=1)
                   + '[table.options]\n"hoodie.metrics.on" = "true"\n'
                   '"hoodie.metrics.prometheus.port" = "9555"\n'
                   '"hoodie.metrics.reporter.metricsname.prefix" = "lake.trips"\n')
    settings = metrics_settings(load(job))
    assert (settings.enabled, settings.port, settings.prefix) == (True, 9555, "lake_trips")
    with pytest.raises(InvalidOptionError) as caught:
        metrics_settings(load(job, {"metrics.port": "9090"}))
    assert caught.value.key == "metrics.port"  # contradicts hoodie.metrics.prometheus.port
    with pytest.raises(InvalidOptionError) as caught:
        metrics_settings(load(job, {"table.options.hoodie.metrics.prometheus.host": "x"}))
    assert caught.value.key == "hoodie.metrics.prometheus.host"  # not a Hudi option
