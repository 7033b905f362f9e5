"""The order in which the Kafka fixture picks its broker (tests/kafka_broker.py), without Docker."""

from __future__ import annotations

import contextlib

import pytest

from tests.kafka_broker import BrokerUnavailable, start_broker

NO_ENGINE = "unix:///nonexistent/tidelake-test-docker.sock"


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Docker engine answers (whatever runs on this machine), no external broker is named."""
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)


def test_broker_mode_unknown_raises_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("TIDELAKE_KAFKA_BROKER", "docker")
    with contextlib.ExitStack() as stack, pytest.raises(ValueError,
                                                        match="TIDELAKE_KAFKA_BROKER='docker'"):
        start_broker(stack)


def test_broker_external_address_wins_and_starts_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka.example:9092")
    monkeypatch.setenv("TIDELAKE_KAFKA_BROKER", "container")
    with contextlib.ExitStack() as stack:
        assert start_broker(stack) == "kafka.example:9092"


def test_broker_container_mode_without_engine_raises_instead_of_falling_back(
        no_engine: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDELAKE_KAFKA_BROKER", "container")
    with contextlib.ExitStack() as stack, pytest.raises(BrokerUnavailable,
                                                        match="no Docker engine answers"):
        start_broker(stack)


@pytest.mark.kafka
@pytest.mark.parametrize("mode", ["auto", "embedded"])
def test_broker_without_engine_is_the_embedded_tansu(
        no_engine: None, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("TIDELAKE_KAFKA_BROKER", mode)
    with contextlib.ExitStack() as stack:
        assert start_broker(stack).startswith("127.0.0.1:")
