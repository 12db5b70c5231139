"""Chaos harness: random configurations and fault plans, checked against a no-offload run.

Each case draws tiers (CPU, CPU + disk write-back, CPU + disk write-through, either with a
third tier behind the disk: the in-memory test tier or an fs directory), an eviction
policy, the reuse filter, the offloaded-block factor, recompute or swap preemption, greedy /
parallel sampling / beam search, a device cache from tiny to roomy, and a fault script: failed
reads (EIO), writes (ENOSPC) and stores, slow copies, a throttled disk, flipped or relocated disk records
between rounds, a restart on the same disk path (clean, or after kill -9 of a child process
that was writing). It runs two rounds of shared-prefix prompts and checks that the tokens
equal the reference engine's, that nothing raised or stalled, and that no file descriptor or
thread leaked. A case is reproduced from its seed alone.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.testing.faults import FaultScript, FaultyOffloadingSpec
from kvoffload.testing.throttle import ThrottledOffloadingSpec, parse_throttles

POLICIES = ("lru", "arc", "s3fifo", "sieve", "lfu", "arc_classic", "prefix_value")
BLOCK_BYTES = 8192  # the tiny model's KV per 16-token block
#: The hybrid model's (Gemma 3 shaped, window 32): 4 KV-cache groups of one layer sharing one
#: tensor, so a block is a quarter of the memory and the same device memory is 4x the blocks.
HYBRID_BLOCK_BYTES = 4096
HYBRID_BLOCKS_PER_MEMORY = 4


@dataclass(frozen=True, slots=True)
class ChaosCase:
    seed: int
    tiers: str  # cpu | writeback | writethrough
    policy: str
    reuse_filter: bool
    factor: int
    preemption: str
    sampling: str  # greedy | n | beam
    device_blocks: int
    cpu_blocks: int
    disk_blocks: int
    faults: FaultScript
    mutate: str  # none | flip | relocate
    restart: str  # none | clean | kill
    #: Blocks of a third tier behind the disk (the in-memory test tier), 0 for none.
    remote_blocks: int = 0
    #: "tiny", or "tiny-hybrid" (sliding-window + full-attention groups; window 32 against
    #: offloaded blocks of 16, 32 or 64 tokens).
    model: str = "tiny"
    #: What the third tier is: the in-memory test tier, or an fs directory (shared with the
    #: killed child of a "kill" restart, like the disk path).
    shared: str = "memory"
    #: How hits are served (``load_mode``): layer-wise loads meet preemption, faults, corruption.
    load_mode: str = "auto"
    #: A throttle on the disk tier's I/O (``disk:20MB/s:5ms``; "" for none): the cost model
    #: recomputes, probes and warms up a slow tier while faults and preemption go on.
    slow: str = ""


class SlowFaultyOffloadingSpec(ThrottledOffloadingSpec, FaultyOffloadingSpec):
    """Faulty handlers over throttled tiers (``throttles`` set per case)."""


def draw_case(seed: int) -> ChaosCase:
    """Draws lean towards pressure (small caches, swap at block factor 1) and leave 40% of
    cases fault-free: the interleaving bugs this hunts need a full CPU tier, preemption and
    the corrupted block read back, which random faults would often drop first."""
    rng = random.Random(seed)
    tiers = rng.choice(("cpu", "writeback", "writeback", "writethrough"))
    disk = tiers != "cpu"
    clean = rng.random() < 0.4
    faults = FaultScript(
        read_error=0.0 if clean or not disk else rng.choice((0.0, 0.1, 0.5, 1.0)),
        write_error=0.0 if clean or not disk else rng.choice((0.0, 0.2, 1.0)),
        store_error=0.0 if clean else rng.choice((0.0, 0.1)),
        delay=0.0 if clean else rng.choice((0.0, 0.3)),
        seed=seed,
    )
    preemption = rng.choice(("recompute", "swap"))
    factor = 1 if preemption == "swap" and rng.random() < 0.75 else rng.choice((1, 2, 4))
    return ChaosCase(
        seed=seed,
        tiers=tiers,
        policy=rng.choice(POLICIES),
        reuse_filter=rng.random() < 0.25,
        factor=factor,
        preemption=preemption,
        sampling=rng.choice(("greedy", "greedy", "n", "beam")),
        device_blocks=rng.choice((20, 24, 24, 32, 48, 96)),
        cpu_blocks=rng.choice((4, 8, 8, 16, 64)),
        disk_blocks=rng.choice((8, 32, 128)),
        faults=faults,
        mutate="none" if clean or not disk else rng.choice(("none", "flip", "relocate")),
        restart="none" if not disk else rng.choice(("none", "none", "clean", "kill")),
        # Drawn last, so every earlier draw of a seed is what it always was.
        remote_blocks=rng.choice((0, 0, 8, 64)) if disk else 0,
        model=rng.choice(("tiny", "tiny", "tiny-hybrid")),
        shared=rng.choice(("memory", "memory", "fs")),
        load_mode=rng.choice(("auto", "auto", "layerwise", "async", "never-recompute")),
        slow=rng.choice(("", "", "disk:20MB/s:5ms", "disk:2MB/s:20ms")) if disk else "",
    )


@dataclass(slots=True)
class CaseResult:
    case: ChaosCase
    ok: bool
    error: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed * 31 + 7)
    prefixes = [[rng.randrange(1, 250) for _ in range(rng.randrange(16, 80))] for _ in range(3)]
    return [rng.choice(prefixes) + [rng.randrange(1, 250) for _ in range(rng.randrange(8, 72))] for _ in range(10)]


def _params(case: ChaosCase) -> SamplingParams:
    if case.sampling == "n":
        return SamplingParams(max_tokens=16, n=2, temperature=0.8, seed=case.seed, ignore_eos=True)
    if case.sampling == "beam":
        return SamplingParams(max_tokens=8, beam_width=2, ignore_eos=True)
    return SamplingParams(max_tokens=32, ignore_eos=True)


def _offload(case: ChaosCase, path: str) -> dict[str, Any]:
    block = (HYBRID_BLOCK_BYTES if case.model == "tiny-hybrid" else BLOCK_BYTES) * case.factor
    tiers: list[dict[str, Any]] = [{"medium": "cpu", "capacity": case.cpu_blocks * block, "eviction_policy": case.policy}]
    if case.tiers != "cpu":
        tiers.append({"medium": "disk", "path": path, "capacity": case.disk_blocks * block,
                      "eviction_policy": case.policy, "write_through": case.tiers == "writethrough"})
    if case.remote_blocks and case.shared == "fs":
        tiers.append({"medium": "fs", "path": os.path.join(path, "fs"), "capacity": case.remote_blocks * block})
    elif case.remote_blocks:
        tiers.append({"medium": "kvoffload.testing.memory_tier:MemoryKind", "capacity": case.remote_blocks * block,
                      "eviction_policy": case.policy})
    spec = ("SlowFaultyOffloadingSpec", "kvoffload.testing.chaos") if case.slow else (
        "FaultyOffloadingSpec", "kvoffload.testing.faults")
    cfg: dict[str, Any] = {"tiers": tiers, "offloaded_block_size": 16 * case.factor, "load_mode": case.load_mode,
                           "spec_name": spec[0], "spec_module_path": spec[1]}
    if case.reuse_filter:
        cfg["store_threshold"] = 2
    return cfg


def _engine(case: ChaosCase, offload: dict[str, Any] | None) -> EngineConfig:
    hybrid = case.model == "tiny-hybrid"
    return EngineConfig(model=case.model, num_gpu_blocks=case.device_blocks * (HYBRID_BLOCKS_PER_MEMORY if hybrid else 1),
                        max_num_seqs=8, max_num_batched_tokens=256, kv_offload=offload,
                        preemption_mode=case.preemption if offload else "recompute")


def _outputs(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[Any]:
    outs = llm.generate(prompts, params)
    return [(o.token_ids, o.samples) for o in outs]


def _mutate(path: str, how: str, rng: random.Random) -> None:
    """Flip bytes inside one record's data, or copy one intact record over another's slot."""
    from kvoffload.tiers.disk.format import HEADER_BYTES, RECORD_HEADER

    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".kvdata")]
    for name in files:
        record = RECORD_HEADER + BLOCK_BYTES * _factor_of(name)
        size = os.path.getsize(name)
        slots = [s for s in range(min(64, (size - HEADER_BYTES) // record)) if _has_record(name, HEADER_BYTES + s * record)]
        if len(slots) < 2:
            continue
        with open(name, "r+b") as f:
            a, b = rng.sample(slots, 2)
            if how == "flip":
                f.seek(HEADER_BYTES + a * record + RECORD_HEADER + 17)
                chunk = f.read(8)
                f.seek(HEADER_BYTES + a * record + RECORD_HEADER + 17)
                f.write(bytes(x ^ 0xA5 for x in chunk))
            else:  # relocate: an intact record of block b now sits in slot a
                f.seek(HEADER_BYTES + b * record)
                data = f.read(record)
                f.seek(HEADER_BYTES + a * record)
                f.write(data)


def _factor_of(name: str) -> int:
    return int(name.rsplit("-", 1)[1].split(".")[0]) // BLOCK_BYTES


def _has_record(name: str, off: int) -> bool:
    with open(name, "rb") as f:
        f.seek(off)
        return f.read(4) == b"KVB1"


_KILL_CHILD = """
import sys, time
from kvoffload.engine import LLM
from kvoffload.testing.chaos import SlowFaultyOffloadingSpec, _engine, _offload, _prompts, _params, draw_case
from kvoffload.testing.throttle import parse_throttles
case = draw_case(int(sys.argv[1]))
SlowFaultyOffloadingSpec.throttles = parse_throttles(case.slow)
llm = LLM(_engine(case, _offload(case, sys.argv[2])))
print("ready", flush=True)
while True:
    llm.generate(_prompts(case.seed + 1), _params(case))
    llm.reset_prefix_cache()
