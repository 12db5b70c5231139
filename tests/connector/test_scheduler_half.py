"""Scenario tests of the offloading connector's scheduler half, with a recording fake worker."""

from kvoffload.engine.request import RequestStatus
from tests.connector.harness import Harness
from tests.engine.helpers import make_request


def stores(h):
    return [(src, dst) for _, kind, src, dst in h.handler.submitted if kind == "store"]


def test_store_cursor_offers_each_full_block_once_and_stores_are_deferred():
    h = Harness()
    h.sched.long_prefill_token_threshold = 4
    req = make_request("a", 10, max_tokens=3)
    h.sched.add_request(req)
    so = h.step()  # tokens 0-3 → block 0 (device block 1) is planned, not yet submitted
    assert {r: [(j.src.block_ids.tolist(), j.dst.block_ids.tolist()) for j in js]
            for r, js in so.kv_connector_metadata.reqs_to_store.items()} == {"a": [([1], [0])]}
    assert stores(h) == []
    so = h.step()  # block 1 planned; block 0's store submitted at this step's start
    assert stores(h) == [([1], [0])]
    assert [j.src.block_ids.tolist() for j in so.kv_connector_metadata.reqs_to_store["a"]] == [[2]]
    so = h.step()  # tokens 8-9: no new full block
    assert so.kv_connector_metadata.reqs_to_store == {}
    assert stores(h) == [([1], [0]), ([2], [1])]
    h.handler.complete(h.handler.jobs("store"))
    h.step()
    assert h.manager.lookup(req.block_hashes[:2]) == 2


def test_store_retried_after_none():
    h = Harness(tier_blocks=2)
    a = make_request("a", 8, max_tokens=5)
    h.sched.add_request(a)
    h.step()  # a's two blocks fill the tier (being written: not evictable)
    b = make_request("b", 4, max_tokens=5, start=100)
    h.sched.add_request(b)
    so = h.step()
    assert "b" not in so.kv_connector_metadata.reqs_to_store
    assert h.sched_conn.connector_scheduler.stats.store_retries >= 1
    h.handler.complete(h.handler.jobs("store"))
    h.step()  # a's stores land, become evictable
    so = h.step()  # b's block is offered again (cursor did not advance) and now fits
    planned = [s for o in h.outputs[-2:] for s in o.kv_connector_metadata.reqs_to_store.get("b", [])]
    assert len(planned) == 1


def fill_cpu_tier_with(h, tokens, rid="a"):
    req = make_request(rid, len(tokens), max_tokens=1)
    req.prompt_token_ids[:] = req.all_token_ids[:] = tokens
    req.block_hashes.clear()
    req.update_block_hashes()
    h.sched.add_request(req)
    h.run_until_idle()
    return req


def test_load_of_misaligned_first_block():
    h = Harness(num_blocks=6, block_size=4, factor=2, tier_blocks=8)
    tokens = list(range(16))
    a = fill_cpu_tier_with(h, tokens)  # offloaded blocks 0, 1 (engine blocks 0-3) stored
    assert h.manager.lookup([a.block_hashes[1], a.block_hashes[3]]) == 2
    fill_cpu_tier_with(h, list(range(500, 516)), rid="c")  # evicts a's device blocks except its first
    b = make_request("b", 20, max_tokens=1)
    h.sched.add_request(b)
    h.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    (_, kind, src, dst) = h.handler.submitted[-1]
    assert kind == "load"
    assert src == [0, 1]  # both offloaded blocks ...
    assert len(dst) == 3  # ... but only engine blocks 1-3: block 0 is a device hit
    h.run_until_idle()
    assert h.sched.stats.device_hit_tokens >= 4  # counted once the load landed
    assert b.num_cached_tokens == 16 and b.output_token_ids == [7]


def test_second_request_deferred_while_first_loads_same_prefix():
    h = Harness(num_blocks=40, tier_blocks=16)
    a = fill_cpu_tier_with(h, list(range(12)))
    h.sched.kv_cache_manager.reset_prefix_cache()
    x = make_request("x", 12, max_tokens=1)
    y = make_request("y", 12, max_tokens=1)
    h.sched.add_request(x)
    h.sched.add_request(y)
    h.step()
    assert x.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert y.status == RequestStatus.WAITING and len(h.handler.jobs("load")) == 1
    assert h.sched_conn.connector_scheduler.stats.lookups_deferred >= 1
    device_hits_before = h.sched.stats.device_hit_tokens
    h.step()  # x's load is still in flight at scheduling time: y deferred again
    assert y.status == RequestStatus.WAITING and len(h.handler.jobs("load")) == 1
    h.handler.complete(h.handler.jobs("load"))
    h.run_until_idle()
    # y reuses the device blocks x loaded (capped below its last token); only the last block,
    # which holds y's last (always recomputed) token, comes from the CPU tier again.
    assert h.sched.stats.device_hit_tokens - device_hits_before == 8
    assert x.num_cached_tokens == 11 and y.num_cached_tokens == 11  # the last token is recomputed
    assert h.handler.submitted[-1][1] == "load" and h.handler.submitted[-1][2] == [2]
    assert a.is_finished


