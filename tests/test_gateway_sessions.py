"""The gateway's conversation ledger (``gateway_sessions.Conversations``): against a model kept
the obvious way, for any sequence of turns and clock steps, and the edges by name."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.integrations.gateway_sessions import Conversations


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


turns = st.lists(st.tuples(st.integers(0, 5), st.sampled_from([1, 2, 3]), st.sampled_from([0.0, 0.5, 4.0, 11.0])),
                 max_size=60)


@settings(max_examples=200, deadline=None)
@given(turns=turns, cap=st.integers(1, 4))
def test_live_counts_and_least_loaded_match_a_model(turns, cap):
    clock = Clock()
    convs = Conversations([1, 2, 3], max_sessions=cap, idle_s=10.0, clock=clock)
    last: dict[str, tuple[int, float]] = {}  # the model: every turn, in order
    for s, worker, dt in turns:
        clock.now += dt
        session = f"c{s}"
        convs.record(session, worker)
        last.pop(session, None)
        last[session] = (worker, clock.now)
        while len(last) > cap:  # the least recent forgotten
            last.pop(next(iter(last)))
        live = {w: sum(1 for (ww, t) in last.values() if ww == w and clock.now - t < 10.0) for w in (1, 2, 3)}
        assert convs.live() == live
        assert convs.home(session) == worker
        for probe in ("c0", "c5", session):
            mine = last.get(probe)
            others = {w: n - (1 if mine and mine[0] == w and clock.now - mine[1] < 10.0 else 0)
                      for w, n in live.items()}
            low = min(others.values())
            assert convs.least_loaded(probe) == [w for w in (1, 2, 3) if others[w] == low]


def test_a_conversation_past_the_idle_time_no_longer_counts_but_keeps_its_home():
    clock = Clock()
    convs = Conversations([1, 2], max_sessions=10, idle_s=5.0, clock=clock)
    convs.record("a", 1)
    assert convs.least_loaded("b") == [2]
    assert convs.least_loaded("a") == [1, 2]  # its own turn does not count against it
    clock.now = 5.0
    assert convs.live() == {1: 0, 2: 0} and convs.home("a") == 1
    assert convs.least_loaded("b") == [1, 2]
    convs.record("a", 2)  # it returns, to the other replica
    assert convs.live() == {1: 0, 2: 1}


@pytest.mark.parametrize("idle", [0.0, -1.0, float("nan")])
def test_a_bad_idle_time_is_refused_naming_it(idle):
    with pytest.raises(ValueError, match=r"--session-idle .*give seconds > 0"):
        Conversations([1, 2], max_sessions=10, idle_s=idle)
