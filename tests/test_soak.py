"""The rotating CI cases of ``tests/soak.py``: each run keeps the asked number of cases, the same
seed picks the same ones, successive seeds reach every case, and the soak size runs them all."""

from __future__ import annotations

import pytest

from tests import soak


def test_rotate_keeps_the_asked_cases_in_order_the_same_for_a_seed_and_every_case_over_seeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak, "SOAK", False)
    cases = ("a", "b", "c", "d")
    seen: set[str] = set()
    for seed in range(40):
        monkeypatch.setattr(soak, "ROTATION_SEED", seed)
        picked = soak.rotate("t", cases, keep=2)
        assert len(picked) == 2 and picked == [c for c in cases if c in picked]
        assert soak.rotate("t", cases, keep=2) == picked
        assert str(seed) in soak.rotation_note()
        seen.update(picked)
    assert seen == set(cases)
    assert soak.rotate("t", cases, keep=9) == list(cases)


def test_rotate_runs_every_case_at_the_soak_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak, "SOAK", True)
    assert soak.rotate("t", ("a", "b", "c")) == ["a", "b", "c"]
