"""Aborts at every phase of a request's offload life: the connector reports each request at
most once, the engine frees every block, the tier releases every pin, and the engine serves on.

The bundled engine asserts, as vLLM's scheduler does, that every request the connector reports
is still known: a second report (finished-receiving, then finished-sending) is what killed
vLLM's EngineCore when a client disconnected during the step that finished its load.
"""

import pytest

from kvoffload.engine.request import RequestStatus
from tests.connector.harness import Harness
from tests.connector.test_scheduler_half import fill_cpu_tier_with
from tests.engine.helpers import make_request

PROMPT = list(range(12))  # three 4-token blocks


def loaded_harness(**kw) -> tuple[Harness, int]:
    """A harness whose CPU tier holds PROMPT's blocks and whose device cache does not."""
    h = Harness(num_blocks=40, tier_blocks=16, **kw)
    fill_cpu_tier_with(h, PROMPT)
    h.sched.kv_cache_manager.reset_prefix_cache()
    return h, h.free_blocks


def start_load(h: Harness, rid: str = "x"):
    req = make_request(rid, len(PROMPT) + 4, max_tokens=2)
    h.sched.add_request(req)
    h.step()
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert len(h.handler.jobs("load")) >= 1
    return req


def assert_clean(h: Harness, free_before: int, cached: int = 12) -> None:
    """Nothing leaked: device blocks, connector records, tier pins; and the engine serves on
    (``cached``: the prompt tokens the tier then serves it)."""
    h.run_until_idle()
    cs = h.sched_conn.connector_scheduler
    assert h.sched.requests == {}
    assert cs.records.requests == {} and cs.records.jobs == {} and cs.records.blocks_being_loaded == set()
    host = h.manager.report().tiers[0]
    assert (host.pinned_blocks, host.writing_blocks) == (0, 0)
    worker = h.worker_conn.connector_worker
    assert not worker._requests  # no copy in flight, no report owed
    h.sched.kv_cache_manager.reset_prefix_cache()
    assert h.free_blocks == free_before
    after = make_request("after", len(PROMPT) + 4, max_tokens=2)
    h.sched.add_request(after)
    h.run_until_idle()
    assert after.output_token_ids == [7, 7] and after.num_cached_tokens == cached  # still served from the tier


def test_abort_during_the_step_that_finishes_the_load():
    h, free = loaded_harness()
    start_load(h)
    h.handler.complete(h.handler.jobs("load"))  # the load lands while the step runs ...
    h.step(abort_before_update=["x"])  # ... and the client disconnects before its report is read
    assert_clean(h, free)


def test_abort_while_the_load_is_in_flight():
    h, free = loaded_harness()
    start_load(h)
    h.sched.abort_request("x")
    h.step()
    h.step()  # the load is still running: the blocks it writes stay allocated
    assert "x" in h.sched.requests
    assert_clean(h, free)


def test_abort_after_the_load_was_reported():
    h, free = loaded_harness()
    start_load(h)
    h.handler.complete(h.handler.jobs("load"))
    h.sched.max_num_seqs = 0  # the landed request is not resumed this step
    h.step()
    assert "x" in h.sched.remote_loads.finished
    h.sched.abort_request("x")
    h.sched.max_num_seqs = 8
    assert_clean(h, free)


@pytest.mark.parametrize("abort_in_step", [True, False], ids=["same-step", "later"])
def test_abort_of_a_request_whose_load_failed(abort_in_step):
    h, free = loaded_harness()
    start_load(h)
    h.handler.complete(h.handler.jobs("load"), success=False)
    if abort_in_step:
        h.step(abort_before_update=["x"])
    else:
        h.sched.abort_request("x")
        h.step()
    assert_clean(h, free)


def test_abort_while_stores_are_in_flight():
    h, free = loaded_harness()
    req = make_request("s", 16, max_tokens=8, start=300)
    h.sched.add_request(req)
    h.step()
    h.step()  # the first step's stores are submitted now, and stay in flight
    assert h.handler.pending
    h.sched.abort_request("s")
    h.step()
    assert "s" in h.sched.requests  # the stores still read its blocks
    assert_clean(h, free)


def test_abort_of_a_preempted_request():
    h, free = loaded_harness()
    h.sched.add_request(make_request("p", 8, max_tokens=4, start=300))
    h.step()
    h.step()
    victim = h.sched.running[0]
    h.sched._preempt(victim)
    h.sched.running.remove(victim)
    h.sched.abort_request(victim.request_id)
    assert_clean(h, free)


def test_aborts_while_loading_never_block_admission():
    """Aborted loads used to keep counting against max_num_seqs: after max_num_seqs of them
    the engine admitted nothing, ever."""
    h, free = loaded_harness(max_seqs=2)
    for i in range(4):
        start_load(h, f"x{i}")
        h.sched.abort_request(f"x{i}")
        h.handler.complete(h.handler.jobs("load")[-1:])
        h.step()
    assert_clean(h, free)
