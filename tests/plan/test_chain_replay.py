"""The plan's replay against the live engine's own counters: the same requests, one at a time,
through the bundled engine with real tiers and through ``plan``'s chain of ledgers, give the
same hits in the device cache and in the host tier, request by request. Below the host tier the
engine's demotions land asynchronously (a copy completes steps later, so the disk's eviction
order depends on timing): there the replay is held to a block per request."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from kvoffload.engine import LLM, EngineConfig
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.plan.chain_replay import device_hits, replay_chain
from kvoffload.plan.log_reader import read_log
from kvoffload.plan.model_shape import kv_shape
from kvoffload.plan.tier_spec import parse_chain

BLOCK = 16
REPLY = 12


def chats(seed: int, conversations: int, turns: int) -> list[tuple[str, list[int]]]:
    """(session, new tokens) in a shuffled interleaving of multi-turn chats (a prompt is its
    session's history, its answers included, plus the new tokens)."""
    rng = random.Random(seed)
    order = [c for c in range(conversations) for _ in range(turns)]
    rng.shuffle(order)
    return [(f"c{c}", [rng.randrange(10, 250) for _ in range(rng.choice([40, 64, 90]))]) for c in order]


def run_live(tmp_path, steps, device_blocks: int, tiers: list[dict]) -> tuple[list[list[int]], list[int], dict]:
    history: dict[str, list[int]] = {}
    prompts, cached = [], []
    cfg = EngineConfig(model="tiny", block_size=BLOCK, num_gpu_blocks=device_blocks + 1, max_model_len=4096,
                       max_num_batched_tokens=4096, kv_offload={"tiers": tiers, "load_mode": "async"})
    with LLM(cfg) as llm:
        for sid, new in steps:
            prompt = history.get(sid, []) + new
            out = llm.generate([prompt], SamplingParams(max_tokens=REPLY, ignore_eos=True))[0]
            prompts.append(prompt)
            cached.append(out.num_cached_tokens)
            history[sid] = prompt + list(out.token_ids)
        stats = llm.stats()
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"prompt_token_ids": p, "session": sid, "max_tokens": REPLY,
                                       "timestamp": float(i)}) + "\n" for i, (p, (sid, _)) in enumerate(zip(prompts, steps))))
    return prompts, cached, stats


@pytest.mark.parametrize(("seed", "chain"), [(0, "cpu"), (1, "cpu"), (2, "cpu+disk"), (3, "cpu+disk")])
def test_the_replay_counts_what_the_engine_counted(tmp_path, seed, chain):
    block_bytes = kv_shape("tiny").bytes_per_token * BLOCK
    cpu_blocks = 24 if chain == "cpu+disk" else 40
    tiers = [{"name": "cpu", "medium": "cpu", "capacity": f"{cpu_blocks * block_bytes}B"}]
    spec = f"cpu:{cpu_blocks * block_bytes}B"
    if chain == "cpu+disk":
        tiers.append({"name": "disk", "medium": "disk", "capacity": f"{60 * block_bytes}B", "path": str(tmp_path / "d")})
        spec += f"+disk:{60 * block_bytes}B"
    device = 30
    steps = chats(seed, conversations=5, turns=4)
    prompts, cached, stats = run_live(tmp_path, steps, device, tiers)
    log = read_log(tmp_path / "log.jsonl", BLOCK, vocab=258, output_tokens=REPLY)
    dev = device_hits(log.requests, device, BLOCK, REPLY)
    counts = replay_chain(log.requests, dev, parse_chain(spec), block_bytes, BLOCK)
    planned = (dev + sum(counts.loaded_blocks.values())) * BLOCK
    assert int(dev.sum()) * BLOCK == stats["prefix_hit_tokens"]["device"]  # the device: exact
    assert sum(cached) > 0 and int(np.count_nonzero(sum(counts.loaded_blocks.values()))) > 0
    if chain == "cpu":
        assert planned.tolist() == cached  # request by request
        assert int(counts.loaded_blocks["cpu"].sum()) * BLOCK == stats["prefix_hit_tokens"]["cpu"]
        return
    assert np.abs(planned - np.array(cached)).max() <= BLOCK, (planned.tolist(), cached)
    for medium in counts.media:
        got = stats["prefix_hit_tokens"].get(medium, 0)
        assert abs(int(counts.loaded_blocks[medium].sum()) * BLOCK - got) <= 0.05 * max(got, 20 * BLOCK), medium
