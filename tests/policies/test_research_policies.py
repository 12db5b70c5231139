"""Research policies: the CachePolicy contract, hand-computed hits, Belady optimality, scans,
the ARC paper's numbers, and simulator/connector agreement."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kvoffload_policies.simulator import replay

from kvoffload.offload import CPUOffloadingManager, known_policies
from kvoffload.traces import load_arc_lis, synthetic_scan_workload

ALL_POLICIES = ["lru", "arc", "s3fifo", "sieve", "lfu", "arc_classic", "prefix_value", "hinted", "belady"]
TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def test_every_policy_is_registered():
    assert set(ALL_POLICIES) <= set(known_policies())


def make_contract_machine(policy_name):
    class Contract(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.mgr = CPUOffloadingManager(5, cache_policy=policy_name)
            self.pending, self.loads = [], []

        @rule(hashes=st.lists(st.integers(0, 12), min_size=1, max_size=4))
        def store(self, hashes):
            pinned = {h for load in self.loads for h in load}
            before = dict(self.mgr.index.debug_snapshot().index)
            out = self.mgr.prepare_store(hashes)
            if out is None:
                assert self.mgr.index.debug_snapshot().index == before  # atomic: nothing changed
                return
            for h in out.block_hashes_evicted:
                assert h not in pinned and h not in self.pending and h not in hashes
            self.pending += out.block_hashes_to_store

        @rule(data=st.data(), ok=st.booleans())
        @precondition(lambda self: self.pending)
        def complete(self, data, ok):
            chosen = data.draw(st.lists(st.sampled_from(self.pending), min_size=1, unique=True))
            self.mgr.complete_store(chosen, ok)
            self.pending = [h for h in self.pending if h not in chosen]

        @rule(hashes=st.lists(st.integers(0, 12), max_size=5))
        def lookup_touch(self, hashes):
            n = self.mgr.lookup(hashes)
            assert all(self.mgr.index.is_ready(h) for h in hashes[:n])
            self.mgr.touch(hashes)

        @rule(data=st.data())
        def load(self, data):
            ready = [h for h in range(13) if self.mgr.index.is_ready(h)]
            if ready:
                chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=2, unique=True))
                self.mgr.prepare_load(chosen)
                self.loads.append(chosen)

        @rule()
        @precondition(lambda self: self.loads)
        def complete_load(self):
            self.mgr.complete_load(self.loads.pop(0))

        @invariant()
        def ledger_consistent(self):
            index = self.mgr.index.debug_snapshot().index
            assert len(set(index.values())) == len(index)
            assert self.mgr.num_free_blocks + len(index) == 5
            for h, s in index.items():
                assert self.mgr.index.debug_snapshot().refs[s] >= -1
                assert self.mgr.index.policy.get(h) is not None

    Contract.TestCase.settings = settings(max_examples=30, stateful_step_count=40, deadline=None,
                                          suppress_health_check=list(HealthCheck))
    return Contract


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_policy_contract_state_machine(policy):
    make_contract_machine(policy).TestCase().runTest()


# A B A C B A at capacity 2, page-cache replay; hits worked out by hand in the module docs below.
HAND_TRACE = [["A"], ["B"], ["A"], ["C"], ["B"], ["A"]]
HAND_HITS = {"lru": 1, "belady": 3, "s3fifo": 2, "sieve": 1, "lfu": 2, "arc": 2, "arc_classic": 1, "prefix_value": 2,
             "hinted": 2}


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_hand_computed_hits(policy):
    assert replay(HAND_TRACE, 2, policy, mode="page").hit_blocks == HAND_HITS[policy]


def test_belady_is_optimal_on_independent_pages():
    for seed in range(25):
        rng = random.Random(seed)
        trace = [[rng.randrange(12)] for _ in range(150)]
        cap = rng.randrange(2, 7)
        best = replay(trace, cap, "belady", mode="page").hit_blocks
        for policy in ALL_POLICIES:
            assert replay(trace, cap, policy, mode="page").hit_blocks <= best, (seed, policy)


def test_scan_does_not_flush_hot_blocks_under_arc_and_s3fifo():
    trace = synthetic_scan_workload(hot_blocks=50, hot_repeats=20, scan_blocks=400)
    final_hot = trace[-50:]

    def hits_after_scan(policy):
        before = replay(trace[:-50], 100, policy, mode="page").hit_blocks
        return replay(trace, 100, policy, mode="page").hit_blocks - before

    assert hits_after_scan("lru") == 0
    assert hits_after_scan("arc") == len(final_hot)
    assert hits_after_scan("s3fifo") == len(final_hot)


OLTP = TRACES / "arc_fast03" / "OLTP.lis.gz"


@pytest.mark.skipif(not OLTP.exists(), reason="shared/traces not present")
@pytest.mark.parametrize("capacity, policy, expected", [
    (1000, "lru", 32.83), (1000, "arc_classic", 38.93), (5000, "lru", 53.65), (5000, "arc_classic", 55.25),
])
def test_arc_paper_oltp_hit_ratios(capacity, policy, expected):
    result = replay(load_arc_lis(OLTP), capacity, policy, mode="page")
    assert abs(100 * result.block_hit_ratio - expected) <= 0.05


def test_simulator_agrees_with_live_connector(monkeypatch):
    from kvoffload_policies.simulator import OpRecorder, replay_ops

    from kvoffload.engine import LLM, EngineConfig
    from kvoffload.tiers import tiered_spec
    from kvoffload.workload import ChatWorkload, run_chat_workload

    recorders = []
    original = tiered_spec.TieredOffloadingSpec.get_manager

    def recorded(self):
        rec = OpRecorder(original(self))
        recorders.append(rec)
        return rec

    monkeypatch.setattr(tiered_spec.TieredOffloadingSpec, "get_manager", recorded)
    tiers = {"tiers": [{"medium": "cpu", "capacity": 150 * 8192, "eviction_policy": "arc"}]}
    with LLM(EngineConfig(num_gpu_blocks=60, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=tiers)) as llm:
        run_chat_workload(llm, ChatWorkload(conversations=16, turns=3, system_tokens=128, user_tokens=64, max_tokens=12))
        stats = llm.stats()
    (rec,) = recorders
    live_loaded = stats["connector"]["loaded_blocks"]
    assert live_loaded > 0
    assert replay_ops(rec.ops, 150, "arc") == live_loaded


def test_sim_cli_writes_table_csv_json_and_plot(tmp_path, capsys):
    from kvoffload.cli import main

    rc = main(["sim", "--trace", "synthetic", "--limit", "800", "--policies", "lru,s3fifo,belady",
               "--capacities", "5%,20%", "--store-threshold", "0,2", "--workers", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "LRU→MIN closed" in out and "BEATS MIN" not in out.split("filter")[0]
    assert (tmp_path / "results.csv").exists() and (tmp_path / "results.json").exists()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "hit_ratio.png").stat().st_size > 1000


def test_sim_cli_rejects_unknown_policy(capsys):
    from kvoffload.cli import main

    assert main(["sim", "--trace", "synthetic", "--policies", "nope"]) == 2
    assert "unknown eviction policy 'nope'" in capsys.readouterr().err


def test_sim_on_a_trace_without_block_hashes_says_so(tmp_path, capsys):
    from kvoffload.cli import main

    csv = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    assert main(["sim", "--trace", str(csv), "--policies", "lru", "--capacities", "10", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "line 1 is not a Mooncake record with block hashes" in err and "AzureLLMInferenceTrace_conv.csv" in err


def test_sim_table_columns_align_with_long_policy_names():
    from kvoffload_policies.experiment import format_results

    row = {"policy": "mypolicies.research:VeryLongPolicyName", "store_threshold": 0, "capacity": 100,
           "block_hit_ratio": 0.5, "token_hit_ratio": 0.25, "blocks_written": 7, "evicted_blocks": 3}
    head, *rows = format_results([row, {**row, "policy": "lru"}]).splitlines()
    # Every row's block-hit percentage ends where the header's "block hit" ends.
    assert {r.index("%") + 1 for r in rows} == {head.index("block hit") + len("block hit")}
    timed = {**row, "refs_per_s": 2.5e6, "baseline_refs_per_s": 1e6}
    head, *rows = format_results([timed, {**timed, "policy": "lru"}]).splitlines()
    assert all(r.endswith("    2.50    2.50x") for r in rows) and head.endswith("x py-LRU")


def test_sim_prints_replay_speed_against_a_same_run_baseline(tmp_path, capsys):
    from kvoffload_policies.experiment import main

    assert main(["--trace", "synthetic", "--limit", "300", "--capacities", "5%,20%", "--policies", "lru,belady",
                 "--workers", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("lru ", "belady "))]
    assert len(rows) == 4  # two policies x two capacities; the baseline is not a row of its own
    for row in rows:
        assert float(row[-2]) > 0 and row[-1].endswith("x") and float(row[-1][:-1]) > 0
    assert "x py-LRU: that speed over LRU on the Python ledger" in out


def test_sim_capacities_take_sizes_with_a_block_size():
    from kvoffload_policies.experiment import parse_capacities

    assert parse_capacities("1%, 100, 1MiB", 1000, block_bytes=65536) == [10, 100, 16]
    with pytest.raises(ValueError, match="'1GiB' is a size: give --block-bytes"):
        parse_capacities("1GiB", 1000)
    with pytest.raises(ValueError, match="'lots': use a share like 5%"):
        parse_capacities("lots", 1000)


def test_sim_runs_the_packaged_sample_from_anywhere(tmp_path, monkeypatch, capsys):
    from kvoffload_policies.experiment import main

    monkeypatch.chdir(tmp_path)
    assert main(["--trace", "mooncake-sample", "--policies", "lru,belady", "--capacities", "2%,4MiB",
                 "--block-bytes", "65536", "--workers", "1", "--limit", "300", "--out", "o"]) == 0
    out = capsys.readouterr().out
    assert "mooncake_conversation_1500.jsonl.gz" in out and "belady" in out
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert {r["capacity"] for r in results} >= {64}
    for r in results:  # one ratio per slice of the trace
        assert len(r["window_hit_ratios"]) == 20 and all(0 <= v <= 1 for v in r["window_hit_ratios"])
    assert (tmp_path / "o" / "hit_ratio_over_time.png").stat().st_size > 10_000
    assert "window_hit_ratios" not in (tmp_path / "o" / "results.csv").read_text().splitlines()[0]
