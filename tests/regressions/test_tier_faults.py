"""Defects 1, 3, 6, 7: swap + disk, persistent read errors, misplaced records, exact pins."""

import os
import random

import pytest
import torch

from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.offload.cpu_tier import CPUOffloadingManager
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.testing.faults import FaultScript, FaultyOffloadingSpec
from kvoffload.tiers.disk.format import HEADER_BYTES, RECORD_HEADER, DiskLayout
from kvoffload.tiers.disk.tier import DiskTier

torch.set_num_threads(1)
BLOCK_BYTES = 8192


def _prompts(seed):
    rng = random.Random(seed)
    return [[rng.randrange(1, 250) for _ in range(rng.randrange(60, 150))] for _ in range(10)]


def _two_rounds(offload, prompts, mode="recompute", blocks=24):
    cfg = EngineConfig(num_gpu_blocks=blocks, max_num_seqs=8, max_num_batched_tokens=256, kv_offload=offload,
                       preemption_mode=mode)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    with LLM(cfg) as llm:
        first = [o.token_ids for o in llm.generate(prompts, params)]
        llm.reset_prefix_cache()
        return first + [o.token_ids for o in llm.generate(prompts, params)], llm.stats()


def _tiers(path, cpu_blocks, write_through=False, **extra):
    cfg = {"tiers": [{"medium": "cpu", "capacity": cpu_blocks * BLOCK_BYTES},
                     {"medium": "disk", "path": str(path), "capacity": "64MiB", "write_through": write_through}]}
    cfg.update(extra)
    return cfg


@pytest.mark.parametrize("seed, cpu_blocks, write_through", [(1, 8, False), (2, 16, False), (1, 16, True), (2, 4, False)])
def test_swap_preemption_with_a_disk_tier_serves_identical_tokens(tmp_path, seed, cpu_blocks, write_through):
    # Swap-outs are planned inside schedule() and evict CPU blocks whose demotions are planned in
    # the same step: the demotions must read those slots before the swap-out stores overwrite them,
    # and a swapped request whose blocks were demoted meanwhile swaps in from both tiers.
    prompts = _prompts(seed)
    expected, _ = _two_rounds(None, prompts)
    got, stats = _two_rounds(_tiers(tmp_path, cpu_blocks, write_through), prompts, mode="swap")
    assert got == expected
    assert stats["connector"]["demoted_blocks"] > 0
    assert stats["swapped_out_tokens"] > 0 or cpu_blocks == 4  # 4 slots: swap-outs fall back, after storing


def _faulty(tmp_path, script, cpu_blocks=8):
    FaultyOffloadingSpec.script = script
    return _tiers(tmp_path, cpu_blocks, spec_name="FaultyOffloadingSpec", spec_module_path="kvoffload.testing.faults")


def test_persistent_read_errors_drop_blocks_and_take_the_tier_out_of_service(tmp_path, caplog):
    prompts = _prompts(3)
    expected, _ = _two_rounds(None, prompts)
    got, stats = _two_rounds(_faulty(tmp_path, FaultScript(read_error=1.0)), prompts)
    assert got == expected
    c = stats["connector"]
    # Every failed read dropped its block, and three failures in a row closed the tier: a
    # bounded number of failed loads, not one per retry forever.
    assert c["failed_load_blocks"] >= 3 and c["corrupt_blocks"] >= 3
    assert 3 <= stats["transfer"]["disk_to_device"]["failed"] <= 3 + 8  # + loads already in flight
    assert c["tier_outages"]["disk"] == 1
    assert sum("out of service" in r.getMessage() for r in caplog.records) == 1


def test_a_record_moved_to_another_slot_is_never_served(tmp_path):
    prompts = _prompts(4)
    expected, _ = _two_rounds(None, prompts)
    cfg = EngineConfig(num_gpu_blocks=24, max_num_seqs=8, max_num_batched_tokens=256,
                       kv_offload=_tiers(tmp_path, 4, write_through=True))
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    with LLM(cfg) as llm:
        got = [o.token_ids for o in llm.generate(prompts, params)]
        llm.reset_prefix_cache()
        (name,) = [tmp_path / f for f in os.listdir(tmp_path) if f.endswith(".kvdata")]
        record = RECORD_HEADER + BLOCK_BYTES
        data = bytearray(name.read_bytes())
        # Intact records with valid checksums, each now in the slot the ledger gave the other.
        for i in range(0, 16, 2):
            a, b = HEADER_BYTES + i * record, HEADER_BYTES + (i + 1) * record
            data[a : a + record], data[b : b + record] = data[b : b + record], data[a : a + record]
        name.write_bytes(bytes(data))
        got += [o.token_ids for o in llm.generate(prompts, params)]
        stats = llm.stats()
    assert got == expected
    assert stats["connector"]["corrupt_blocks"] >= 1
    assert stats["connector"]["failed_load_blocks"] >= 1


def test_pins_are_released_per_load_even_when_a_hash_is_pinned_in_both_tiers(tmp_path):
    cpu = CPUOffloadingManager(4)
    disk = DiskTier(tmp_path, DiskLayout("d", 64, 16, 4))
    tiered = HostTierChain(cpu, disk)
    disk.prepare_store([7])
    disk.complete_store([7])
    (disk_spec, hashes), = tiered.prepare_load_segments([7])  # load A reads it from disk
    assert disk_spec.medium() == "DISK" and disk_spec.block_hashes == [7]
    tiered.prepare_store([7])  # promoted into the CPU tier
    tiered.complete_store([7])
    (cpu_spec, _), = tiered.prepare_load_segments([7])  # load B reads it from CPU
    assert cpu_spec.medium() == "CPU"
    tiered.complete_load([7], "DISK")  # load A lands first
    assert cpu.index.debug_snapshot().refs[cpu.index.slot_of(7)] == 1  # B still pins the CPU copy
    assert disk.index.debug_snapshot().refs[disk.index.slot_of(7)] == 0
    assert cpu.prepare_store([1, 2, 3, 4]) is None  # the pinned block cannot be evicted
    tiered.complete_load([7], "CPU")
    assert cpu.index.debug_snapshot().refs[cpu.index.slot_of(7)] == 0
    with pytest.raises(ValueError, match="needs the medium"):
        tiered.complete_load([7])
    disk.close()


def test_eio_from_the_real_disk_reader_is_bounded_and_recomputed(tmp_path, monkeypatch):
    # The disk handler's own preadv fails with EIO from round 2 on (no wrapper): each failed
    # read drops its block, three in a row take the tier out of service, tokens stay identical.
    import errno

    from kvoffload.tiers.disk import io as disk_handler

    prompts = _prompts(5)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    cfg = EngineConfig(num_gpu_blocks=24, max_num_seqs=8, max_num_batched_tokens=256,
                       kv_offload=_tiers(tmp_path, 4, write_through=True))
    with LLM(EngineConfig(num_gpu_blocks=24, max_num_seqs=8, max_num_batched_tokens=256)) as ref:
        expected = [o.token_ids for o in ref.generate(prompts, params)]
    with LLM(cfg) as llm:
        assert [o.token_ids for o in llm.generate(prompts, params)] == expected
        llm.reset_prefix_cache()

        def eio(*args, **kwargs):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(disk_handler.os, "preadv", eio)
        assert [o.token_ids for o in llm.generate(prompts, params)] == expected
        stats = llm.stats()
    c = stats["connector"]
    assert c["tier_outages"]["disk"] == 1 and 3 <= c["tier_io_errors"]["disk"] <= 3 + 8
    assert stats["transfer"]["disk_to_device"]["failed"] == c["tier_io_errors"]["disk"]