"""


def _kill_mid_run(case: ChaosCase, path: str) -> None:
    """A child writes the same disk path; kill -9 it while it runs."""
    child = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(case.seed), path],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout is not None
        child.stdout.readline()
        import time

        time.sleep(random.Random(case.seed).uniform(0.2, 1.0))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def _resources() -> tuple[int, int]:
    return len(os.listdir("/proc/self/fd")), threading.active_count()


def run_case(case: ChaosCase, reference: dict[tuple[Any, ...], Any] | None = None) -> CaseResult:
    """Run one case; ``reference`` caches no-offload outputs across cases that share them."""
    import kvoffload.engine.llm as llm_module

    prompts, params = _prompts(case.seed), _params(case)
    ref_key = (case.seed, case.device_blocks, case.sampling, case.model)
    path = tempfile.mkdtemp(prefix="kvoffload-chaos-")
    FaultyOffloadingSpec.script = case.faults
    FaultyOffloadingSpec.handlers = []
    SlowFaultyOffloadingSpec.throttles = parse_throttles(case.slow)
    saved_idle = llm_module._MAX_IDLE_STEPS
    llm_module._MAX_IDLE_STEPS = 20_000
    stats: dict[str, Any] = {}
    try:
        if reference is None or ref_key not in reference:
            with LLM(_engine(case, None)) as llm:
                expected = _outputs(llm, prompts, params)
            if reference is not None:
                reference[ref_key] = expected
        else:
            expected = reference[ref_key]
        before = _resources()
        if case.restart == "kill":
            _kill_mid_run(case, path)
        offload = _offload(case, path)
        llm = LLM(_engine(case, offload))
        try:
            got = [_outputs(llm, prompts, params)]
            llm.reset_prefix_cache()
            if case.mutate != "none" or case.restart == "clean":
                llm.close()
                if case.mutate != "none":
                    _mutate(path, case.mutate, random.Random(case.seed))
                llm = LLM(_engine(case, offload))
            got.append(_outputs(llm, prompts, params))
            stats = llm.stats()
        finally:
            llm.close()
        after = _resources()
        for i, outs in enumerate(got):
            if outs != expected:
                bad = [j for j, (a, b) in enumerate(zip(outs, expected)) if a != b]
                return CaseResult(case, False, f"round {i + 1}: outputs differ from the reference at prompts {bad}", stats)
        if after[0] > before[0]:
            return CaseResult(case, False, f"leaked {after[0] - before[0]} file descriptors", stats)
        if after[1] > before[1]:
            return CaseResult(case, False, f"leaked {after[1] - before[1]} threads", stats)
        return CaseResult(case, True, "", stats)
    except Exception as exc:  # noqa: BLE001 - the harness reports every failure with its case
        return CaseResult(case, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}", stats)
    finally:
        llm_module._MAX_IDLE_STEPS = saved_idle
        shutil.rmtree(path, ignore_errors=True)


def describe(case: ChaosCase) -> str:
    d = asdict(case)
    faults = {k: v for k, v in d.pop("faults").items() if v and k not in ("seed", "max_delay_polls")}
    return " ".join(f"{k}={v}" for k, v in d.items()) + f" faults={faults or 'none'}"
