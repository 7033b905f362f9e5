"""The write-side rule against stored versions, under both delete policies
(``engine/merge/policy.py``): remembered deletes (the streaming sink and its GLOBAL_STATE index)
and natural deletes (the engine API). Moved here from ``tests/ingest/test_sink.py`` (the rule
moved into the engine), with the natural policy's cases added; the column-wise forms
(``resolve_single``, ``deciding_rows``) are checked against the key-by-key ``resolve_key``."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from engine.merge.policy import (
    ABSENT,
    DELETED,
    KIND_CODES,
    LIVE,
    DeletePolicy,
    KeyState,
    deciding_rows,
    loses_to_stored,
    resolve_key,
    resolve_single,
)
from engine.merge.resolve import VersionColumns, resolve
from engine.schema import RECORD_KEY
from tests.helpers import java_compare

DELETE, UPSERT = True, False
REMEMBERED, NATURAL = DeletePolicy.REMEMBERED, DeletePolicy.NATURAL


def test_resolve_key_tombstone_deletes_at_the_live_ordering_then_older_version_loses() -> None:
    live = KeyState(LIVE, 9)
    # stored ts=9, tombstone, upsert ts=1: the tombstone deletes at 9; ts=1 is late and loses.
    out = resolve_key([DELETE, UPSERT], [0, 1], [True, False], event_time=True,
                      policy=REMEMBERED, stored=live)
    assert (out.winner, out.ordering, out.state) == (0, 9, KeyState(DELETED, 9))
    # the same with the ts=9 version earlier in the batch (nothing stored): nothing to write.
    out = resolve_key([UPSERT, DELETE, UPSERT], [9, 0, 1], [False, True, False],
                      event_time=True, policy=REMEMBERED)
    assert (out.winner, out.state) == (-1, KeyState(DELETED, 9))
    # a version at least as new as the deleted one comes back.
    out = resolve_key([DELETE, UPSERT], [0, 9], [True, False], event_time=True,
                      policy=REMEMBERED, stored=live)
    assert (out.winner, out.state) == (1, KeyState(LIVE, 9))
    # a tombstone of a key that is not live changes nothing.
    out = resolve_key([DELETE], [0], [True], event_time=True, policy=REMEMBERED,
                      stored=KeyState(DELETED, 9))
    assert (out.winner, out.state) == (-1, KeyState(DELETED, 9))
    assert resolve_key([UPSERT, DELETE, UPSERT], [9, 8, 9], [False, False, False],
                       event_time=True, policy=REMEMBERED).winner == 2  # tie: the later wins
    assert resolve_key([UPSERT, UPSERT], [9, 1], [False, False], event_time=False,
                       policy=REMEMBERED).winner == 1


def test_resolve_key_natural_delete_then_older_version_wins() -> None:
    live = KeyState(LIVE, 9)
    # stored ts=9, a delete without ordering value: a natural-order delete; ts=1 then wins.
    out = resolve_key([DELETE], [0], [True], event_time=True, policy=NATURAL, stored=live)
    assert (out.winner, out.ordering, out.state) == (0, None, KeyState(DELETED, None))
    out = resolve_key([DELETE, UPSERT], [0, 1], [True, False], event_time=True,
                      policy=NATURAL, stored=live)
    assert (out.winner, out.state) == (1, KeyState(LIVE, 1))
    # a delete with an ordering value competes like a version, under both policies.
    for policy in DeletePolicy:
        out = resolve_key([DELETE, UPSERT], [10, 1], [False, False], event_time=True,
                          policy=policy, stored=live)
        assert (out.winner, out.state) == (0, KeyState(DELETED, 10))
    assert NATURAL.delete_ordering(9) is None and REMEMBERED.delete_ordering(9) == 9
    assert REMEMBERED.remembers_deletes and not NATURAL.remembers_deletes


@pytest.mark.parametrize("policy", list(DeletePolicy))
@pytest.mark.parametrize("event_time", [True, False])
def test_resolve_single_is_resolve_key_for_every_single_version(
        event_time: bool, policy: DeletePolicy) -> None:
    cases = []  # every version against every stored state, orderings tied, older and newer
    for op in (UPSERT, DELETE):
        for r in (None, 1, 2, 3):
            if event_time and op == UPSERT and r is None:
                continue  # an upsert without ordering value: refused by both
            for kind in (ABSENT, LIVE, DELETED):
                stored_orderings = (None,) if kind == ABSENT or not event_time else \
                    (None, 1, 2, 3)
                cases += [(op, r, kind, so) for so in stored_orderings]
    out = resolve_single(
        np.array([c[0] for c in cases]), pa.array([c[1] for c in cases], pa.int64()),
        np.array([c[1] is None for c in cases]),
        np.array([KIND_CODES[c[2]] for c in cases], np.int8),
        pa.array([c[3] for c in cases], pa.int64()), event_time=event_time, policy=policy)
    for i, (op, r, kind, so) in enumerate(cases):
        one = resolve_key([op], [r], [r is None], event_time=event_time, policy=policy,
                          stored=KeyState(kind, so))
        assert bool(out.winner[i]) == (one.winner == 0), cases[i]
        assert out.kind[i] == KIND_CODES[one.state.kind], cases[i]
        if event_time:
            assert out.state_ordering is not None and out.ordering is not None
            assert out.state_ordering[i].as_py() == one.state.ordering, cases[i]
            if one.winner == 0:
                assert out.ordering[i].as_py() == one.ordering, cases[i]
    assert len(cases) >= 24


# --- deciding_rows: the column-wise statement of resolve_key ---------------------------------

_DOMAINS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "int64": (pa.int64(), [0, 1, 2, 3]),
    "float64": (pa.float64(), [-1.5, 0.0, 2.0, float("nan")]),
    # the two zeros apart (Java: -0.0 < 0.0), the tombstone's zero the negative one
    "float64_zeros": (pa.float64(), [-0.0, 0.0, float("nan"), -1.5]),
    "float32_zeros": (pa.float32(), [-0.0, 0.0, float("nan"), 2.5]),
    "string": (pa.string(), ["", "a", "b", "ba"]),
    "decimal": (pa.decimal128(10, 2), [Decimal("-1.00"), Decimal("0.00"), Decimal("0.01"),
                                       Decimal("7.50")]),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  [datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC),
                   datetime(2025, 12, 31, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC)]),
}


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, -0.0 not equal to 0.0 (Java's ``Double.equals``)."""
    if isinstance(a, float) and isinstance(b, float):
        return java_compare(a, b) == 0
    return bool(a == b)