def test_preemption_waits_for_in_flight_store_before_blocks_are_reused():
    h = Harness(num_blocks=7, block_size=4, tier_blocks=16, budget=64)
    a = make_request("a", 12, max_tokens=20)
    b = make_request("b", 11, max_tokens=20, start=50)
    h.sched.add_request(a)
    h.sched.add_request(b)
    h.step()  # both prefill; their stores are planned
    so = h.step()  # stores submitted at start; a needs a 4th block → b preempted
    assert so.preempted_req_ids == {"b"}
    b_jobs = [j for j, k, src, _ in h.handler.submitted if k == "store" and set(src) <= {4, 5, 6}]
    assert b_jobs and h.handler.waited and set(b_jobs) <= set(h.handler.waited[-1])
    assert not (set(b_jobs) & set(h.handler.pending))


def test_request_aborted_during_load_keeps_blocks_until_load_finishes():
    h = Harness(num_blocks=40, tier_blocks=16)
    fill_cpu_tier_with(h, list(range(12)))
    h.sched.kv_cache_manager.reset_prefix_cache()
    free_before = h.free_blocks
    x = make_request("x", 12, max_tokens=1)
    h.sched.add_request(x)
    h.step()
    held = free_before - h.free_blocks
    assert held == 3 and x.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    h.sched.abort_request("x")
    h.step()
    assert h.free_blocks == free_before - held  # the load still writes into them
    h.handler.complete(h.handler.jobs("load"))
    h.step()
    h.step()
    assert h.free_blocks == free_before
    assert "x" not in h.sched.requests


def test_finish_while_storing_keeps_blocks_until_store_lands():
    h = Harness(num_blocks=40, tier_blocks=16)
    a = make_request("a", 8, max_tokens=1)
    h.sched.add_request(a)
    h.step()  # prefill + sample: a finishes; its 2 blocks' store is planned
    assert a.is_finished
    assert h.free_blocks == 39 - 2
    h.step()  # store submitted, not complete
    h.step()
    assert h.free_blocks == 39 - 2
    h.handler.complete(h.handler.jobs("store"))
    h.step()
    assert h.free_blocks == 39
    assert h.manager.lookup(a.block_hashes) == 2


def test_failed_load_is_recomputed_not_served():
    h = Harness(num_blocks=40, tier_blocks=16)
    fill_cpu_tier_with(h, list(range(12)))
    h.sched.kv_cache_manager.reset_prefix_cache()
    x = make_request("x", 12, max_tokens=1)
    h.sched.add_request(x)
    h.step()
    h.handler.complete(h.handler.jobs("load"), success=False)
    h.step()  # failure reported
    so = h.step()
    assert so.num_scheduled_tokens.get("x") in (12, None) or x.num_computed_tokens == 12
    h.run_until_idle()
    assert h.sched.stats.failed_loads == 1
    assert x.output_token_ids == [7]


def test_stores_reading_a_block_handed_out_again_finish_before_the_forward_pass():
    # vLLM starts a step's copies after its forward pass unless the step loads synchronously,
    # so the flush of stores still reading a block handed out again happens in
    # handle_preemptions, which it calls before every forward pass.
    from kvoffload.connector.jobs import JobKind, TransferJob
    from kvoffload.connector.offloading_metadata import OffloadingConnectorMetadata
    from kvoffload.offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec

    h = Harness()
    w = h.worker_conn
    store = TransferJob(41, JobKind.STORE, GPULoadStoreSpec([3]), CPULoadStoreSpec([0]), "r")
    w.bind_connector_metadata(OffloadingConnectorMetadata(reqs_to_store={"r": [store]}))
    w.start_load_kv()  # planned in this step: submitted at the next one
    w.clear_connector_metadata()
    assert h.handler.submitted == []
    w.handle_preemptions(OffloadingConnectorMetadata(flush_jobs={41}))
    assert [s[0] for s in h.handler.submitted] == [41] and h.handler.waited[-1] == [41]
    assert 41 not in h.handler.pending  # done before anything writes block 3
