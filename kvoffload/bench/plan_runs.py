"""The live runs ``bench plan`` checks `kvoffload plan` against, on either engine: one run of a
workload without offload (its request log is what `plan` reads) and one per tier chain, each
giving the turns a client saw and the tokens each tier served (the engine's own counters)."""

from __future__ import annotations

import math
import os
import statistics
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvoffload.bench.serve_workloads import Workload
from kvoffload.plan.profile import EngineSpeed, TierSpeed
from kvoffload.plan.tier_spec import PlannedTier

#: Cores each vLLM server leaves to its API process (as ``bench serve`` runs it).
RESERVED_CPUS = 1

#: (session id, turn, the client's Completion) of every request of a run.
Turns = list[tuple[str, int, Any]]


@dataclass(slots=True)
class Measured:
    turns: Turns
    #: Tokens served from each tier (by medium), as the engine counted them.
    tier_tokens: dict[str, float]
    #: What else the report shows of the run (preemptions, loads the cost model saw).
    remark: str = ""
    #: Each tier's loads as the engine's cost model timed them in this run (in service), by medium.
    loads_seen: dict[str, TierSpeed] | None = None
    #: The engine's steps as timed in this run (with its tiers: stores and loads included), and
    #: its median step that computed nothing (a load sent off or awaited), where they were timed.
    engine_seen: EngineSpeed | None = None


def engine_tiers(chain: tuple[PlannedTier, ...], directory: str) -> list[dict[str, Any]]:
    """kvoffload's ``tiers`` config for a chain `plan` prices (a disk's file in ``directory``)."""
    out: list[dict[str, Any]] = []
    for t in chain:
        tier: dict[str, Any] = {"name": t.medium, "medium": t.medium, "capacity": f"{t.size_bytes}B",
                                "eviction_policy": t.policy}
        if t.write_through:
            tier["write_through"] = True
        if t.medium == "disk":
            tier["path"] = directory
        out.append(tier)
    return out


class LiveRuns(ABC):
    """One engine's runs of one workload, a device cache of ``device_blocks`` blocks."""

    block_tokens: int

    @abstractmethod
    def base(self) -> tuple[Turns, EngineSpeed]:
        """The run without offload, and the engine's speed to price it with: fitted on the run's
        own steps (bundled), or vLLM's steps timed offline before the servers started."""

    @abstractmethod
    def with_tiers(self, label: str, chain: tuple[PlannedTier, ...]) -> Measured:
        """The run with ``chain`` behind the device cache."""

    @abstractmethod
    def close(self) -> None:
        """Stops whatever the runs started."""


class BundledRuns(LiveRuns):
    """The bundled engine in this process, a fresh engine per run."""

    block_tokens = 16

    def __init__(self, wl: Workload, device_blocks: int, mbt: int, work: Path) -> None:
        self.wl, self.device_blocks, self.mbt, self.work = wl, device_blocks, mbt, work
        self.runs = 0

    def _run(self, tiers: list[dict[str, Any]] | None,
             steps: list[tuple[dict[str, float], float]] | None = None) -> tuple[Turns, dict[str, Any]]:
        from kvoffload.bench.profile_bench import StepRecorder
        from kvoffload.bench.serve_bundled import run_bundled
        from kvoffload.engine import LLM, EngineConfig

        bt = self.block_tokens
        max_len = math.ceil((self.wl.max_context + 1) / bt) * bt
        cfg = EngineConfig(model="tiny", block_size=bt, num_gpu_blocks=self.device_blocks + 1, max_model_len=max_len,
                           max_num_seqs=max(8, self.wl.concurrency), max_num_batched_tokens=self.mbt,
                           kv_offload=None if tiers is None else {"tiers": tiers, "load_mode": "async"})
        with LLM(cfg) as llm:
            rec = StepRecorder(llm) if steps is not None else None  # only the timed run is wrapped
            if rec is not None:
                llm.step = rec.step  # type: ignore[method-assign]
            turns, _ = run_bundled(llm, self.wl)
            if rec is not None and steps is not None:
                steps.extend(rec.rows)
            return turns, llm.stats()

    def base(self) -> tuple[Turns, EngineSpeed]:
        from kvoffload.bench.step_fit import fit_steps

        steps: list[tuple[dict[str, float], float]] = []
        turns, _ = self._run(None, steps)
        return turns, fit_steps(steps, self.mbt, "tiny")

    def with_tiers(self, label: str, chain: tuple[PlannedTier, ...]) -> Measured:
        from kvoffload.bench.step_fit import fit_steps

        self.runs += 1  # a fresh directory each run: a disk tier keeps its records across restarts
        steps: list[tuple[dict[str, float], float]] = []
        turns, stats = self._run(engine_tiers(chain, str(self.work / f"{label}-{self.runs}")), steps)
        empty = [t for terms, t in steps if not terms["token_s"] and not terms["decode_s"]]
        busy = [(terms, t) for terms, t in steps if terms["token_s"] or terms["decode_s"]]
        cost = stats["connector"]["load_cost"]
        seen = cost["kvoffload_tier_load_bytes_per_second"]
        latency = cost["kvoffload_tier_load_latency_seconds"]
        remark = (f" [{stats['preemptions']} preemptions]" if stats["preemptions"] else "") \
            + "; loads seen " + ", ".join(f"{m} {bw / 1e9:.2f} GB/s" for m, bw in seen.items())
        loads = {m: TierSpeed(bw / 1e9, bw / 1e9, latency.get(m, 0.0), 0.0) for m, bw in seen.items() if bw > 0}
        idle = statistics.median(empty) if empty else 0.0
        remark += f"; {len(empty)} empty steps, median {idle * 1e3:.2f} ms" if empty else ""
        engine = replace(fit_steps(busy, self.mbt, "tiny"), idle_step_s=idle) if busy else None
        return Measured(turns, {t.medium: stats["prefix_hit_tokens"].get(t.medium, 0) for t in chain}, remark, loads,
                        engine)

    def close(self) -> None:
        pass