def _same_state(a: KeyState, b: KeyState, event_time: bool) -> bool:
    if not event_time:  # nothing keeps a deleted key without event time
        return (a.kind == LIVE) == (b.kind == LIVE)
    return a.kind == b.kind and _same(a.ordering, b.ordering)


def _versions(rng: random.Random, values: list[Any], n: int
              ) -> list[tuple[bool, Any, bool]]:
    """``n`` hostile versions (delete, ordering value, ordering null): ties (few values),
    tombstones (null, or the zero a prepared row carries, flagged null), ordered deletes,
    upserts without an ordering value."""
    out = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.12:  # a tombstone
            out.append((DELETE, rng.choice([None, values[0]]), True))
        elif roll < 0.22:  # a marker delete with an ordering value
            out.append((DELETE, rng.choice(values), False))
        elif roll < 0.27:  # an upsert whose ordering value is null
            out.append((UPSERT, None, True))
        else:
            out.append((UPSERT, rng.choice(values), False))
    return out


def _expected_decided(versions: list[tuple[bool, Any, bool]], event_time: bool) -> bool:
    """Which keys deciding_rows promises to decide: every key without event time; under
    event time a single version, or upserts only, each with an ordering value."""
    if not event_time or len(versions) == 1:
        return True
    return all(op == UPSERT and not null for op, v, null in versions)


@pytest.mark.parametrize("domain", sorted(_DOMAINS))
@pytest.mark.parametrize("event_time", [True, False])
def test_deciding_rows_decide_each_key_as_resolve_key_on_hostile_batches(
        event_time: bool, domain: str) -> None:
    arrow_type, values = _DOMAINS[domain]
    rng = random.Random(f"{event_time}-{domain}")
    runs = [_versions(rng, values, rng.choice([1, 1, 2, 3, 5, 8])) for _ in range(400)]
    runs += [[(DELETE, None, True), (UPSERT, values[0], False)],  # a delete, then older
             [(DELETE, values[3], False), (UPSERT, values[1], False)],
             [(UPSERT, values[2], False), (UPSERT, values[2], False)],  # a tie
             [(UPSERT, values[1], False), (UPSERT, None, True), (UPSERT, values[0], False)]]
    rows = [v for run in runs for v in run]
    sizes = np.array([len(run) for run in runs], dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    at = deciding_rows(starts, ends, np.array([r[0] for r in rows]),
                       pa.array([r[1] for r in rows], arrow_type),
                       np.array([r[2] for r in rows]), event_time=event_time)
    stored = [KeyState()] + [KeyState(kind, v) for kind in (LIVE, DELETED)
                             for v in ([None, *values] if event_time else [None])]
    decided = 0
    for k, run in enumerate(runs):
        assert (at[k] >= 0) == _expected_decided(run, event_time), run
        if at[k] < 0:
            continue
        assert starts[k] <= at[k] < ends[k]
        decided += len(run) > 1
        one = rows[at[k]]
        ops, orderings, nulls = ([v[i] for v in run] for i in range(3))
        for state in stored:
            for policy in DeletePolicy:
                whole = resolve_key(ops, orderings, nulls, event_time=event_time,
                                    policy=policy, stored=state)
                alone = resolve_key([one[0]], [one[1]], [one[2]], event_time=event_time,
                                    policy=policy, stored=state)
                case = (run, state, policy, int(at[k] - starts[k]))
                assert _same_state(whole.state, alone.state, event_time), case
                assert whole.winner == (at[k] - starts[k] if alone.winner == 0 else -1), case
                if whole.winner >= 0 and event_time:
                    assert _same(whole.ordering, alone.ordering), case
    assert decided > (150 if not event_time else 40)  # keys with several versions decided


def test_deciding_rows_take_no_ordering_without_event_time() -> None:
    # runs: U D D | D D | U | D U  -> the first delete after the last upsert, or the last upsert
    deletes = np.array([UPSERT, DELETE, DELETE, DELETE, DELETE, UPSERT, DELETE, UPSERT])
    starts, ends = np.array([0, 3, 5, 6]), np.array([3, 5, 6, 8])
    assert deciding_rows(starts, ends, deletes, None, None,
                         event_time=False).tolist() == [1, 3, 5, 7]
    assert deciding_rows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool),
                         None, None, event_time=False).tolist() == []


