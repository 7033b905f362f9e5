"""Test sizes: the CI size by default, the full (soak) size one flag away.

Tests that repeat random rounds (kill loops, seeds, property-test examples, long streaming
runs, stress steps) run each distinct crash point, interleaving and table shape at the CI
size, and repeat them at the full size with ``TIDELAKE_SOAK=1`` (``scripts/test.sh --soak``
sets it). ``docs/testing.md`` lists what each size runs.

Where a test repeats one behaviour in several cases (two kill points that leave the same kind
of state, two table shapes of one concurrency mode), the CI size runs a rotating subset:
:func:`rotate` picks it from ``TIDELAKE_ROTATION_SEED`` (``scripts/test.sh`` prints the seed it
sets; a pytest run without it draws one), so that successive CI runs cover every case, and
every run keeps at least one case of each behaviour. The same seed picks the same cases again.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["ROTATION_SEED", "SOAK", "rotate", "rotation_note", "soak"]

T = TypeVar("T")

SOAK = os.environ.get("TIDELAKE_SOAK", "").strip().lower() in ("1", "true", "yes", "on")
"""True when ``TIDELAKE_SOAK`` asks for the full sizes."""

# Drawn once and put in the environment, so that the processes this one starts (pytest-xdist's
# workers, which start after the conftest imports this module) pick the same cases.
ROTATION_SEED = int(os.environ.setdefault("TIDELAKE_ROTATION_SEED",
                                          str(time.time_ns() % 1_000_000)))
"""The seed of this run's rotating cases (``TIDELAKE_ROTATION_SEED`` replays them)."""


def soak(ci: T, full: T) -> T:
    """``full`` under ``TIDELAKE_SOAK=1``, else ``ci``."""
    return full if SOAK else ci


def rotate(name: str, cases: Sequence[T], keep: int = 1) -> list[T]:
    """``keep`` of ``cases`` at the CI size, picked by :data:`ROTATION_SEED` and ``name`` (each
    rotation draws apart from the others), in their order; every case under ``TIDELAKE_SOAK=1``."""
    if SOAK or keep >= len(cases):
        return list(cases)
    chosen = set(random.Random(f"{ROTATION_SEED}:{name}").sample(range(len(cases)), keep))
    return [case for n, case in enumerate(cases) if n in chosen]


def rotation_note() -> str:
    """What a failure message names so that the run's rotating cases can be replayed."""
    return f"TIDELAKE_ROTATION_SEED={ROTATION_SEED}"