class ServedRuns(LiveRuns):
    """Real ``vllm serve`` processes over HTTP (this python must have vLLM): one server without
    offload and one per chain, started once and reset cold before every run; the engine's speed
    is vLLM's steps timed offline with the same settings."""

    block_tokens = 128  # vLLM's CPU backend

    def __init__(self, wl: Workload, device_blocks: int, mbt: int, work: Path, model: str, load_dummy: bool,
                 chains: dict[str, tuple[PlannedTier, ...]], vocab: int) -> None:
        from kvoffload.bench.serve_configs import kv_transfer_config, server_flags
        from kvoffload.bench.vllm_steps import vllm_engine_speed
        from kvoffload.testing.vllm_server import VllmServer

        self.wl = wl
        bt = self.block_tokens
        settings: dict[str, Any] = {
            "dtype": "float32", "max_num_seqs": max(8, wl.concurrency), "gpu_memory_utilization": 0.1,
            "max_model_len": math.ceil((wl.max_context + 1) / bt) * bt, "num_gpu_blocks_override": device_blocks,
            "max_num_batched_tokens": mbt}
        if load_dummy:
            settings["load_format"] = "dummy"
        flags = server_flags(settings)
        env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": str(RESERVED_CPUS)}
        # First, on a quiet machine (no server runs yet). The server's engine process binds one
        # OpenMP thread a core left after the reserved one; offline, in one process, vLLM binds
        # none and torch takes every core (1024-token prefills 0.55 s vs the server's 1.0 s here).
        print("  timing vLLM's steps offline ...", flush=True)
        threads = str(max(1, (os.cpu_count() or 2) - RESERVED_CPUS))
        self._engine = vllm_engine_speed(model, settings, 2, vocab, {**env, "OMP_NUM_THREADS": threads})
        kv = {label: kv_transfer_config({"tiers": engine_tiers(c, str(work / label)), "load_mode": "async"})
              for label, c in chains.items()}
        self.servers: dict[str | None, Any] = {}
        try:
            for label in [None, *chains]:
                name = label or "plain"
                self.servers[label] = VllmServer(model, work / f"{name.replace('+', '_')}.log",
                                                 None if label is None else kv[label], extra_args=flags, env=env)
                print(f"  starting vllm serve: {name} ...", flush=True)
                self.servers[label].start()
        except BaseException:
            self.close()
            raise

    def _once(self, label: str | None) -> tuple[Turns, dict[str, float]]:
        from kvoffload.bench.serve_runs import run_once

        res = run_once(label or "plain", self.servers[label], self.wl, None)
        return [(t.sid, t.turn, t.completion) for t in res.turns], res.hits

    def base(self) -> tuple[Turns, EngineSpeed]:
        from kvoffload.bench.profile_scrape import checked, request_overhead, scrape
        from kvoffload.plan.profile import Profile

        turns = self._once(None)[0]  # the plain server's front end, from its own /metrics
        url = self.servers[None].url
        engine = replace(self._engine, request_s=request_overhead(scrape(url)))
        return turns, checked(Profile(engine), url).engine

    def with_tiers(self, label: str, chain: tuple[PlannedTier, ...]) -> Measured:
        from kvoffload.bench.profile_scrape import checked, request_overhead, scrape, step_overheads, tier_speeds
        from kvoffload.plan.profile import Profile, ProfileError

        turns, hits = self._once(label)
        engine = None
        try:  # what the server's cost model timed, read from its /metrics as `bench profile --from` does
            metrics = scrape(self.servers[label].url)
            loads, _ = tier_speeds(metrics)
            idle, per_load = step_overheads(metrics)  # the steps' own terms stay the offline fit's
            front = request_overhead(metrics)
            served = checked(Profile(replace(self._engine, idle_step_s=idle, load_step_s=per_load, request_s=front),
                                     loads), self.servers[label].url)
        except ProfileError as exc:
            loads, remark = {}, f"; no loads timed in service ({exc})"
        else:
            engine, loads = served.engine, served.tiers
            remark = ("; loads seen " + ", ".join(f"{m} {s.load_gb_per_s:.2f} GB/s" for m, s in loads.items())
                      + f"; an idle step {idle * 1e3:.1f} ms, a load adds {per_load * 1e3:.1f} ms, the front end "
                      f"{front * 1e3:.1f} ms")
        return Measured(turns, {t.medium: hits.get(t.medium, 0.0) for t in chain}, remark, loads, engine)

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
