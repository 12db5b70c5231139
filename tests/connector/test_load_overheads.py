"""The connector's host work per loaded request: measured on both halves, weighed by the cost model."""

from __future__ import annotations

import pytest

from kvoffload.connector.cost.load_choice import LoadDecision, Segment
from kvoffload.connector.cost.load_cost import LoadCostModel
from kvoffload.connector.cost.load_overheads import WARMUP, LoadOverheads
from kvoffload.engine import LLM, EngineConfig
from kvoffload.workload import ChatWorkload, run_chat_workload


def test_host_time_counts_per_request_after_warm_up_and_for_every_request_of_the_step():
    o = LoadOverheads()
    for _ in range(WARMUP - 1):
        o.observe_host("worker", 2, 0.004)  # 2 ms a request
    assert o.per_request_s() == 0.0  # not measured enough yet
    o.observe_host("worker", 2, 0.004)
    o.observe_host("worker", 0, 1.0)  # no load: no sample
    o.observe_host("worker", 1, -1.0)
    assert o.per_request_s() == pytest.approx(0.002)
    for _ in range(WARMUP):
        o.observe_host("scheduler", 1, 0.001)
    assert o.per_request_s() == pytest.approx(0.003)
    o.observe_batch(0)
    assert o.host_cost_s() == pytest.approx(0.003)
    o.observe_batch(8)
    assert o.host_cost_s() == pytest.approx(0.024)
    o.observe_host("worker", 1, 0.006)  # averaged, recent samples weigh 0.1
    assert o.host_s["worker"] == pytest.approx(0.002 + 0.1 * 0.004)
    before = o.host_s["worker"]
    o.observe_host("worker", 1, 1.0)  # one preempted issue: clipped at 4x the average
    assert o.host_s["worker"] == pytest.approx(before + 0.1 * 3 * before)


def taught() -> LoadCostModel:
    m = LoadCostModel({"CPU": "auto"}, tokens_per_block=16, bytes_per_block=4096)
    for blocks in (1, 2, 4, 8, 16):
        m.observe_load("CPU", blocks, 1e-4 + blocks * 1e-5)
    for tokens in (16, 64, 256, 1024):
        m.observe_step(tokens, tokens * 1e-5)  # a fast engine: 10 us a token
    return m


def test_host_work_per_loaded_request_tips_a_cheap_recompute_against_loading():
    m = taught()
    hit = [Segment("CPU", 32)]  # 512 tokens: 5.1 ms to recompute, 0.4 ms to copy
    assert m.choose(hit).decision is LoadDecision.LOAD
    for _ in range(WARMUP):
        m.overheads.observe_host("worker", 1, 0.0005)
        m.overheads.observe_host("scheduler", 1, 0.0002)
    m.overheads.observe_batch(2)  # 0.4 ms + 2 x 0.7 ms: still cheaper than recomputing
    choice = m.choose(hit)
    assert choice.decision is LoadDecision.LOAD and choice.chosen_s == pytest.approx(0.00042 + 0.0014, rel=0.05)
    m.overheads.observe_batch(12)  # 12 requests wait 0.7 ms each for it: 8.8 ms, more than 5.1 ms
    assert m.choose(hit).decision is LoadDecision.RECOMPUTE
    m.overheads.observe_batch(1)
    assert m.choose(hit).decision is LoadDecision.LOAD


def test_the_bundled_engine_reports_both_halves_host_time_per_loaded_request():
    workload = ChatWorkload(conversations=8, turns=3, system_tokens=128, user_tokens=64, max_tokens=8)
    offload = {"tiers": [{"medium": "cpu", "capacity": "32MiB"}], "load_mode": "async"}
    with LLM(EngineConfig(num_gpu_blocks=40, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=offload)) as llm:
        run_chat_workload(llm, workload)
        cost = llm.scheduler_connector.connector_scheduler.cost
        loaded = llm.stats()["prefix_hit_tokens"]["cpu"]
    assert loaded > 0
    assert cost.overheads.host_samples["scheduler"] >= WARMUP and cost.overheads.host_samples["worker"] >= WARMUP
    assert 0 < cost.overheads.host_s["scheduler"] < 0.05 and 0 < cost.overheads.host_s["worker"] < 0.05
    assert 1 <= cost.overheads.batch <= 3