def test_resolve_key_nan_ordering_is_greatest_as_java_double_compare_to() -> None:
    """A NaN ordering value is greater than every number and ties with NaN (Java's
    ``Double.compareTo``, which ``DefaultHoodieRecordPayload`` compares with, and the order
    :func:`engine.merge.policy.ordering_sort_key` gives the readers' merge and the in-batch
    combine)."""
    nan = float("nan")
    live = KeyState(LIVE, nan)
    for policy in DeletePolicy:
        assert resolve_key([UPSERT, UPSERT], [nan, 5.0], [False, False], event_time=True,
                           policy=policy).winner == 0  # 5 loses to the NaN before it
        assert resolve_key([UPSERT], [5.0], [False], event_time=True, policy=policy,
                           stored=live).winner == -1
        assert resolve_key([DELETE], [5.0], [False], event_time=True, policy=policy,
                           stored=live).winner == -1
        assert resolve_key([UPSERT, UPSERT], [nan, nan], [False, False], event_time=True,
                           policy=policy, stored=live).winner == 1  # a tie: the later
        assert resolve_key([UPSERT], [nan], [False], event_time=True, policy=policy,
                           stored=KeyState(LIVE, 5.0)).winner == 0
    incoming = pa.array([5.0, nan, nan, 5.0, None, 4.0], pa.float64())
    stored = pa.array([nan, 5.0, nan, None, nan, 5.0], pa.float64())
    assert loses_to_stored(incoming, stored).to_pylist() == [True, False, False, False,
                                                              False, True]


@pytest.mark.parametrize("domain", ["int64", "float64", "float64_zeros", "string"])
def test_resolve_combines_keys_without_tombstones_as_resolve_key(domain: str) -> None:
    """engine/merge/resolve.resolve takes a key without tombstones through the in-batch
    combine (the readers' merge rule) and a key with one through resolve_key: both must pick
    the version resolve_key picks (every version competing, nothing stored to lose to)."""
    arrow_type, values = _DOMAINS[domain]
    rng = random.Random(domain)
    rows: list[tuple[str, bool, Any]] = []
    for k in range(300):
        for _ in range(rng.choice([1, 2, 3, 6])):
            rows.append((f"k{k}", rng.random() < 0.2, rng.choice(values)))
    rng.shuffle(rows)
    columns = VersionColumns(op="op", delete=1, ordering="o", ordering_null="n")
    table = pa.table({RECORD_KEY: [r[0] for r in rows], "op": [int(r[1]) for r in rows],
                      "o": pa.array([r[2] for r in rows], arrow_type),
                      "n": [False] * len(rows), "i": list(range(len(rows)))})
    out = resolve(table, columns=columns, event_time=True, policy=DeletePolicy.REMEMBERED)
    got = {k: i for part in (out.upserts, out.deletes)
           for k, i in zip(part.column(RECORD_KEY).to_pylist(), part.column("i").to_pylist(),
                           strict=True)}
    by_key: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_key.setdefault(r[0], []).append(i)
    for key, idx in by_key.items():
        want = resolve_key([rows[i][1] for i in idx], [rows[i][2] for i in idx],
                           [False] * len(idx), event_time=True,
                           policy=DeletePolicy.REMEMBERED, stored=KeyState(LIVE, None))
        assert got[key] == idx[want.winner], [rows[i] for i in idx]


