from kvoffload.engine.request import RequestStatus
from tests.engine.helpers import fake_run, make_request, make_scheduler


def test_long_prompt_chunked_under_threshold():
    sched = make_scheduler(budget=64, threshold=10)
    req = make_request("a", 25)
    sched.add_request(req)
    chunks = []
    for _ in range(3):
        so = sched.schedule()
        chunks.append(so.num_scheduled_tokens["a"])
        fake_run(sched, so)
    assert chunks == [10, 10, 5]
    assert req.output_token_ids == [7]  # only the last chunk samples
    assert [r.req_id for r in so.scheduled_new_reqs] == []
    assert req.num_computed_tokens == 25


def test_decode_and_prefill_share_one_budget():
    sched = make_scheduler(budget=10)
    a = make_request("a", 6)
    sched.add_request(a)
    fake_run(sched, sched.schedule())  # a prefills 6 tokens
    sched.add_request(make_request("b", 20, start=100))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "b": 9}
    assert so.total_num_scheduled_tokens == 10
    assert [r.req_id for r in so.scheduled_new_reqs] == ["b"]
    assert so.scheduled_cached_reqs.req_ids == ["a"]
    assert so.scheduled_new_reqs[0].block_ids == ([3, 4, 5],)


def test_cached_requests_carry_only_block_diff():
    sched = make_scheduler(budget=64, block_size=4)
    sched.add_request(make_request("a", 8, max_tokens=6))
    so = sched.schedule()
    assert so.scheduled_new_reqs[0].block_ids == ([1, 2],)
    fake_run(sched, so)
    so = sched.schedule()  # token 9 needs a third block
    assert so.scheduled_cached_reqs.new_block_ids == [([3],)]
    assert so.scheduled_cached_reqs.num_computed_tokens == [8]
    fake_run(sched, so)
    so = sched.schedule()
    assert so.scheduled_cached_reqs.new_block_ids == [None]  # no new block: None, as vLLM sends it


def run_preemption(policy: str):
    # 9 usable blocks of 4 tokens; three requests of 10 tokens growing until preemption.
    sched = make_scheduler(num_blocks=10, block_size=4, budget=64, policy=policy)
    reqs = [make_request(r, 10, max_tokens=8, priority=p, start=i * 50, arrival=float(i))
            for i, (r, p) in enumerate([("a", 0), ("b", 5), ("c", 1)])]
    for r in reqs:
        sched.add_request(r)
    so = sched.schedule()
    assert set(so.num_scheduled_tokens) == {"a", "b", "c"}
    fake_run(sched, so)
    preempted_step = None
    for step in range(40):
        so = sched.schedule()
        if so.preempted_req_ids and preempted_step is None:
            preempted_step = so
        fake_run(sched, so)
        if not sched.has_unfinished_requests():
            break
    assert not sched.has_unfinished_requests()
    assert all(len(r.output_token_ids) == 8 and r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in reqs)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 9
    return preempted_step, reqs


def test_fcfs_preempts_newest_running_and_it_completes():
    so, reqs = run_preemption("fcfs")
    assert so.preempted_req_ids == {"c"}
    assert reqs[2].num_preemptions >= 1


def test_priority_preempts_worst_priority():
    so, reqs = run_preemption("priority")
    assert so.preempted_req_ids == {"b"}  # priority 5 is the worst (larger = later)
    assert reqs[1].num_preemptions >= 1


def test_no_waiting_admission_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=7, block_size=4, budget=64)
    sched.add_request(make_request("a", 12, max_tokens=20))
    sched.add_request(make_request("b", 11, max_tokens=20, start=50))
    fake_run(sched, sched.schedule())  # a: 3 blocks, b: 3 blocks → all 6 usable blocks taken
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    sched.add_request(make_request("c", 2, start=200))
    so = sched.schedule()  # a needs a 4th block → b preempted, freeing 3 blocks
    assert so.preempted_req_ids == {"b"}
    assert so.num_scheduled_tokens == {"a": 1}
    assert so.scheduled_new_reqs == []
    assert [r.request_id for r in sched.waiting] == ["b", "c"]


def test_preempted_request_restarts_from_zero_at_front():
    sched = make_scheduler(num_blocks=5, block_size=4, budget=64)
    a, b = make_request("a", 8, max_tokens=10), make_request("b", 7, max_tokens=10, start=40)
    sched.add_request(a)
    sched.add_request(b)
    fake_run(sched, sched.schedule())
    so = sched.schedule()  # a needs a third block: b preempted
    assert so.preempted_req_ids == {"b"}
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sched.waiting[0] is b


def test_max_num_seqs_caps_running():
    sched = make_scheduler(max_seqs=2)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", 4, start=i * 10))
    so = sched.schedule()
    assert set(so.num_scheduled_tokens) == {"r0", "r1"}


def test_prefix_hit_capped_below_num_tokens():
    sched = make_scheduler(block_size=4)
    sched.add_request(make_request("a", 8, max_tokens=1))
    fake_run(sched, sched.schedule())
    assert not sched.has_unfinished_requests()
    sched.add_request(make_request("b", 8, max_tokens=1))
    so = sched.schedule()
    # 8 tokens = 2 full cached blocks, but the last token is recomputed → hit 4 tokens.
    assert so.scheduled_new_reqs[0].num_computed_tokens == 4
    assert so.num_scheduled_tokens["b"] == 4
    assert sched.stats.device_hit_tokens == 4
