"""One lookup asks each tier about each hash once: the load plan pins where the lookup found
each block (no second readiness scan), and a request waiting several steps touches each tier
once, not once per step."""

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

from kvoffload.config import OffloadConfig
from kvoffload.connector.scheduler.offloading_scheduler import OffloadingConnectorScheduler
from kvoffload.offload.spec import EngineKVInfo, OffloadingSpecFactory

COUNTED = ("lookup", "lookup_run", "is_ready", "is_pending", "contains", "touch", "prepare_load")


@dataclass
class Request:
    request_id: str
    block_hashes: list[int]
    num_computed_tokens: int = 0
    kv_transfer_params: dict | None = None
    cache_salt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.block_hashes) * 4


@dataclass
class Blocks:
    ids: list[int]
    blocks: list[list[object]] = field(default_factory=lambda: [[]])

    def get_block_ids(self):
        return (self.ids,)


def _counting(tier, calls: Counter):
    """Count each call of ``COUNTED`` on this tier (its reads: on its index), per (method, hash)
    where it takes hashes."""
    for name in COUNTED:
        owner = tier if name in ("prepare_load", "lookup_run") else tier.index
        method = getattr(owner, name)

        def counted(*args, _name=name, _method=method, **kwargs):
            arg = args[0] if args else None
            keys = list(arg) if isinstance(arg, list) else [arg]
            for h in keys:
                calls[_name, h] += 1
            calls[_name] += 0 if keys else 1
            calls[_name, "calls"] += 1
            return _method(*args, **kwargs)

        setattr(owner, name, counted)


def _scheduler(tmp_path):
    cfg = OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": 16 * 100},
                                             {"medium": "disk", "capacity": 4096 + 16 * (100 + 64),  # 16 records
                                              "path": str(tmp_path)}]})
    info = EngineKVInfo(block_size=4, block_bytes=100, num_device_blocks=32)
    return OffloadingConnectorScheduler(OffloadingSpecFactory.create_spec(cfg, info))


def test_lookup_and_plan_ask_each_tier_about_each_hash_once(tmp_path):
    sched = _scheduler(tmp_path)
    chain = sched.manager
    cpu, disk = chain.primary, chain.secondaries[0]
    for tier, hashes in ((cpu, [11, 12]), (disk, [13, 14])):
        tier.prepare_store(hashes)
        tier.complete_store(hashes)
    cpu_calls, disk_calls = Counter(), Counter()
    _counting(cpu, cpu_calls)
    _counting(disk, disk_calls)
    req = Request("r", [11, 12, 13, 14, 15])

    for _ in range(3):  # a waiting request is looked up every step (and each step's plan is built)
        assert sched.get_num_new_matched_tokens(req, 0) == (16, True)
        sched.cost.end_step()
    sched.update_state_after_alloc(req, Blocks([1, 2, 3, 4, 5]), 16)

    (_, jobs), = sched.records.next_step.reqs_to_load.items()
    assert [(str(j.src.medium()), j.src.block_ids.tolist(), j.dst.block_ids.tolist()) for j in jobs] == [
        ("CPU", [0, 1], [1, 2]), ("DISK", [0, 1], [3, 4])]
    # Touched once per request, in every tier, with the whole prompt.
    assert cpu_calls["touch", "calls"] == disk_calls["touch", "calls"] == 1
    assert cpu_calls["touch", 11] == disk_calls["touch", 15] == 1
    # Three lookups: the host tier's vectorised lookup once each, then one readiness question per
    # block past its run, per tier; the plan asks nothing more (no second scan).
    assert cpu_calls["lookup", "calls"] == 3
    assert [cpu_calls["is_ready", h] for h in (11, 12, 13, 14, 15)] == [0, 0, 3, 3, 3]
    assert [disk_calls["is_ready", h] for h in (11, 12, 13, 14, 15)] == [0, 0, 3, 3, 3]
    # The plan pins each block once, in the tier the lookup found it in.
    assert [cpu_calls["prepare_load", h] for h in (11, 12, 13, 14)] == [1, 1, 0, 0]
    assert [disk_calls["prepare_load", h] for h in (11, 12, 13, 14)] == [0, 0, 1, 1]


def test_a_block_gone_since_the_lookup_is_found_where_it_is_now(tmp_path):
    """The lookup's answer is a hint: a block that moved tiers between the lookup and the plan
    is pinned where it is, and the pins the first try took are released."""
    sched = _scheduler(tmp_path)
    chain = sched.manager
    cpu, disk = chain.primary, chain.secondaries[0]
    cpu.prepare_store([11, 12, 13])
    cpu.complete_store([11, 12, 13])
    disk.prepare_store([13])
    disk.complete_store([13])
    req = Request("r", [11, 12, 13])
    assert sched.get_num_new_matched_tokens(req, 0) == (12, True)
    assert cpu.drop([13]) == [13]  # found corrupt in host memory meanwhile; disk still has it
    sched.update_state_after_alloc(req, Blocks([1, 2, 3]), 12)

    (_, jobs), = sched.records.next_step.reqs_to_load.items()
    assert [(str(j.src.medium()), j.dst.block_ids.tolist()) for j in jobs] == [("CPU", [1, 2]), ("DISK", [3])]
    assert cpu.report().pinned_blocks == 2 and disk.report().pinned_blocks == 1


def test_a_finished_request_leaves_no_lookup_state(tmp_path):
    sched = _scheduler(tmp_path)
    sched.manager.prepare_store([11])
    sched.manager.complete_store([11])
    req = Request("r", [11, 12])
    assert sched.get_num_new_matched_tokens(req, 0) == (4, False)  # host memory: loaded inside the step
    sched.request_finished(SimpleNamespace(request_id="r", kv_transfer_params=None, cache_salt=None, output_token_ids=[]), ([],))  # aborted before allocation
    assert sched.records.requests == {}  # its one record went with it
