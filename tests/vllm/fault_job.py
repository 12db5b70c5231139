"""One offline vLLM job that injects production faults (a script: run by the fault tests).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and is stepped by hand,
so an abort can be delivered exactly where vLLM's EngineCore delivers client aborts: after the
step's forward pass and before ``update_from_output`` reads the step's connector report.

spec keys: model, kv_transfer_config, rounds (a list of {"abort": "recving" | "sync" | "none"}:
abort each request whose asynchronous load finished in the step, or that ran in the step of its
layer-wise load),
reset_between (bool). Prints ``RESULT`` with, per round, each prompt's tokens, finish reason
and cached tokens, and the scheduler's free device blocks before and after.
"""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

PROMPTS = [[(i * 37 + j) % 500 + 1 for j in range(300)] for i in range(4)]


def main(spec: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus
    from vllm_job import settle  # this script's folder is on sys.path

    aborted: list[str] = []
    abort_mode = {"on": ""}
    original = Scheduler.update_from_output

    def update_from_output(self, scheduler_output, model_output):  # type: ignore[no-untyped-def]
        kvo = model_output.kv_connector_output
        loaded: set[str] = set()
        if abort_mode["on"] == "recving" and kvo is not None:
            loaded = set(kvo.finished_recving or ())
        elif abort_mode["on"] == "sync":
            loaded = set(scheduler_output.kv_connector_metadata.inner.sync_loads)
        # Abort every request whose load finished (or ran, layer by layer) in this step, as a
        # client disconnect processed by EngineCore between execute_model and
        # update_from_output would.
        victims = sorted(r for r in loaded if r in self.requests and not r.startswith("keep"))
        if victims:
            aborted.extend(victims)
            self.finish_requests(victims, RequestStatus.FINISHED_ABORTED)
        return original(self, scheduler_output, model_output)

    Scheduler.update_from_output = update_from_output

    llm = LLM(model=spec["model"], skip_tokenizer_init=True, gpu_memory_utilization=0.1, max_model_len=1024,
              enforce_eager=True, dtype="bfloat16", seed=0, kv_transfer_config=spec.get("kv_transfer_config"))
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    params = SamplingParams(max_tokens=8, temperature=0)
    results = []
    for r, round_spec in enumerate(spec["rounds"]):
        if r and spec.get("reset_between", True) and not llm.reset_prefix_cache():
            # It refuses while blocks are held: a round served from stale device KV would test nothing.
            raise SystemExit(f"round {r}: vLLM refused to reset its prefix cache (blocks still held)")
        free_before = pool.get_num_free_blocks()
        abort_mode["on"] = "" if round_spec.get("abort", "none") == "none" else round_spec["abort"]
        aborted.clear()
        ids = [f"{'keep' if i % 2 and abort_mode['on'] else 'r'}{r}-{i}" for i in range(len(PROMPTS))]
        for rid, prompt in zip(ids, PROMPTS, strict=True):
            engine.add_request(rid, {"prompt_token_ids": prompt}, params)
        done: dict[str, dict] = {}
        for _ in range(2000):
            if not engine.has_unfinished_requests():
                break
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = {"tokens": list(out.outputs[0].token_ids),
                                            "finish": out.outputs[0].finish_reason,
                                            "cached": out.num_cached_tokens or 0}
            if aborted:  # tell the front end, as the API server does on a disconnect
                engine.output_processor.abort_requests(list(aborted), internal=True)
        # Let delayed frees, stores and write-through copies drain: by time, not by a count of
        # steps (an idle step takes microseconds, a starved machine's disk write much longer:
        # 50 steps once ended a round with every store still in flight).
        settle(llm)
        results.append({"ids": ids, "done": done, "aborted": sorted(a.rsplit("-", 1)[0] for a in aborted),
                        "free_before": free_before,
                        "free_after": pool.get_num_free_blocks(), "requests_left": len(scheduler.requests)})
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
