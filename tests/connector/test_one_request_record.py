"""The scheduler half keeps one record per request: every table anywhere in it that holds a
request id is ``records.requests`` (its one record) or the next step's plan (handed over whole
each step). Checked by walking the live objects while requests are looked up, loaded, stored,
preempted (swap and recompute), aborted and hinted, and after they are gone: nothing is left.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvoffload.connector.scheduler.offloading_scheduler import OffloadingConnectorScheduler
from kvoffload.engine import LLM, EngineConfig, SamplingParams

ALLOWED = {"records.requests", "records.next_step.reqs_to_load", "records.next_step.sync_loads",
           "records.next_step.swap_out", "records.next_step.await_finish"}


def _fields(obj: object) -> Iterator[tuple[str, object]]:
    names = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        names += [n for n in getattr(cls, "__slots__", ()) if n not in names]
    for name in names:
        if hasattr(obj, name):
            yield name, getattr(obj, name)


def tables_holding(root: OffloadingConnectorScheduler, rids: set[str]) -> dict[str, int]:
    """Path -> how many request ids it holds, for every dict (by key) or set in the scheduler
    half's own objects (the tiers are keyed by block, not by request: not walked)."""
    found: dict[str, int] = {}
    seen: set[int] = set()

    def walk(obj: object, path: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        for name, value in _fields(obj):
            where = f"{path}.{name}" if path else name
            if isinstance(value, (dict, set, frozenset)):
                n = sum(1 for k in value if isinstance(k, str) and k in rids)
                if n:
                    found[where] = n
            elif type(value).__module__.startswith("kvoffload.connector"):
                walk(value, where)

    walk(root, "")
    return found


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_every_request_fact_lives_in_its_one_record(mode):
    offload = {"tiers": [{"medium": "cpu", "capacity": "16MiB", "eviction_policy": "hinted"}]}
    prompts = {f"r{i}": [i + 1] + list(range(30, 30 + 40 + 8 * i)) for i in range(6)}
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    # 20 device blocks of 8 tokens for six requests of 6-10 blocks: preemption on every run.
    with LLM(EngineConfig(block_size=8, num_gpu_blocks=20, kv_offload=offload, preemption_mode=mode)) as llm:
        sched = llm.scheduler_connector.connector_scheduler  # type: ignore[union-attr]
        for rid, prompt in prompts.items():
            llm.add_request(prompt, params, request_id=rid, hint={"session": rid, "expect_return_s": 5})
        seen: dict[str, int] = {}
        steps = 0
        while llm.scheduler.has_unfinished_requests() or llm.scheduler_connector.has_pending_work():  # type: ignore[union-attr]
            llm.step()
            steps += 1
            if steps == 5:
                llm.scheduler.abort_request("r5")
            for where, n in tables_holding(sched, set(prompts)).items():
                seen[where] = max(seen.get(where, 0), n)
        assert llm.stats()["preemptions"] > 0
        assert set(seen) <= ALLOWED, seen
        assert seen["records.requests"] >= 3  # requests looked up, running and preempted at once
        assert tables_holding(sched, set(prompts)) == {}  # and nothing is left of any of them
