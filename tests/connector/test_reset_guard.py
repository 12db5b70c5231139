"""ResetGuard on exact block ids: after a reset, a request that hits a block not filled since
is tainted (its record's ``stale_kv``), its blocks stop being fresh, and the taint spreads
through later hits on them."""

from kvoffload.connector.group_keys import NULL_BLOCK_ID
from kvoffload.connector.scheduler.request_state import RequestOffloadState
from kvoffload.connector.scheduler.reset_guard import ResetGuard


def allocated() -> RequestOffloadState:
    return RequestOffloadState(block_ids=[[1]])


def test_inactive_before_any_reset():
    g = ResetGuard()
    a = RequestOffloadState()
    assert not g.admit(a, [[1, 2, 3]], 2) and not a.stale_kv


def test_taint_follows_the_blocks_filled_from_stale_kv():
    g = ResetGuard()
    running, looked_up = allocated(), RequestOffloadState()
    g.reset([running, looked_up])  # allocated at the reset: its KV is older
    assert running.stale_kv and not looked_up.stale_kv  # only looked up: its hits decide
    fresh, reuser, stale, heir = (RequestOffloadState() for _ in range(4))
    assert not g.admit(fresh, [[10, 11, 12]], 0)  # computes everything itself
    assert not g.admit(reuser, [[10, 11, 20]], 2)  # hits 10, 11: filled since the reset
    assert g.admit(stale, [[5, 6, 21, 22]], 2)  # hits 5, 6: device blocks from before the reset
    assert g.admit(heir, [[21, 30]], 1)  # hits 21, which the stale request filled
    g.filled(reuser, [40])  # a running request's new block
    assert not g.admit(RequestOffloadState(), [[10, 40, NULL_BLOCK_ID, 41]], 3)  # null ids are no hits
    g.filled(stale, [10])  # a fresh block handed to a tainted request is fresh no more
    assert g.admit(RequestOffloadState(), [[10]], 1)
    g.filled(None, [10])  # an untracked request's block (a copy-on-write target) is fresh
    assert not g.admit(RequestOffloadState(), [[10]], 1)
    g.reset([])  # a second reset: nothing is fresh again
    assert g.admit(RequestOffloadState(), [[10, 11]], 2)
