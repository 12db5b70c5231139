"""The worker half keeps one record per request, as the scheduler half does: every table in it
that holds a request id is ``_requests`` (its one record) or the step's plan (handed over whole
each step). Checked by walking the live objects while requests load (layer by layer and
asynchronously), store, are preempted (swap and recompute) and aborted, and after they are
gone: nothing is left."""

from __future__ import annotations

import pytest

from kvoffload.connector.worker.offloading_worker import OffloadingConnectorWorker
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from tests.connector.test_one_request_record import tables_holding

#: The worker's one table of requests, and the plans of the step being run (handed over whole).
ALLOWED_PREFIXES = ("_requests", "_step_meta.", "_demoted_meta.")


@pytest.mark.parametrize("mode,load_mode", [("swap", "async"), ("recompute", "layerwise")])
def test_every_request_fact_lives_in_its_one_worker_record(mode, load_mode):
    offload = {"load_mode": load_mode, "tiers": [{"medium": "cpu", "capacity": "16MiB"}]}
    prompts = {f"r{i}": [i + 1] + list(range(30, 30 + 40 + 8 * i)) for i in range(6)}
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    cfg = EngineConfig(block_size=8, num_gpu_blocks=20, kv_offload=offload, preemption_mode=mode)
    with LLM(cfg) as llm:
        worker = llm.worker_connector.connector_worker  # type: ignore[union-attr]
        assert isinstance(worker, OffloadingConnectorWorker)
        seen: dict[str, int] = {}
        rids: set[str] = set()

        def look() -> None:
            for where, n in tables_holding(worker, rids).items():
                seen[where] = max(seen.get(where, 0), n)

        wait_for_save = worker.wait_for_save

        def looking_wait_for_save() -> None:  # inside the step too: layer-wise copies end with it
            look()
            wait_for_save()

        worker.wait_for_save = looking_wait_for_save  # type: ignore[method-assign]
        for round_ in range(2):  # the second round's prompts hit what the first stored
            for rid, prompt in prompts.items():
                llm.add_request(prompt, params, request_id=f"{rid}.{round_}")
            rids = {f"{rid}.{round_}" for rid in prompts}
            seen.clear()
            steps = 0
            while llm.scheduler.has_unfinished_requests() or llm.scheduler_connector.has_pending_work():  # type: ignore[union-attr]
                llm.step()
                steps += 1
                if steps == 5:
                    llm.scheduler.abort_request(f"r5.{round_}")
                look()
            assert all(w.startswith(ALLOWED_PREFIXES) for w in seen), seen
            assert seen.get("_requests", 0) >= 2  # requests with copies in flight or planned at once
            # Nothing is left of any of them (but the last step's plan, which the next replaces).
            assert [w for w in tables_holding(worker, rids) if not w.startswith(ALLOWED_PREFIXES[1:])] == []
        stats = llm.stats()
        assert stats["preemptions"] > 0 and stats["connector"]["loaded_blocks"] > 0
