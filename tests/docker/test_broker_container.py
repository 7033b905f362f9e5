"""The Kafka fixture's container path (tests/kafka_broker.py) where Docker Hub is out of reach:
the named Kafka image cannot be pulled, so Tansu runs from the locally built demo image."""

from __future__ import annotations

import contextlib
import warnings

import pytest

from ingest.kafka_produce import create_topic, produce
from tests.docker.engine import ROOT, DockerEngine, ensure_base_images, run
from tests.kafka_broker import (
    DEFAULT_LOCAL_IMAGE,
    TRANSIENT_ENGINE_LABEL,
    start_broker,
    unique_topic,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(read|open)_text is deprecated", DeprecationWarning)
    from kafka import KafkaConsumer, TopicPartition

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.kafka]

UNPULLABLE = "tidelake-test/no-such-kafka:0"
"""A Kafka image no registry has: the fixture must go on to the local image."""


def _broker_containers() -> list[str]:
    return run(["docker", "ps", "-a", "-q", "--filter", f"ancestor={DEFAULT_LOCAL_IMAGE}"],
               timeout=60).stdout.split()


def test_broker_fixture_unpullable_image_runs_tansu_from_the_demo_image(
        engine: DockerEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_base_images()
    run([*engine.compose, "-f", str(ROOT / "docker" / "compose.yaml"), "build", "job"],
        timeout=1800, cwd=ROOT)  # tidelake:local; cached for the demo test
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("TIDELAKE_KAFKA_LOCAL_IMAGE", raising=False)
    monkeypatch.setenv("TIDELAKE_KAFKA_BROKER", "container")  # no fallback to the embedded one
    monkeypatch.setenv("TIDELAKE_KAFKA_IMAGE", UNPULLABLE)
    before = set(_broker_containers())

    with contextlib.ExitStack() as stack:
        bootstrap = start_broker(stack)
        started = set(_broker_containers()) - before
        assert len(started) == 1, f"expected one broker container, found {started}"
        ports = run(["docker", "port", started.pop(), "9092/tcp"], timeout=60).stdout
        assert bootstrap.rsplit(":", 1)[1] in ports, (bootstrap, ports)

        topic = unique_topic("broker-container")
        create_topic(bootstrap, topic, partitions=2)
        offsets = produce(bootstrap, topic, [(b"k%d" % i, b"v%d" % i, i % 2) for i in range(10)])
        assert sorted(offsets) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=10_000)
        try:
            consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
            consumer.seek_to_beginning()
            got = {(r.key, r.value) for r in consumer}
        finally:
            consumer.close()
        assert got == {(b"k%d" % i, b"v%d" % i) for i in range(10)}

    assert set(_broker_containers()) == before, "the broker container outlived its stack"


def test_broker_fixture_auto_passes_over_the_engine_these_tests_started(
        engine: DockerEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test process beside this folder's tests (scripts/test.sh's other lane) starts its
    session broker while the engine these tests started runs: ``auto`` must not put it in a
    container that dies when the engine is stopped after them (CI, at 1d8f345: three job tests
    of the other lane failed with ECONNREFUSED). An engine that was already running is used."""
    ensure_base_images()
    run([*engine.compose, "-f", str(ROOT / "docker" / "compose.yaml"), "build", "job"],
        timeout=1800, cwd=ROOT)  # the image auto would run Tansu from (cached)
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("TIDELAKE_KAFKA_LOCAL_IMAGE", raising=False)
    monkeypatch.setenv("TIDELAKE_KAFKA_BROKER", "auto")
    monkeypatch.setenv("TIDELAKE_KAFKA_IMAGE", UNPULLABLE)
    labels = run(["docker", "info", "--format", "{{json .Labels}}"], timeout=60).stdout
    assert (TRANSIENT_ENGINE_LABEL in labels) == engine.started_here, labels
    before = set(_broker_containers())

    with contextlib.ExitStack() as stack:
        bootstrap = start_broker(stack)
        started = set(_broker_containers()) - before
        if engine.started_here:
            assert started == set(), f"a broker container on the transient engine: {started}"
            assert bootstrap.startswith("127.0.0.1:"), bootstrap  # the embedded Tansu
        else:
            assert len(started) == 1, f"expected one broker container, found {started}"
        topic = unique_topic("broker-auto")
        create_topic(bootstrap, topic, partitions=1)
        assert produce(bootstrap, topic, [(b"k", b"v", 0)]) == [0]
