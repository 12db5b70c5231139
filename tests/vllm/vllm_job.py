"""Runs one offline vLLM job for the plugin tests (a script: vLLM spawns processes)."""

import json
import os
import sys
import time

import torch


def make_model(path: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048)
    LlamaForCausalLM(cfg).save_pretrained(path)


def make_gemma3(path: str) -> None:
    """A tiny hybrid model: 3 sliding-window layers (window 64) and 1 full-attention layer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                           sliding_window=64, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                           query_pre_attn_scalar=32, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    Gemma3ForCausalLM(cfg).save_pretrained(path)


def make_lora(path: str, seed: int, rank: int = 8) -> None:
    """A PEFT-format LoRA for make_model's Llama (q_proj and v_proj of both layers), written by
    hand: its weights drawn from ``seed`` and large enough to change greedy tokens."""
    import os

    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(2):
        for proj, out in (("q_proj", 128), ("v_proj", 64)):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, 128, generator=g) * 0.5
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.5
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"],
                   "bias": "none", "task_type": "CAUSAL_LM", "lora_dropout": 0.0, "fan_in_fan_out": False,
                   "modules_to_save": None, "base_model_name_or_path": "tiny-llama"}, f)


def scale_weights(worker) -> None:  # runs in each worker: an in-place weight update
    with torch.no_grad():
        for p in worker.model_runner.model.parameters():
            wave = torch.cos(torch.arange(p.numel(), dtype=torch.float32)).reshape(p.shape)
            p.add_((0.05 * wave).to(p.dtype))


def settle(llm) -> None:
    """Let the connector's copies land before the next round (or the end), for up to 120 s: a
    finished request's stores hold its blocks (vLLM refuses a prefix-cache reset until they
    land) and a shared tier's writes run after it. In vLLM's own processes the engine core keeps
    stepping while its connector has work: wait for it; in-process nothing steps between
    ``generate`` calls: step it here."""
    engine = llm.llm_engine
    deadline = time.monotonic() + 120
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        # The engine core steps itself; ask it (a utility call) until it has nothing left to
        # step for, or the job would exit with copies in flight (a shared store's last writes).
        while engine.engine_core.call_utility("has_work"):
            if time.monotonic() > deadline:
                raise SystemExit("the connector's copies did not drain in 120 s")
            time.sleep(0.05)
        return
    scheduler = engine.engine_core.engine_core.scheduler
    while scheduler.has_requests():
        if time.monotonic() > deadline:
            raise SystemExit("the connector's copies did not drain in 120 s")
        engine.step()
        time.sleep(0.001)


def reset_prefix_cache(llm, reset_connector: bool) -> bool:
    """vLLM's reset, asked again for up to 60 s while it refuses (blocks still held)."""
    deadline = time.monotonic() + 60
    while not llm.reset_prefix_cache(reset_connector=reset_connector):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
        reset_connector = False  # the connector's own reset is done; the device's is what waits
    return True


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams

    kw = dict(model=spec["model"], skip_tokenizer_init=True, gpu_memory_utilization=0.1, max_model_len=1024,
              enforce_eager=True, dtype=spec.get("dtype", "bfloat16"), seed=0)
    if spec.get("tp", 1) > 1:
        kw["tensor_parallel_size"] = spec["tp"]
    if spec.get("kv_transfer_config"):
        kw["kv_transfer_config"] = spec["kv_transfer_config"]
    if spec.get("metrics"):
        kw["disable_log_stats"] = False
    if spec.get("kv_events_config"):
        kw["kv_events_config"] = spec["kv_events_config"]
    for key in ("max_num_batched_tokens", "enable_chunked_prefill"):
        if key in spec:
            kw[key] = spec[key]
    lora = None
    if spec.get("lora"):
        from vllm.lora.request import LoRARequest

        kw.update(enable_lora=True, max_lora_rank=8, max_loras=1)
        lora = LoRARequest(spec["lora"]["name"], 1, spec["lora"]["path"])
    llm = LLM(**kw)
    prompts = [{"prompt_token_ids": p} for p in spec.get("prompts")
               or [[(i * 37 + j) % 500 + 1 for j in range(300)] for i in range(3)]]
    params = SamplingParams(max_tokens=spec.get("max_tokens", 8), temperature=spec.get("temperature", 0),
                            seed=spec.get("seed"), n=spec.get("n", 1), ignore_eos=spec.get("ignore_eos", False))
    rounds = []
    for r in range(spec.get("rounds", 2)):
        new_weights = spec.get("new_weights_before") == r
        if new_weights:
            llm.collective_rpc(scale_weights)
        if r or new_weights:
            assert reset_prefix_cache(llm, new_weights and spec.get("reset_connector", False))
        salt = (spec.get("salts") or [None] * (r + 1))[r]
        outs = llm.generate([{**p, "cache_salt": salt} if salt else p for p in prompts], params, use_tqdm=False,
                            lora_request=lora)
        settle(llm)
        rounds.append({"tokens": [list(o.outputs[0].token_ids) for o in outs],
                       "samples": [[list(c.token_ids) for c in o.outputs] for o in outs],
                       "cached": [o.num_cached_tokens for o in outs]})
    if spec.get("metrics"):  # counters whose name starts with one of the prefixes, by labels
        from prometheus_client import REGISTRY

        found = {}
        for family in REGISTRY.collect():
            for sample in family.samples:
                if family.name.startswith(tuple(spec["metrics"])) and not sample.name.endswith("_created"):
                    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                                      if k not in ("engine", "model_name"))
                    found[f"{sample.name}{{{labels}}}"] = sample.value
        rounds.append({"metrics": found})
    print("RESULT " + json.dumps(rounds), flush=True)
