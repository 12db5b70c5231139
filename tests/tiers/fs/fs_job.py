"""One bundled-engine process on a shared fs tier: runs chat workloads of the given seeds (one
round each) and prints its tokens and fs hits per round, then the same rounds without offload
when asked (for the many-process tests)."""

import itertools
import json
import sys
import time
from pathlib import Path

import torch

from kvoffload.engine import LLM, EngineConfig
from kvoffload.workload import ChatWorkload, run_chat_workload


def workload(seed: int) -> ChatWorkload:
    return ChatWorkload(conversations=6, turns=2, system_tokens=128, user_tokens=64, max_tokens=8, seed=seed)


def engine_config(kv_offload, model_seed: int = 0) -> EngineConfig:
    return EngineConfig(num_gpu_blocks=60, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=kv_offload,
                        seed=model_seed)


def fs_offload(path: str, capacity: str, cpu: str = "256KiB", **extra) -> dict:
    return {"tiers": [{"name": "cpu", "medium": "cpu", "capacity": cpu},
                      {"name": "fs", "medium": "fs", "path": path, "capacity": capacity, **extra}]}


def wait_for_peers(barrier: dict, round_index: int) -> None:
    """A file barrier between rounds: this process's marker, then every peer's."""
    folder = Path(barrier["dir"])
    (folder / f"round{round_index}-{barrier['rank']}").touch()
    deadline = time.monotonic() + 300
    while len(list(folder.glob(f"round{round_index}-*"))) < barrier["procs"]:
        assert time.monotonic() < deadline, "peers did not finish their round"
        time.sleep(0.05)


def run_rounds(kv_offload, seeds: list[int], model_seed: int = 0, forever: bool = False,
               barrier: dict | None = None) -> tuple[list, list[int], dict]:
    """One round per seed, None: no round (``forever``: again and again, saying so as each starts,
    until killed; ``barrier``: every round starts once all peers finished the previous one)."""
    tokens, hits = [], []
    with LLM(engine_config(kv_offload, model_seed)) as llm:
        for i, seed in enumerate(itertools.cycle(seeds) if forever else seeds):
            if forever:
                print(f"ROUND {i}", flush=True)
            if barrier and i:
                wait_for_peers(barrier, i - 1)
            if seed is None:  # sit this round out (while a peer runs it alone)
                tokens.append(None)
                hits.append(0)
                continue
            before = llm.stats()["connector"].get("hit_tokens_by_tier", {}).get("fs", 0) if kv_offload else 0
            tokens.append(run_chat_workload(llm, workload(seed)))
            after = llm.stats()["connector"].get("hit_tokens_by_tier", {}).get("fs", 0) if kv_offload else 0
            hits.append(after - before)
        stats = llm.stats()["connector"] if kv_offload else {}
    return tokens, hits, stats


if __name__ == "__main__":
    torch.set_num_threads(1)
    spec = json.loads(sys.argv[1])
    tokens, hits, stats = run_rounds(spec["kv_offload"], spec["seeds"], spec.get("model_seed", 0),
                                     spec.get("forever", False), spec.get("barrier"))
    print("RESULT " + json.dumps({"tokens": tokens, "fs_hits": hits, "connector": stats}), flush=True)
