"""A Docker engine and a compose command for the demo test, found or started.

:func:`docker_engine` (a context manager) yields a :class:`DockerEngine` when ``docker info``
answers. When none answers and this process is root on Debian, it installs what is missing
(``apt-get install docker.io docker-compose``), starts ``dockerd`` in the background and stops
that daemon (and only that one) on exit; it carries the label
:data:`~tests.kafka_broker.TRANSIENT_ENGINE_LABEL`, so no other test process puts its broker
there. Otherwise it raises :class:`EngineUnavailable` with
the reason, which the test turns into a skip.

:func:`ensure_base_images` makes sure ``docker/Dockerfile``'s base image is there: present,
else pulled, else (no Docker Hub) built as a stand-in by ``scripts/docker-standins.sh``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.kafka_broker import TRANSIENT_ENGINE_LABEL

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGES = ("python:3.11-slim-bookworm",)
"""The images docker/Dockerfile builds on (the Kafka image is replaced in the test)."""


class EngineUnavailable(RuntimeError):
    """No Docker engine answers and none can be started here (the reason is the message)."""


@dataclass(frozen=True)
class DockerEngine:
    """A Docker engine that answers, and the compose command that drives it."""

    compose: tuple[str, ...]
    """``("docker", "compose")`` (v2) or ``("docker-compose",)`` (v1)."""
    started_here: bool
    """True when this harness started the daemon (and stops it on exit)."""


def run(args: Sequence[str], timeout: float, *, check: bool = True, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (stdout and stderr captured as text); on failure raise with both."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"{' '.join(args)}: no result after {timeout:.0f} s; output so far: "
                           f"{_text(exc.stdout)[-2000:]}{_text(exc.stderr)[-2000:]}") from None
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def _answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return run(["docker", "info"], timeout=30, check=False).returncode == 0
    except TimeoutError:
        return False


def _can_install() -> bool:
    return os.geteuid() == 0 and Path("/etc/debian_version").exists() and bool(
        shutil.which("apt-get"))


def _apt_install(packages: Sequence[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], timeout=600, env=env)
    run(["apt-get", "install", "-y", "-qq", *packages], timeout=900, env=env)


def _compose_command() -> tuple[str, ...] | None:
    if shutil.which("docker") and run(["docker", "compose", "version"], timeout=30,
                                      check=False).returncode == 0:
        return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    return None


@contextlib.contextmanager
def docker_engine(start_timeout_s: float = 120.0) -> Iterator[DockerEngine]:
    """The Docker engine of the test (see the module docstring); stops a daemon it started."""
    daemon: subprocess.Popen[bytes] | None = None
    log_dir = tempfile.TemporaryDirectory(prefix="tidelake-dockerd-")
    log_path = Path(log_dir.name) / "dockerd.log"
    try:
        answers = _answers()
        if not answers:
            if not _can_install():
                raise EngineUnavailable(
                    "no Docker engine answers (`docker info`) and this process cannot start one "
                    "(that needs root on Debian: apt-get install docker.io, then dockerd)")
            if shutil.which("dockerd") is None or shutil.which("docker") is None:
                _apt_install(["docker.io"])
                answers = _answers()  # an init system may have started the installed daemon
        if not answers:
            with open(log_path, "ab") as log:
                # Labelled: the Kafka fixture of a test process running beside this one (the
                # other lane of scripts/test.sh) must not put its broker on an engine that
                # stops when this folder's tests end (tests/kafka_broker.py).
                daemon = subprocess.Popen(["dockerd", f"--label={TRANSIENT_ENGINE_LABEL}"],
                                          stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + start_timeout_s
            while not _answers():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"dockerd did not start (exit {daemon.poll()}):\n{tail}")
                time.sleep(1)
        compose = _compose_command()
        if compose is None and _can_install():
            _apt_install(["docker-compose"])
            compose = _compose_command()
        if compose is None:
            raise EngineUnavailable("a Docker engine answers but there is no compose command "
                                    "(neither `docker compose` nor `docker-compose`)")
        yield DockerEngine(compose=compose, started_here=daemon is not None)
    finally:
        if daemon is not None:
            _stop_daemon(daemon)
        log_dir.cleanup()


def _stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon we started (it stops its containerd too); SIGKILL after 60 s."""
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=30)


def image_present(name: str) -> bool:
    """True if the engine has image ``name``."""
    return run(["docker", "image", "inspect", name], timeout=60, check=False).returncode == 0


def ensure_base_images() -> list[str]:
    """Make :data:`BASE_IMAGES` present (pull, else stand-in); returns those built here."""
    built = []
    for image in BASE_IMAGES:
        if image_present(image):
            continue
        if run(["docker", "pull", "-q", image], timeout=600, check=False).returncode == 0:
            continue
        run(["bash", str(ROOT / "scripts" / "docker-standins.sh")], timeout=900)
        built.append(image)
    return built


IMAGE_LABEL = "org.opencontainers.image.title=tidelake"
"""The label docker/Dockerfile puts on its stages' images."""


def prune_replaced_images() -> str:
    """Remove the dangling images of docker/Dockerfile's stages (the ones a rebuild replaced),
    and no other image: on a machine that keeps its engine, each change of the code would
    otherwise leave about 150 MB behind. Returns the engine's summary line."""
    done = run(["docker", "image", "prune", "-f", "--filter", f"label={IMAGE_LABEL}"],
               timeout=300, check=False)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()
