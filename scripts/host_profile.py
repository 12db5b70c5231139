"""Where the host time of a returning chat turn goes, with and without the CPU tier.

Eight conversations take turns on the bundled engine (a 1,024-token opening, 128 tokens a
turn, 8 tokens of answer); the device cache holds about two of them, so a returning turn's
prefix comes from the CPU tier or is recomputed. Each configuration runs the same turns
under cProfile; the report gives per configuration the wall time, the steps, the requests
that loaded, the host seconds spent in kvoffload's connector code (connector, offload,
transfer, native copies) per step and per loaded request, and the connector functions that
took the most of it. CUDA is asynchronous, so on a GPU the profile shows host work only.

    python scripts/host_profile.py --device cuda [--configs plain,cpu:async,cpu] [--top 12]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

import torch

CONNECTOR_PARTS = ("kvoffload/connector/", "kvoffload/offload/", "kvoffload/transfer/", "kvoffload_ext/",
                   "kvoffload/tiers/")


def write_model(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1344,
           "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
           "vocab_size": 32000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    (path / "config.json").write_text(json.dumps(cfg))


def run(config: str, device: str, model: str, rounds: int) -> dict[str, object]:
    from kvoffload.engine import LLM, EngineConfig, SamplingParams

    mode = config.partition(":")[2]
    offload = None if config == "plain" else {"tiers": [{"medium": "cpu", "capacity": "2GiB"}],
                                              **({"load_mode": mode} if mode else {})}
    llm = LLM(EngineConfig(model=model, load_format="dummy", dtype="float32", device=device, block_size=16,
                           num_gpu_blocks=2 * (1024 + 128 * rounds + 64) // 16, max_model_len=4096,
                           max_num_batched_tokens=2048, max_num_seqs=16, kv_offload=offload))
    params = SamplingParams(max_tokens=8, temperature=0.0)
    convs = [[(c * 7919 + i * 31) % 30000 + 100 for i in range(1024)] for c in range(8)]
    steps = 0
    orig_step = llm.step

    def counted_step() -> list[str]:
        nonlocal steps
        steps += 1
        return orig_step()

    llm.step = counted_step  # type: ignore[method-assign]
    llm.generate(convs[:1], params, use_tqdm=False)  # warm-up: kernels, first allocations
    prof = cProfile.Profile()
    steps = 0
    start = time.perf_counter()
    prof.enable()
    for r in range(rounds):
        outs = llm.generate(convs, params, use_tqdm=False)
        convs = [c + list(o.token_ids) + [(r * 13 + i) % 30000 + 100 for i in range(128)]
                 for c, o in zip(convs, outs)]
    prof.disable()
    wall = time.perf_counter() - start
    stats = llm.stats()
    sched = llm.scheduler_connector.connector_scheduler if llm.scheduler_connector is not None else None
    measured = getattr(sched.cost, "overheads", None) if sched is not None else None  # None: a release before it
    overheads = dict(measured.host_s) if measured is not None else {}
    llm.close()
    ps = pstats.Stats(prof)
    total = sum(v[2] for v in ps.stats.values())  # tottime of everything
    ours = {k: v for k, v in ps.stats.items() if any(p in k[0] for p in CONNECTOR_PARTS)}
    host = sum(v[2] for v in ours.values())
    hits = stats["prefix_hit_tokens"]
    top = sorted(ours.items(), key=lambda kv: -kv[1][2])[:12]
    return {"config": config, "wall_s": wall, "steps": steps, "host_s": total, "connector_s": host,
            "cpu_hit_tokens": hits.get("cpu", 0), "computed": stats["prefill_tokens_computed"],
            "overheads": overheads, "decisions": stats["connector"].get("load_decisions", {}),
            "top": [(f"{Path(k[0]).name}:{k[1]}({k[2]})", v[1], v[2]) for k, v in top], "stats": stats}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--configs", default="plain,cpu:async,cpu")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "model")
        write_model(Path(model))
        for config in args.configs.split(","):
            r = run(config, args.device, model, args.rounds)
            print(f"\n== {config} on {args.device}: {r['wall_s']:.2f} s, {r['steps']} steps, "
                  f"{r['wall_s'] / max(1, r['steps']) * 1e3:.1f} ms a step; kvoffload host "
                  f"{r['connector_s'] * 1e3:.0f} ms = {r['connector_s'] / max(1, r['steps']) * 1e3:.2f} ms a step; "
                  f"{r['cpu_hit_tokens']} tokens loaded from the CPU tier, {r['computed']} computed; all host "
                  f"(cProfile) {r['host_s']:.2f} s")
            if r["overheads"]:
                per = ", ".join(f"{side} {sec * 1e3:.3f} ms" for side, sec in r["overheads"].items())
                print(f"   host time per loaded request, as the cost model measured it: {per}; "
                      f"decisions {r['decisions']}")
            for name, calls, tottime in r["top"]:
                print(f"   {tottime * 1e3:8.1f} ms {calls:7d} calls  {name}")


if __name__ == "__main__":
    main()
