"""The write-side rule against stored versions, under both delete policies
(``engine/merge/policy.py``): remembered deletes (the streaming sink and its GLOBAL_STATE index)
and natural deletes (the engine API). Moved here from ``tests/ingest/test_sink.py`` (the rule
moved into the engine), with the natural policy's cases added."""

from __future__ import annotations

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
    resolve_key,
    resolve_single,
)

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
