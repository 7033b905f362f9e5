"""Test sizes: the CI size by default, the full (soak) size one flag away.

Tests that repeat random rounds (kill loops, seeds, property-test examples, long streaming
runs, stress steps) run each distinct crash point, interleaving and table shape at the CI
size, and repeat them at the full size with ``TIDELAKE_SOAK=1`` (``scripts/test.sh --soak``
sets it). ``docs/testing.md`` lists what each size runs.
"""

from __future__ import annotations

import os
from typing import TypeVar

__all__ = ["SOAK", "soak"]

T = TypeVar("T")

SOAK = os.environ.get("TIDELAKE_SOAK", "").strip().lower() in ("1", "true", "yes", "on")
"""True when ``TIDELAKE_SOAK`` asks for the full sizes."""


def soak(ci: T, full: T) -> T:
    """``full`` under ``TIDELAKE_SOAK=1``, else ``ci``."""
    return full if SOAK else ci
