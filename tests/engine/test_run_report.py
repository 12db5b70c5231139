"""The `run` report: a hit rate over each prompt's first admission (never above 100%, however
many preemptions re-admit requests), and a header saying what ran."""

from kvoffload.engine import LLM, EngineConfig
from kvoffload.report import summarize
from kvoffload.workload import ChatWorkload, run_chat_workload


def test_hit_rate_counts_each_prompt_once_under_preemption():
    wl = ChatWorkload(conversations=8, turns=3, system_tokens=128, user_tokens=64, max_tokens=24)
    with LLM(EngineConfig(num_gpu_blocks=40, max_num_seqs=8, max_num_batched_tokens=256)) as llm:
        run_chat_workload(llm, wl)
        stats = llm.stats()
    every_admission = sum(stats["prefix_hit_tokens"].values())
    assert stats["preemptions"] > 0
    assert 0 < stats["prompt_hit_tokens"] < every_admission  # re-admissions hit again; counted once here
    rate = summarize(stats, 1.0)["prefix-cache hit rate"]
    assert rate == f"{stats['prompt_hit_tokens'] / stats['prompt_tokens']:.1%}" and float(rate[:-1]) <= 100


def test_run_prints_what_ran(capsys):
    from kvoffload.cli import main

    assert main(["run", "--conversations", "2", "--turns", "2", "--num-gpu-blocks", "48", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("model=small, device KV cache 48 blocks x 16 tokens")
    assert "workload: 2 chats x 2 turns" in out and "tokens/s (prompt+generated)" in out
