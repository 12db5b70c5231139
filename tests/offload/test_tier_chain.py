"""A chain of three tiers, [cpu, disk, remote], built from the tier-kind plugin surface only:
victims of tier i demote to tier i+1 (read before their slot is reused), lookups see the chain
in one pass, loads come per tier, and generations equal those without offload."""

import numpy as np
import pytest

from kvoffload.config import ConfigError, OffloadConfig
from kvoffload.engine import LLM, EngineConfig
from kvoffload.offload import CPUOffloadingManager
from kvoffload.offload.abstract import LookupResult, Medium
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.offload.mediums import DISK
from kvoffload.testing.memory_tier import REMOTE, MemoryKind, MemoryTier
from kvoffload.tiers.disk.format import DiskLayout
from kvoffload.tiers.disk.tier import DiskTier
from kvoffload.workload import ChatWorkload, run_chat_workload

MEMORY = "kvoffload.testing.memory_tier:MemoryKind"
BLOCK_BYTES = 8192  # the tiny model at block size 16


@pytest.fixture
def chain(tmp_path):
    cpu = CPUOffloadingManager(2)
    disk = DiskTier(tmp_path, DiskLayout("chain", 64, 16, 2))
    remote = MemoryTier(4)
    yield HostTierChain(cpu, disk, remote), cpu, disk, remote
    disk.close()


def _store(mgr, hashes):
    out = mgr.prepare_store(hashes)
    mgr.complete_store(out.block_hashes_to_store)
    return out


def _land(mgr, demotions):
    for d in demotions:
        mgr.complete_demotion(d.block_hashes, True, d.dst.medium())


def test_victims_move_down_the_chain_each_read_before_its_slot_is_reused(chain):
    mgr, _, disk, remote = chain
    _store(mgr, [1, 2])
    _store(mgr, [3, 4])  # evicts 1, 2 from CPU slots 0, 1 → disk slots 0, 1
    (d,) = mgr.take_demotions()
    assert (d.block_hashes, d.src.medium(), d.src.block_ids.tolist(), d.dst.medium(), d.dst.block_ids.tolist(),
            d.dst.block_hashes) == ([1, 2], Medium.CPU, [0, 1], DISK, [0, 1], [1, 2])
    _land(mgr, [d])
    _store(mgr, [5, 6])  # evicts 3, 4 → disk, which evicts 1, 2 → remote
    first, second = mgr.take_demotions()
    # The disk victims' copy comes first: it reads disk slots 0, 1 before 3, 4 are written there.
    assert (first.block_hashes, first.src.medium(), first.src.block_ids.tolist(), first.src.block_hashes,
            first.dst.medium(), first.dst.block_ids.tolist()) == ([1, 2], DISK, [0, 1], [1, 2], REMOTE,
                                                                  [0, 1])
    assert (second.block_hashes, second.src.block_ids.tolist(), second.dst.medium(), second.dst.block_ids.tolist()) == (
        [3, 4], [1, 0], DISK, [1, 0])  # freed slots are reused last-freed first
    _land(mgr, [first, second])
    found = mgr.lookup_prefix([5, 3, 1, 9])
    assert (found.media, found.stop) == ([Medium.CPU, DISK, REMOTE], LookupResult.MISS)
    segments = mgr.prepare_load_segments([5, 6, 3, 1, 2])
    assert [(s.medium(), s.block_ids.tolist(), h) for s, h in segments] == [
        (Medium.CPU, [0, 1], [5, 6]), (DISK, [1], [3]), (REMOTE, [0, 1], [1, 2])]
    for spec, hashes in segments:
        mgr.complete_load(hashes, spec.medium())
    assert not np.any(remote.index.debug_snapshot().ref_cnt[:2]) and not np.any(disk.index.debug_snapshot().ref_cnt[:2])


def test_a_block_on_its_way_into_a_lower_tier_is_a_miss_and_into_host_memory_a_wait(chain):
    mgr = chain[0]
    _store(mgr, [1, 2])
    _store(mgr, [3, 4])
    # 1's demotion has not landed: a slow tier may take seconds, so the hit ends before it.
    found = mgr.lookup_prefix([3, 1])
    assert (found.hits, found.stop) == (1, LookupResult.MISS)
    _land(mgr, mgr.take_demotions())
    assert mgr.lookup_prefix([3, 1]).stop is LookupResult.HIT
    mgr.prepare_store([5])  # into host memory, not landed yet: worth a step's wait
    found = mgr.lookup_prefix([5])
    assert (found.hits, found.stop) == (0, LookupResult.HIT_PENDING)


