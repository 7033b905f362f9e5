"""What a user sees when a job cannot run: one line per failure, nothing left behind, and
Ctrl-C that stops after the batch in flight and exits 130 (real broker, real Spark)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingest.kafka_produce import create_topic, produce
from jobs.cli import main
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.spark_python import pythonpath

ROOT = Path(__file__).resolve().parents[2]

JOB = """
[source]
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
[decode]
schema = "id STRING, ts BIGINT"
[table]
path = "{out}/t"
name = "t"
record_key = ["id"]
precombine = "ts"
[checkpoint]
location = "{out}/cp"
[trigger]
processing_time = "1 second"
[spark.conf]
"spark.sql.shuffle.partitions" = "1"
"""


def _job(tmp_path: Path, bootstrap: str, topic: str = "events") -> Path:
    out = tmp_path / "out"
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(bootstrap=bootstrap, topic=topic, out=out))
    return path


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ingest_unreachable_broker_prints_one_line_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    servers = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    assert main(["ingest", str(_job(tmp_path, servers))]) == 2
    assert time.monotonic() - started < 5
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"tidelake: error: cannot reach Kafka ({servers}: connection refused); check "
        "source.bootstrap_servers and that the broker is running"]
    assert "Traceback" not in captured.out
    assert not (tmp_path / "out").exists()  # no table, no error table, no checkpoint


@pytest.mark.kafka
def test_ingest_missing_topic_prints_one_line_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kafka_bootstrap: str) -> None:  # noqa: F811
    # the message lists the first ten topics by name; the shared broker holds other tests'
    # topics too, so this one sorts before them
    there = unique_topic("0there")
    create_topic(kafka_bootstrap, there, 1)
    assert main(["ingest", str(_job(tmp_path, kafka_bootstrap, "no-such-topic"))]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tidelake: error: topic 'no-such-topic' does not exist on "
                           f"{kafka_bootstrap} (source.topics): create it or fix the name; "
                           "topics there: ")
    assert there in line
    assert not (tmp_path / "out").exists()


@pytest.mark.kafka
def test_ingest_verbose_failure_adds_the_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kafka_bootstrap: str) -> None:  # noqa: F811
    assert main(["ingest", str(_job(tmp_path, kafka_bootstrap, "no-such-topic")),
                 "--verbose"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidelake: error: topic 'no-such-topic' does not exist")
    assert "Traceback (most recent call last)" in err
    assert "MissingTopicsError" in err


def test_ingest_kafka_option_typo_fails_before_spark(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code = main(["ingest", str(_job(tmp_path, "127.0.0.1:9")),
                 "--set", "source.kafka.security.protocol=SASL_PLAINTXT"])
    assert code == 2
    assert time.monotonic() - started < 5
    assert capsys.readouterr().err.splitlines() == [
        "tidelake: error: option 'source.kafka.security.protocol': expected one of "
        "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, got 'SASL_PLAINTXT'"]


def test_ingest_unsupported_location_refused_before_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["ingest", str(_job(tmp_path, "127.0.0.1:9")),
                 "--table.path", "hdfs://nn/orders"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "tidelake: error: option 'table.path': hdfs://nn/orders: hdfs:// locations are not "
        "supported (use a local folder, file://, s3://, gs://, az:// or abfs[s]://)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]


def test_unexpected_error_is_one_line_pointing_to_verbose(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import jobs.cli

    def boom(args: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(jobs.cli, "show_table", boom)
    assert main(["table", "show", "x"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "tidelake: error: KeyError: 'surprise' (run with --verbose for the full trace)"]


def test_query_failure_message_is_the_root_cause_line() -> None:
    from jobs.ingest_job import query_failure

    text = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/ingest/kafka_source.py", line 210, in partitions\n'
        "    raise MissingTopicsError(\n"
        "ingest.kafka_source.MissingTopicsError: subscribed topic(s) ['trips'] do not "
        "exist on the cluster; create them first\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
        "(PythonRunner.scala:600)\n" * 3)
    error = query_failure(RuntimeError(text))
    assert str(error) == ("the streaming query failed: MissingTopicsError: subscribed "
                          "topic(s) ['trips'] do not exist on the cluster; create them first")
    assert error.detail == text


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = path.read_text() if path.exists() else ""
        if text in seen:
            return seen
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not printed within {timeout} s; output:\n"
                         f"{path.read_text() if path.exists() else ''}")


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.parametrize(("stop", "code", "why"), [(signal.SIGINT, 130, "Ctrl-C"),
                                                   (signal.SIGTERM, 143, "SIGTERM")],
                         ids=["ctrl-c", "sigterm"])
def test_ingest_ctrl_c_stops_after_batch_quietly_and_exits_130(
        tmp_path: Path, kafka_bootstrap: str, stop: int, code: int, why: str) -> None:  # noqa: F811
    """Ctrl-C reaches the whole foreground process group, as a terminal sends it. The
    GLOBAL_STATE index runs pyspark's transformWithStateInPandas, whose Python workers print
    "Streaming TransformWithStateInPandas Python worker ..." lines: none reach the user."""
    topic = unique_topic("ctrlc")
    create_topic(kafka_bootstrap, topic, 1)
    produce(kafka_bootstrap, topic, [(b"k%d" % i, b'{"id": "k%d", "ts": %d}' % (i, i), 0)
                                     for i in range(500)])
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = {**os.environ, "PYTHONPATH": pythonpath(ROOT)}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "ingest", str(_job(tmp_path, kafka_bootstrap,
                                                                  topic)),
             "--index.type", "GLOBAL_STATE"],
            stdout=stdout, stderr=stderr, env=env, cwd=tmp_path, start_new_session=True)
        try:
            _wait_for(out, "batch 1: 500 records", process, timeout=240)
            # Ctrl-C reaches the terminal's whole process group; kill(1) only the command
            (os.killpg if stop == signal.SIGINT else os.kill)(process.pid, stop)
            exit_code = process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    lines = out.read_text().splitlines()
    assert exit_code == code, lines
    assert err.read_text() == ""
    assert lines[0] == (f"tidelake ingest: {topic} on {kafka_bootstrap} -> MERGE_ON_READ table "
                        f"{tmp_path}/out/t (GLOBAL_STATE index), checkpoint {tmp_path}/out/cp")
    assert not [line for line in lines if "Python worker" in line]
    assert lines[1].startswith("Spark's log: ")
    assert lines[2].startswith("started in ") and lines[2].endswith(
        " s; reading (Ctrl-C stops after the batch in flight)")
    batch = next(line for line in lines if line.startswith("batch 1: "))
    assert batch.startswith("batch 1: 500 records, ")
    assert "/s now (" in batch and "/s avg), lag 0, 0 errors, " in batch
    assert (f"stopping ({why}): waiting for the batch in flight to commit (Ctrl-C again to "
            "stop now; that batch is then rolled back by the next run)") in lines
    assert lines[-1].startswith(f"stopped ({why}) after ")
    assert ": 500 records in 1 batches (" in lines[-1]
    assert lines[-1].endswith("/s avg), 0 errors, lag 0")


@pytest.mark.kafka
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_broker_command_serves_topics_until_stopped(tmp_path: Path, stop: int) -> None:
    from kafka import KafkaConsumer

    out = tmp_path / "stdout"
    with out.open("wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "broker", "--topic", "trips:3"],
            stdout=stdout, stderr=subprocess.PIPE, cwd=tmp_path, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            text = _wait_for(out, "everything it holds is then lost", process, timeout=60)
            first = text.splitlines()[0]
            prefix = "Kafka-protocol broker (Tansu, in memory) listening on "
            assert first.startswith(prefix)
            servers = first.removeprefix(prefix)
            assert text.splitlines()[1:] == [
                "topic trips (3 partitions)",
                f'use it in a job: [source] bootstrap_servers = "{servers}"',
                "Ctrl-C stops it; everything it holds is then lost"]
            consumer = KafkaConsumer(bootstrap_servers=servers, group_id=None)
            try:
                assert consumer.partitions_for_topic("trips") == {0, 1, 2}
            finally:
                consumer.close()
            # Ctrl-C reaches the terminal's whole process group; kill(1) only the command
            (os.killpg if stop == signal.SIGINT else os.kill)(process.pid, stop)
            assert process.wait(timeout=30) == 0
            with pytest.raises(OSError):  # the broker process went with it
                socket.create_connection(tuple(servers.split(":")), timeout=1).close()
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            assert process.stderr is not None
            with process.stderr:
                assert process.stderr.read() == b""
    assert out.read_text().splitlines()[-1] == "broker stopped"


@pytest.mark.spark
@pytest.mark.kafka
def test_ingest_available_now_prints_batches_and_a_summary_line(
        tmp_path: Path, kafka_bootstrap: str) -> None:  # noqa: F811
    topic = unique_topic("summary")
    create_topic(kafka_bootstrap, topic, 2)
    produce(kafka_bootstrap, topic, [(b"k%d" % i, b'{"id": "k%d", "ts": %d}' % (i, i), i % 2)
                                     for i in range(300)] + [(b"bad", b"{not json", 0)])
    result = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "ingest", str(_job(tmp_path, kafka_bootstrap, topic)),
         "--trigger.available_now", "true"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "PYTHONPATH": pythonpath(ROOT)})
    lines = result.stdout.splitlines()
    assert result.returncode == 0, (lines, result.stderr[-2000:])
    assert result.stderr == ""
    spark_log = lines[1].removeprefix("Spark's log: ")
    assert not Path(spark_log).exists()  # removed after a clean run
    batch = next(line for line in lines if line.startswith("batch 1: "))
    assert batch.startswith("batch 1: 301 records, ")
    assert batch.endswith(", lag 0, 1 errors, 4 file groups written")
    assert lines[-1].startswith("stopped (all available records read) after ")
    assert ": 301 records in 1 batches (" in lines[-1]
    assert lines[-1].endswith("/s avg), 1 errors, lag 0")
