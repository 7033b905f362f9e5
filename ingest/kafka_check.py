"""Check that a job's Kafka source is usable before anything else starts (driver side).

:func:`check_source` connects with kafka-python, with a short timeout, and looks the subscribed
topics up. A job calls it before it builds its Spark session or creates any table, so an
unreachable broker or a misspelt topic costs seconds, prints one line, and leaves nothing
behind. The errors are terminal: retrying the same settings fails the same way.
"""

from __future__ import annotations

import socket
from typing import Any

from engine.errors import TerminalError
from ingest.kafka_offsets import MissingTopicsError
from ingest.kafka_options import KafkaSourceOptions

__all__ = ["KafkaUnreachableError", "MissingTopicsError", "check_source"]


class KafkaUnreachableError(TerminalError):
    """No broker of ``kafka.bootstrap.servers`` answered (or the connection was refused)."""


def _host_port(server: str) -> tuple[str, int]:
    host, port = server, "9092"
    if server.startswith("["):  # [::1]:9092
        host, _, rest = server[1:].partition("]")
        port = rest.lstrip(":") or port
    elif server.count(":") == 1:
        host, port = server.split(":")
    try:
        return host, int(port)
    except ValueError:
        raise KafkaUnreachableError(f"bad bootstrap server {server!r} (source.bootstrap_servers):"
                                    " expected host:port") from None


def _check_tcp(servers: list[str], timeout_s: float) -> None:
    """Raise unless at least one server accepts a TCP connection: a refused connection or an
    unknown host fails at once, with the reason, instead of after kafka-python's retries."""
    reasons = []
    for server in servers:
        host, port = _host_port(server)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except socket.gaierror:
            reasons.append(f"{server}: unknown host")
        except TimeoutError:
            reasons.append(f"{server}: no answer within {timeout_s:g} s")
        except OSError as exc:
            reasons.append(f"{server}: {(exc.strerror or str(exc)).lower()}")
    raise KafkaUnreachableError(
        f"cannot reach Kafka ({'; '.join(reasons)}); check source.bootstrap_servers and that "
        "the broker is running")


def check_source(options: KafkaSourceOptions, timeout_s: float = 10.0) -> None:
    """Raise :class:`KafkaUnreachableError` if no bootstrap server answers within
    ``timeout_s``, and :class:`MissingTopicsError` naming the subscribed topics that do not
    exist. Needs no Spark; opens and closes one group-less consumer."""
    import kafka
    from kafka.errors import KafkaError

    servers = ",".join(options.client_config["bootstrap_servers"])
    _check_tcp(options.client_config["bootstrap_servers"], timeout_s)
    timeout_ms = max(int(timeout_s * 1000), 1)
    defaults: dict[str, Any] = getattr(kafka.KafkaConsumer, "DEFAULT_CONFIG", {})
    # kafka-python 3 names it bootstrap_timeout_ms; 2.x api_version_auto_timeout_ms
    wait = ("bootstrap_timeout_ms" if "bootstrap_timeout_ms" in defaults
            else "api_version_auto_timeout_ms")
    protocol = options.client_config.get("security_protocol", "PLAINTEXT")
    try:
        consumer = kafka.KafkaConsumer(**options.consumer_config(
            **{wait: timeout_ms}, request_timeout_ms=max(timeout_ms, 1000)))
    except KafkaError as exc:
        raise KafkaUnreachableError(
            f"cannot reach Kafka at {servers} within {timeout_s:g} s ({type(exc).__name__}); "
            f"check source.bootstrap_servers, that the broker is running, and the "
            f"source.kafka security settings (security.protocol is {protocol})") from exc
    try:
        try:
            existing = set(consumer.topics())
        except KafkaError as exc:
            raise KafkaUnreachableError(
                f"Kafka at {servers} did not answer a metadata request "
                f"({type(exc).__name__}: {exc}); check source.bootstrap_servers and the "
                f"source.kafka security settings (security.protocol is {protocol})") from exc
    finally:
        consumer.close()
    missing = [t for t in options.topics if t not in existing]
    if missing:
        shown = ", ".join(f"'{t}'" for t in missing)
        visible = sorted(t for t in existing if not t.startswith("__"))  # not Kafka's own
        there = (f"; topics there: {', '.join(visible[:10])}{', ...' if len(visible) > 10 else ''}"
                 if visible else "; it has no topics")
        raise MissingTopicsError(
            f"topic {shown} does not exist on {servers} (source.topics): create it or fix "
            f"the name{there}", missing)