def test_write_through_copies_each_landing_block_down(tmp_path):
    cpu, remote = CPUOffloadingManager(4), MemoryTier(4)
    mgr = HostTierChain(cpu, remote, write_through=[True])
    _store(mgr, [1, 2])
    (d,) = mgr.take_demotions()
    assert (d.src.medium(), d.dst.medium(), d.block_hashes) == (Medium.CPU, REMOTE, [1, 2])


def test_one_tier_per_medium():
    with pytest.raises(ValueError, match="one tier per medium"):
        HostTierChain(CPUOffloadingManager(2), MemoryTier(2), MemoryTier(2))
    cfg = {"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {"name": "a", "medium": MEMORY, "capacity": "1MiB"},
                     {"name": "b", "medium": MEMORY, "capacity": "1MiB"}]}
    with pytest.raises(ConfigError, match=r"tiers\[2\].medium: a second .* tier; one tier per medium"):
        OffloadConfig.from_dict(cfg)


@pytest.mark.parametrize("medium, match", [
    ("tape", r"tiers\[1\].medium: unknown tier medium 'tape'; known: disk"),
    ("cpu", r"tiers\[1\].medium: cpu; only the first tier is cpu"),
    ("kvoffload.offload:CPUOffloadingManager", r"not a TierKind subclass"),
])
def test_bad_tier_kinds_are_refused_naming_the_value(medium, match):
    with pytest.raises(ConfigError, match=match):
        OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                                           {"name": "x", "medium": medium, "capacity": "1MiB"}]})


WORKLOAD = ChatWorkload(conversations=16, turns=3, system_tokens=128, user_tokens=64, max_tokens=12)


def _run(kv_offload=None):
    cfg = EngineConfig(num_gpu_blocks=60, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=kv_offload)
    with LLM(cfg) as llm:
        return run_chat_workload(llm, WORKLOAD), llm.stats()


def test_three_tier_chain_serves_identical_tokens_from_every_tier(tmp_path):
    baseline, base_stats = _run()
    tokens, stats = _run({"tiers": [
        {"name": "cpu", "medium": "cpu", "capacity": 40 * BLOCK_BYTES},
        {"name": "ssd", "medium": "disk", "path": str(tmp_path), "capacity": 24 * BLOCK_BYTES},
        {"name": "store", "medium": MEMORY, "capacity": "64MiB"},
    ]})
    assert tokens == baseline
    hits = stats["prefix_hit_tokens"]
    assert hits["disk"] > 0 and hits["remote"] > 0, hits  # (this workload never hits the CPU tier in time)
    io = MemoryKind.last_io
    assert io is not None and io.writes > 0 and io.reads > 0
    assert stats["transfer"]["disk_to_remote"]["jobs"] > 0 and stats["transfer"]["disk_to_remote"]["failed"] == 0
    assert stats["prefill_tokens_computed"] < base_stats["prefill_tokens_computed"]


def test_prepare_load_refuses_blocks_in_two_tiers_and_pins_nothing(chain):
    from kvoffload.offload.host_tier_chain import BlocksSpanTiersError

    mgr, cpu, disk, _ = chain
    _store(mgr, [1, 2])
    _store(mgr, [3, 4])
    _land(mgr, mgr.take_demotions())
    with pytest.raises(BlocksSpanTiersError, match=r"2 tier segments \(CPU, DISK\); load them with prepare_load_segments"):
        mgr.prepare_load([3, 1])
    assert not np.any(cpu.index.debug_snapshot().ref_cnt[:2]) and not np.any(disk.index.debug_snapshot().ref_cnt[:2])
    assert mgr.prepare_load([3, 4]).block_ids.tolist() == [1, 0]  # one tier: one spec


def test_a_chain_that_names_no_host_index_reads_as_empty():
    """A user's own TierChain need not name a host tier: vLLM's recency calls then reach an
    index that holds nothing (as the chain's recency defaults once did nothing)."""
    from kvoffload.offload.chain import TierChain
    from kvoffload.offload.empty_chain import EmptyTierChain

    class Mine(TierChain):
        def lookup(self, block_hashes):
            return 0

        def prepare_load(self, block_hashes):
            raise AssertionError("nothing to load")

        def prepare_store(self, block_hashes):
            return None

    for chain in (Mine(), EmptyTierChain()):
        chain.host.refresh([1, 2])
        chain.host.touch([1])
        assert chain.host.lookup([1]) == 0 and not chain.host.is_ready(1) and chain.host.store_miss([1]) == []
