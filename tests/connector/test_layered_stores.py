"""Layer-wise stores through the engine scheduler and both connector halves: a step's stores
start in that step, layer by layer, in either hook order (vLLM starts a step without
synchronous loads after its forward pass); ``async`` and handlers that copy only whole keep
the store after the step; aborts and preemption with a layered store in flight leak nothing."""

from __future__ import annotations

import pytest

from tests.connector.harness import LAYERS, Harness
from tests.engine.helpers import make_request
from tests.regressions.test_abort_reports import assert_clean

PROMPT_TOKENS = 16  # four 4-token blocks: the first step computes three full ones and stores them


def first_step(h: Harness, rid: str = "a", max_tokens: int = 2):
    req = make_request(rid, PROMPT_TOKENS, max_tokens=max_tokens)
    h.sched.add_request(req)
    so = h.step()
    jobs = [job.job_id for job in so.kv_connector_metadata.reqs_to_store.get(rid, [])]
    return req, so, jobs


@pytest.mark.parametrize("vllm_order", [False, True], ids=["bundled-order", "vllm-order"])
@pytest.mark.parametrize("mode", ["auto", "layerwise"])
def test_a_steps_stores_start_in_that_step_layer_by_layer(mode, vllm_order):
    h = Harness(num_blocks=40, tier_blocks=16, load_mode=mode, vllm_order=vllm_order)
    free = h.free_blocks
    _, _, jobs = first_step(h)
    assert jobs, "the prefill step planned a store"
    assert h.handler.jobs("store") == jobs  # opened in the step that computed the blocks, once
    assert h.handler.layers_written == list(range(len(LAYERS)))
    assert h.handler.verdicts[-1] == (jobs, True)
    h.handler.complete(jobs)
    h.step()
    assert h.handler.jobs("store") == jobs  # start_load_kv did not submit them a second time
    assert_clean(h, free, cached=15)


def test_async_mode_stores_after_the_step_as_before():
    h = Harness(num_blocks=40, tier_blocks=16, load_mode="async")
    _, _, jobs = first_step(h)
    assert h.handler.jobs("store") == [] and h.handler.layers_written == [] and h.handler.verdicts == []
    h.step()
    assert h.handler.jobs("store") == jobs


def test_a_handler_that_copies_only_whole_gets_the_store_after_the_step():
    h = Harness(num_blocks=40, tier_blocks=16, load_mode="auto")
    h.handler.layered = False
    _, _, jobs = first_step(h)
    assert h.handler.jobs("store") == [] and h.handler.verdicts == [([], True)]
    h.step()
    assert h.handler.jobs("store") == jobs


@pytest.mark.parametrize("vllm_order", [False, True], ids=["bundled-order", "vllm-order"])
def test_abort_with_a_layered_store_in_flight(vllm_order):
    h = Harness(num_blocks=40, tier_blocks=16, load_mode="auto", vllm_order=vllm_order)
    free = h.free_blocks
    req = make_request("a", PROMPT_TOKENS, max_tokens=4)
    h.sched.add_request(req)
    h.step(abort_before_update=["a"])  # the client leaves while its store is copying out
    (job,) = h.handler.jobs("store")
    assert job in h.handler.pending  # still copying: the request's blocks stay held
    h.step()
    h.handler.complete([job])
    assert_clean(h, free, cached=15)


@pytest.mark.parametrize("vllm_order", [False, True], ids=["bundled-order", "vllm-order"])
def test_preemption_waits_for_the_layered_store_reading_the_preempted_blocks(vllm_order):
    h = Harness(num_blocks=7, block_size=4, tier_blocks=16, budget=64, load_mode="auto", vllm_order=vllm_order)
    a = make_request("a", 12, max_tokens=6)
    b = make_request("b", 11, max_tokens=6, start=50)
    h.sched.add_request(a)
    h.sched.add_request(b)
    so = h.step()  # both prefill; their stores copy out layer by layer in this very step
    b_jobs = [job.job_id for job in so.kv_connector_metadata.reqs_to_store["b"]]
    assert b_jobs and set(b_jobs) <= set(h.handler.pending) and h.handler.verdicts[-1][1]
    so = h.step()  # a needs a 4th block: b is preempted, its blocks go to a
    assert so.preempted_req_ids == {"b"}
    assert set(b_jobs) <= set(h.handler.waited[0])  # waited for before this step's forward
    assert not (set(b_jobs) & set(h.handler.pending))
    h.run_until_idle()
    assert a.output_token_ids == [7] * 6 and b.output_token_ids == [7] * 6


def test_a_store_that_fails_after_its_layers_were_copied_is_dropped_and_recomputed_later():
    h = Harness(num_blocks=40, tier_blocks=16, load_mode="auto")
    free = h.free_blocks
    _, _, jobs = first_step(h)
    h.handler.complete(jobs, success=False)  # e.g. its last layer's copy failed
    cs = h.sched_conn.connector_scheduler
    h.step()
    assert cs.stats.failed_store_blocks == 4  # blocks
    h.run_until_idle()
    h.sched.kv_cache_manager.reset_prefix_cache()
    again = make_request("again", PROMPT_TOKENS, max_tokens=1)
    h.sched.add_request(again)
    h.run_until_idle()
    assert again.num_cached_tokens == 0  # nothing was published from the failed store
    assert_clean(h, free, cached=15)  # again's own store made the prompt available


def test_a_sync_load_refused_at_submission_aborts_the_stores_of_its_step():
    from tests.connector.test_sync_loads import PROMPT, fill_cpu_tier_with

    h = Harness(num_blocks=40, tier_blocks=16, load_mode="layerwise")
    fill_cpu_tier_with(h, PROMPT)
    h.sched.kv_cache_manager.reset_prefix_cache()
    free = h.free_blocks
    h.handler.refuse_loads = True
    req = make_request("x", len(PROMPT) + 4, max_tokens=2)
    h.sched.add_request(req)
    so = h.step()
    assert so.kv_connector_metadata.sync_loads == {"x"}
    (planned,) = so.kv_connector_metadata.reqs_to_store["x"]
    assert h.handler.verdicts[-1] == ([planned.job_id], False)  # copied out during the step, never published
    assert req.output_token_ids == [] and req.num_computed_tokens == 0  # rolled back: recomputed from block 0
    h.handler.refuse_loads = False
    assert_clean(h, free, cached=12)
