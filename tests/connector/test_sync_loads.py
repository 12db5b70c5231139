"""Synchronous (layer-wise) loads through the engine scheduler and both connector halves: the
request runs in the step that loads it, a failed load is recomputed from its first unfilled
block with that step's stores dropped, and aborts or preemption at any phase leak nothing."""

from __future__ import annotations

import pytest

from kvoffload.engine.request import RequestStatus
from tests.connector.harness import FakeHandler, Harness
from tests.connector.test_scheduler_half import fill_cpu_tier_with
from tests.engine.helpers import make_request
from tests.regressions.test_abort_reports import PROMPT
from tests.regressions.test_abort_reports import assert_clean as assert_clean_after

#: x computes its prompt's fourth block in the step that loads the first three and stores it:
#: the request after it finds the whole prompt (an asynchronous hit of all but its last token).
WHOLE_PROMPT = len(PROMPT) + 3


@pytest.fixture(autouse=True, params=["report-only", "layer-progress"])
def progress(request, monkeypatch) -> bool:
    """Both ways a worker learns a synchronous load's outcome: from its report after the step
    (the step's stores then wait for it, whole), or from its progress record at the step's end
    (the step's stores ran layer by layer, and are committed or aborted there)."""
    monkeypatch.setattr(FakeHandler, "progress", request.param == "layer-progress")
    return bool(FakeHandler.progress)


def assert_clean(h: Harness, free: int, cached: int = WHOLE_PROMPT) -> None:
    assert_clean_after(h, free, cached)


def loaded(**kw) -> tuple[Harness, int]:
    h = Harness(num_blocks=40, tier_blocks=16, load_mode="layerwise", **kw)
    fill_cpu_tier_with(h, PROMPT)
    h.sched.kv_cache_manager.reset_prefix_cache()
    return h, h.free_blocks


def start(h: Harness, rid: str = "x", max_tokens: int = 2):
    req = make_request(rid, len(PROMPT) + 4, max_tokens=max_tokens)
    h.sched.add_request(req)
    so = h.step()
    return req, so


def test_the_request_runs_in_the_step_that_loads_it():
    h, free = loaded()
    req, so = start(h)
    meta = so.kv_connector_metadata
    assert meta.sync_loads == {"x"} and list(meta.reqs_to_load) == ["x"]
    (load,) = meta.reqs_to_load["x"]
    assert so.num_scheduled_tokens == {"x": 4}  # the 12 loaded tokens are not computed
    assert req.status == RequestStatus.RUNNING and req.num_cached_tokens == 12
    assert [load.job_id] in h.handler.waited  # finished inside the step (its first layer waited for it)
    assert req.output_token_ids == [7]  # its first token in that very step
    cs = h.sched_conn.connector_scheduler
    assert cs.stats.load_decisions == {("cpu", "layerwise"): 1}
    assert cs.stats.tier_hits["cpu"] == 12
    # The step's timing came back with its 3 layer-wise blocks: what it lost to them is measured.
    assert cs.cost.sync_stall.samples == 1
    assert_clean(h, free)
    assert req.output_token_ids == [7, 7]


def test_async_mode_waits_a_step_as_before():
    h = Harness(num_blocks=40, tier_blocks=16, load_mode="async")
    fill_cpu_tier_with(h, PROMPT)
    h.sched.kv_cache_manager.reset_prefix_cache()
    req, so = start(h)
    assert so.kv_connector_metadata.sync_loads == set()
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and so.num_scheduled_tokens == {}
    h.run_until_idle()
    assert h.sched_conn.connector_scheduler.cost.sync_stall.samples == 0  # no step carried a load


def test_a_failed_load_recomputes_from_the_first_unfilled_block_and_stores_nothing_of_that_step(progress):
    h, free = loaded()
    h.handler.wait_success = False
    stores_before = len(h.handler.jobs("store"))
    req, so = start(h)
    assert req.output_token_ids == [] and req.num_computed_tokens == 0  # block 0 was never filled
    assert h.sched.stats.failed_loads == 1
    (planned,) = so.kv_connector_metadata.reqs_to_store["x"]
    h.handler.wait_success = True
    cs = h.sched_conn.connector_scheduler
    h.step()
    # The block the step computed on top of the unfilled ones was planned for storing: dropped
    # (never submitted; or, copied layer by layer during the step, aborted at its end).
    assert cs.stats.failed_store_blocks == 1
    if progress:
        assert h.handler.jobs("store")[stores_before:] == [planned.job_id]
        assert ([planned.job_id], False) in h.handler.verdicts
    else:
        assert len(h.handler.jobs("store")) == stores_before
    assert req.num_cached_tokens == 12 and req.output_token_ids == [7]  # recomputed in full
    assert_clean(h, free, cached=12)  # its fourth block was never stored
    assert req.output_token_ids == [7, 7]


def test_abort_in_the_step_that_loads_it():
    h, free = loaded()
    req = make_request("x", len(PROMPT) + 4, max_tokens=2)
    h.sched.add_request(req)
    h.step(abort_before_update=["x"])  # the client leaves while its load runs in the forward pass
    assert_clean(h, free)


def test_abort_of_a_request_whose_sync_load_failed_in_that_step():
    h, free = loaded()
    h.handler.wait_success = False
    req = make_request("x", len(PROMPT) + 4, max_tokens=2)
    h.sched.add_request(req)
    h.step(abort_before_update=["x"])
    h.handler.wait_success = True
    assert_clean(h, free, cached=12)  # the block computed on the unfilled ones was not stored


def test_abort_the_step_after():
    h, free = loaded()
    start(h, max_tokens=8)
    h.sched.abort_request("x")
    assert_clean(h, free)


def test_preemption_after_a_sync_load_and_resume():
    h, free = loaded()
    req, _ = start(h, max_tokens=4)
    h.sched.running.remove(req)
    h.sched._preempt(req)
    assert req.status == RequestStatus.PREEMPTED
    h.run_until_idle()
    assert req.output_token_ids == [7, 7, 7, 7]
    assert_clean(h, free)
