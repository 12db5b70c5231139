"""Layer-wise hits found in one schedule join its step only while that beats running in the
next one (``StepBatch``): on an engine whose step time is its tokens' (vLLM's CPU backend) the
second hit of a burst loads asynchronously; with a large fixed cost per step (a GPU) several
join. vLLM on a 2-core CPU ran a burst of five returning turns as one 233 ms step, all five
waiting for it, where asynchronous loads had the first out at 60 ms and the other four at 210."""

from __future__ import annotations

from kvoffload.connector.cost.cost_fit import PrefillRate
from kvoffload.connector.cost.step_batch import StepBatch
from kvoffload.engine.request import RequestStatus
from tests.connector.harness import Harness
from tests.connector.test_scheduler_half import fill_cpu_tier_with
from tests.engine.helpers import make_request


def engine(fixed_s: float, per_token_s: float) -> PrefillRate:
    rate = PrefillRate()
    for tokens in (2**k for k in range(13)):  # every bucket up to 4,096 tokens
        for _ in range(20):
            rate.add(tokens, fixed_s + per_token_s * tokens)
    return rate


def burst(rate: PrefillRate, hits: int, tokens: int = 192) -> list[bool]:
    batch = StepBatch()
    out = []
    for _ in range(hits):
        joins = batch.joins(tokens, rate)
        out.append(joins)
        if joins:
            batch.add(tokens)
    return out


def test_a_step_whose_time_is_its_tokens_takes_one_hit_of_a_burst() -> None:
    assert burst(engine(0.0005, 0.00025), 5) == [True, False, False, False, False]


def test_a_step_with_a_large_fixed_cost_takes_several_then_stops() -> None:
    joined = burst(engine(0.010, 0.00002), 12)
    assert joined[:3] == [True, True, True] and not all(joined)


def test_without_timings_or_new_tokens_every_hit_joins() -> None:
    assert burst(PrefillRate(), 4) == [True] * 4
    batch = StepBatch()
    batch.add(192)
    assert batch.joins(0, engine(0.0005, 0.00025))


def _two_hits(rate: PrefillRate) -> tuple[Harness, object, object]:
    """Two prompts in the CPU tier, ``auto`` timed, then both asked for in one schedule."""
    h = Harness(num_blocks=80, tier_blocks=32, load_mode="auto")
    fill_cpu_tier_with(h, list(range(12)))
    fill_cpu_tier_with(h, list(range(100, 112)), rid="b0")
    h.sched.kv_cache_manager.reset_prefix_cache()
    cs = h.sched_conn.connector_scheduler
    for blocks in (1, 2, 3):
        cs.cost.observe_load("CPU", blocks, blocks * 3e-5)
    cs.cost.prefill = rate
    cs.cost.step_s = 0.1
    x, y = make_request("x", 16), make_request("y", 16, start=100)
    h.sched.add_request(x)
    h.sched.add_request(y)
    return h, x, y


def test_the_second_hit_of_a_schedule_loads_asynchronously_where_steps_cost_their_tokens() -> None:
    h, x, y = _two_hits(engine(0.0005, 0.00025))
    so = h.step()
    assert so.kv_connector_metadata.sync_loads == {"x"} and set(so.kv_connector_metadata.reqs_to_load) == {"x", "y"}
    assert so.num_scheduled_tokens == {"x": 4} and y.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    cs = h.sched_conn.connector_scheduler
    batch = cs.records.next_step.batch  # the step was built: the next schedule starts an empty one
    assert (batch.hits, batch.tokens) == (0, 0) and batch.joins(192, engine(0.0005, 0.00025))
    h.run_until_idle()
    assert cs.stats.load_decisions == {("cpu", "layerwise"): 1, ("cpu", "async"): 1}
    assert cs.stats.tier_hits["cpu"] == 24 and x.output_token_ids == y.output_token_ids == [7, 7, 7, 7]


def test_both_hits_run_in_the_step_where_a_step_has_a_large_fixed_cost() -> None:
    h, x, y = _two_hits(engine(0.010, 0.00002))
    so = h.step()
    assert so.kv_connector_metadata.sync_loads == {"x", "y"} and so.num_scheduled_tokens == {"x": 4, "y": 4}
    h.run_until_idle()
    assert h.sched_conn.connector_scheduler.stats.load_decisions == {("cpu", "layerwise"): 2}