# --- floating ordering values: Java's order (-0.0 < 0.0, NaN the greatest) ---------------------

_FLOATS = [-math.inf, -1.0, -0.0, 0.0, 1.0, math.inf, float("nan"), None]
"""Ordering values whose order Java's ``Double.compareTo`` fixes and Python's ``<`` does not
(-0.0 < 0.0; NaN above +inf, equal to NaN), and null."""


@pytest.mark.parametrize("arrow_type", [pa.float64(), pa.float32()], ids=str)
def test_loses_to_stored_and_resolve_key_order_signed_zeros_and_nan_as_java(
        arrow_type: pa.DataType) -> None:
    """Every pair of :data:`_FLOATS`: a version loses exactly where Java's ``compareTo`` puts
    it below the stored one (null never loses, nothing loses to null), column-wise
    (``loses_to_stored``, ``resolve_single``) and key by key (``resolve_key``)."""
    pairs = [(a, b) for a in _FLOATS for b in _FLOATS]
    want = [a is not None and b is not None and java_compare(a, b) < 0 for a, b in pairs]
    incoming = pa.array([a for a, _ in pairs], arrow_type)
    stored = pa.array([b for _, b in pairs], arrow_type)
    assert loses_to_stored(incoming, stored).to_pylist() == want
    assert loses_to_stored(pa.chunked_array([incoming]), pa.chunked_array([stored])) \
        .to_pylist() == want
    for policy in DeletePolicy:
        single = resolve_single(np.zeros(len(pairs), bool), incoming, np.zeros(len(pairs), bool),
                                np.full(len(pairs), KIND_CODES[LIVE], np.int8), stored,
                                event_time=True, policy=policy)
        assert (~single.winner).tolist() == want
        for (a, b), lose in zip(pairs, want, strict=True):
            for op in (UPSERT, DELETE):  # an ordered delete competes like a version
                out = resolve_key([op], [a], [a is None], event_time=True, policy=policy,
                                  stored=KeyState(LIVE, b))
                if a is not None:
                    assert (out.winner == -1) == lose, (op, a, b)


def test_resolve_key_zero_after_negative_zero_wins_and_not_the_reverse() -> None:
    """The case Java and hudi-rs read apart from a tie: stored 0.0, then -0.0: the stored
    version stays; stored -0.0, then 0.0: the new one wins; in one batch likewise."""
    for policy in DeletePolicy:
        assert resolve_key([UPSERT], [-0.0], [False], event_time=True, policy=policy,
                           stored=KeyState(LIVE, 0.0)).winner == -1
        assert resolve_key([UPSERT], [0.0], [False], event_time=True, policy=policy,
                           stored=KeyState(LIVE, -0.0)).winner == 0
        out = resolve_key([UPSERT, UPSERT], [0.0, -0.0], [False, False], event_time=True,
                          policy=policy)
        assert out.winner == 0 and math.copysign(1.0, out.state.ordering) == 1.0
        assert resolve_key([UPSERT, UPSERT], [-0.0, 0.0], [False, False], event_time=True,
                           policy=policy).winner == 1
        # a delete at -0.0 leaves a version at 0.0; one at 0.0 deletes a version at -0.0
        assert resolve_key([DELETE], [-0.0], [False], event_time=True, policy=policy,
                           stored=KeyState(LIVE, 0.0)).winner == -1
        assert resolve_key([DELETE], [0.0], [False], event_time=True, policy=policy,
                           stored=KeyState(LIVE, -0.0)).winner == 0


@pytest.mark.parametrize("arrow_type", [pa.float64(), pa.float32()], ids=str)
def test_deciding_rows_pick_the_greatest_in_java_order(arrow_type: pa.DataType) -> None:
    """Runs of upserts over every ordered pair and triple of non-null :data:`_FLOATS`: the
    deciding row is the last of the greatest by Java's ``compareTo`` (an oracle written
    without the engine's code)."""
    values = [v for v in _FLOATS if v is not None]
    runs = [[a, b] for a in values for b in values]
    runs += [[a, b, c] for a in (-0.0, 0.0, float("nan")) for b in values
             for c in (0.0, -0.0)]
    rows = [v for run in runs for v in run]
    sizes = np.array([len(run) for run in runs], dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    at = deciding_rows(starts, ends, np.zeros(len(rows), bool), pa.array(rows, arrow_type),
                       np.zeros(len(rows), bool), event_time=True)
    for k, run in enumerate(runs):
        best = 0
        for i, v in enumerate(run):
            if java_compare(v, run[best]) >= 0:
                best = i
        assert at[k] - starts[k] == best, run
