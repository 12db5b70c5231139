"""One bundled-engine replica in its own process: runs the chat workload against the given
offload config and prints its tokens and stats (for the two-process sharing test and demo)."""

import json
import sys

import torch

from kvoffload.engine import LLM, EngineConfig
from kvoffload.workload import ChatWorkload, run_chat_workload

WORKLOAD = ChatWorkload(conversations=8, turns=2, system_tokens=128, user_tokens=64, max_tokens=8)


def engine_config(kv_offload, seed: int = 0) -> EngineConfig:
    return EngineConfig(num_gpu_blocks=60, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=kv_offload, seed=seed)


if __name__ == "__main__":
    torch.set_num_threads(1)
    spec = json.loads(sys.argv[1])
    with LLM(engine_config(spec["kv_offload"], spec.get("seed", 0))) as llm:
        tokens = run_chat_workload(llm, WORKLOAD)
        stats = llm.stats()
    print("RESULT " + json.dumps({"tokens": tokens, "hits": stats["prefix_hit_tokens"],
                                  "connector": stats["connector"]}), flush=True)
