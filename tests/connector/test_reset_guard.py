"""ResetGuard on exact block ids: after a reset, a request that hits a block not filled since
is tainted, its blocks stop being fresh, and the taint spreads through later hits on them."""

from kvoffload.connector.group_keys import NULL_BLOCK_ID
from kvoffload.connector.reset_guard import ResetGuard


def test_inactive_before_any_reset():
    g = ResetGuard()
    assert not g.admit("a", [[1, 2, 3]], 2) and not g.tainted("a")


def test_taint_follows_the_blocks_filled_from_stale_kv():
    g = ResetGuard()
    g.reset(["running"])  # tracked at the reset: its KV is older
    assert g.tainted("running")
    assert not g.admit("fresh", [[10, 11, 12]], 0)  # computes everything itself
    assert not g.admit("reuser", [[10, 11, 20]], 2)  # hits 10, 11: filled since the reset
    assert g.admit("stale", [[5, 6, 21, 22]], 2)  # hits 5, 6: device blocks from before the reset
    assert g.admit("heir", [[21, 30]], 1)  # hits 21, which the stale request filled
    g.filled("reuser", [40])  # a running request's new block
    assert not g.admit("late", [[10, 40, NULL_BLOCK_ID, 41]], 3)  # null ids (released windows) are no hits
    g.filled("stale", [10])  # a fresh block handed to a tainted request is fresh no more
    assert g.admit("after", [[10]], 1)
    g.forget("stale")
    assert not g.tainted("stale")
    g.reset([])  # a second reset: nothing is fresh again
    assert g.admit("reuser2", [[10, 11]], 2)
