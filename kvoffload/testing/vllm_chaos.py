"""Chaos over HTTP against a real ``vllm serve`` + kvoffload: concurrent streaming clients that
disconnect at random moments, sampled ``n=2`` requests with their own seeds, prefix-cache resets
(device only, and with ``reset_external``) while loads are in flight, and disk records flipped
or fs records flipped, truncated, deleted and swapped under the running server, under either
``kv_load_failure_policy``. The server runs without chunked prefill, as docs/production.md
says to serve seeded requests on vLLM 0.32's CPU build, which dies on a seeded request whose
prefill is split ("CPU Generator does not use offset"): under ``recompute`` a failed load
makes a whole prefill, and under ``fail`` a step at its 2,048-token budget split a seeded n=2
request's 552-token miss (a CI run on a busy machine: vLLM's own bug, no load involved).

Checks: the server stays up; every completed response equals plain vLLM's (same prompt, same
sampling); under ``fail`` a request may fail, cleanly; once traffic stops and the device
cache is reset, vLLM's KV-cache usage is back at 0 (no block leaked).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvoffload.testing.http_client import Completion, stream_completion
from kvoffload.testing.vllm_server import VllmServer

BLOCK = 128  # vLLM's CPU backend block size
#: Small device cache (blocks of 128 tokens): the pool's prompts evict each other, so they
#: come back through kvoffload's tiers.
DEVICE_BLOCKS = 40


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    model: str
    duration_s: float = 20.0
    clients: int = 16
    abort_rate: float = 0.3
    sampled_rate: float = 0.3  # n=2 with a seed
    reset_every_s: float = 3.0
    corrupt_every_s: float = 1.0  # disk and fs configurations only
    max_tokens: int = 8
    seed: int = 0


@dataclass(slots=True)
class ChaosReport:
    name: str
    sent: int = 0
    completed: int = 0
    aborted: int = 0
    failed_cleanly: int = 0
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    resets: int = 0
    corruptions: int = 0
    #: kvoffload's counters at the end (tier hits, failed hits, rejected blocks), from /metrics.
    counters: dict[str, float] = field(default_factory=dict)
    alive: bool = True
    usage_after: float | None = None
    final_round_ok: bool = True

    @property
    def ok(self) -> bool:
        return (self.alive and not self.mismatches and not self.errors and self.final_round_ok
                and self.usage_after == 0.0)

    def line(self) -> str:
        return (f"{self.name}: {self.sent} requests, {self.completed} completed, {self.aborted} aborted by their "
                f"client, {self.failed_cleanly} failed cleanly, {len(self.mismatches)} wrong, {len(self.errors)} "
                f"errors; {self.resets} resets, {self.corruptions} corrupted records; server "
                f"{'up' if self.alive else 'DOWN'}, KV usage after reset {self.usage_after}, final round "
                f"{'identical' if self.final_round_ok else 'DIFFERENT'} -> {'ok' if self.ok else 'FAIL'}"
                + "".join(f"\n     {k} = {v:g}" for k, v in sorted(self.counters.items())))


def prompt_pool(seed: int = 0, prefixes: int = 10, suffixes: int = 3) -> list[list[int]]:
    """Prompts of 2-3 full blocks sharing 2-block prefixes: hits at every level."""
    rng = random.Random(seed)
    pool = []
    for _ in range(prefixes):
        prefix = [rng.randrange(1, 500) for _ in range(2 * BLOCK)]
        for s in range(suffixes):
            pool.append(prefix + [rng.randrange(1, 500) for _ in range(40 + s * BLOCK)])
    return pool


def kvoffload_config(tiers: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    return {"kv_connector": "KVOffloadConnector", "kv_role": "kv_both", "kv_load_failure_policy": policy,
            "kv_connector_extra_config": {"config": {"tiers": tiers}}}


def _server_args(split_prefills: bool = True) -> list[str]:
    # float32: a random model's logits are nearly flat, and in bfloat16 two candidates can be
    # within rounding of each other (a margin of 0.008 was seen); then a different batch mix
    # (another kernel path) flips the greedy choice in plain vLLM as well as with any connector.
    args = ["--max-model-len", "1024", "--dtype", "float32", "--num-gpu-blocks-override", str(DEVICE_BLOCKS),
            "--max-num-seqs", "8"]
    return args if split_prefills else [*args, "--no-enable-chunked-prefill"]


async def _reference(url: str, model: str, pool: list[list[int]], max_tokens: int) -> dict[tuple[int, bool], Completion]:
    import aiohttp

    out = {}
    async with aiohttp.ClientSession() as session:
        for i, prompt in enumerate(pool):
            for sampled in (False, True):
                c = await stream_completion(session, url, model, prompt, max_tokens, n=2 if sampled else 1,
                                            seed=1000 + i if sampled else None)
                if not c.ok:
                    raise RuntimeError(f"plain vLLM failed on prompt {i}: {c.error or c.finish}")
                out[(i, sampled)] = c
    return out


def reference_outputs(cfg: ChaosConfig, workdir: Path) -> dict[tuple[int, bool], Completion]:
    with VllmServer(cfg.model, workdir / "plain.log", extra_args=_server_args()) as server:
        return asyncio.run(_reference(server.url, cfg.model, prompt_pool(cfg.seed), cfg.max_tokens))


def _corrupt_one(directory: Path, rng: random.Random) -> bool:
    """One record damaged: a disk tier's file flipped in place, or an fs tier's record flipped,
    truncated, deleted or swapped with another (a valid record under the wrong name)."""
    if (directory / "kvoffload-fs.json").exists():
        return _corrupt_fs_record(directory, rng)
    files = sorted(directory.glob("*.kvdata"))
    if not files:
        return False
    path = files[0]
    size = path.stat().st_size
    if size <= 4096 + 64:
        return False
    with open(path, "r+b") as f:
        for _ in range(8):  # find a written record (the file is sparse)
            off = rng.randrange(4096, size - 64)
            f.seek(off)
            if any(f.read(64)):
                f.seek(off)
                f.write(bytes(rng.randrange(256) for _ in range(16)))
                return True
    return False


def _corrupt_fs_record(root: Path, rng: random.Random) -> bool:
    records = sorted(root.glob("b*/*.kv"))
    if len(records) < 2:
        return False
    path, other = rng.sample(records, 2)
    how = rng.choice(("flip", "truncate", "delete", "swap"))
    try:
        if how == "flip":
            raw = bytearray(path.read_bytes())
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(raw))
        elif how == "truncate":
            with open(path, "r+b") as f:
                f.truncate(rng.randrange(path.stat().st_size))
        elif how == "delete":
            path.unlink()
        else:
            a, b = path.read_bytes(), other.read_bytes()
            path.write_bytes(b)
            other.write_bytes(a)
    except OSError:  # evicted meanwhile by the server: another round will find one
        return False
    return True


async def _traffic(cfg: ChaosConfig, server: VllmServer, ref: dict[tuple[int, bool], Completion],
                   report: ChaosReport, corrupt_dir: Path | None, policy: str) -> None:
    import aiohttp

    pool = prompt_pool(cfg.seed)
    rng = random.Random(cfg.seed)
    deadline = time.monotonic() + cfg.duration_s

    async def client(cid: int, session: Any) -> None:
        crng = random.Random(cfg.seed * 1000 + cid)
        while time.monotonic() < deadline:
            i = crng.randrange(len(pool))
            sampled = crng.random() < cfg.sampled_rate
            # Most disconnects land while the request waits, loads or prefills; some during decode.
            abort = crng.uniform(0.0, 0.15) if crng.random() < cfg.abort_rate else None
            report.sent += 1
            c = await stream_completion(session, server.url, cfg.model, pool[i], cfg.max_tokens, abort,
                                        n=2 if sampled else 1, seed=1000 + i if sampled else None)
            if c.aborted:
                report.aborted += 1
            elif c.error or c.status != 200 or "error" in c.finish.values():
                if policy == "fail" and server.alive():
                    report.failed_cleanly += 1  # its block failed to load: that request, not the server
                else:
                    report.errors.append(f"prompt {i}: HTTP {c.status} {c.error[:200] or c.finish}")
            else:
                report.completed += 1
                if c.tokens != ref[(i, sampled)].tokens:
                    report.mismatches.append(f"prompt {i} (sampled={sampled}): {c.tokens} != {ref[(i, sampled)].tokens}")

    async def resetter(session: Any) -> None:
        n = 0
        while time.monotonic() < deadline:
            await asyncio.sleep(cfg.reset_every_s)
            n += 1
            external = "true" if n % 3 == 0 else "false"
            try:
                async with session.post(f"{server.url}/reset_prefix_cache?reset_external={external}") as resp:
                    await resp.read()
                report.resets += 1
            except aiohttp.ClientError as exc:
                report.errors.append(f"reset failed: {exc}")

    async def corrupter() -> None:
        while corrupt_dir is not None and time.monotonic() < deadline:
            await asyncio.sleep(cfg.corrupt_every_s * rng.uniform(0.5, 1.5))
            report.corruptions += _corrupt_one(corrupt_dir, rng)

    timeout = aiohttp.ClientTimeout(total=300)
    conn = aiohttp.TCPConnector(limit=cfg.clients + 4)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        await asyncio.gather(*(client(c, session) for c in range(cfg.clients)), resetter(session), corrupter())


async def _final_round(cfg: ChaosConfig, server: VllmServer, ref: dict[tuple[int, bool], Completion],
                       policy: str) -> bool:
    """Every prompt once more: each answer equals plain vLLM's; under ``fail`` a request that
    meets a corrupted record still on disk may fail instead (cleanly: the server answers)."""
    import aiohttp

    pool = prompt_pool(cfg.seed)
    async with aiohttp.ClientSession() as session:
        outs = await asyncio.gather(*(stream_completion(session, server.url, cfg.model, p, cfg.max_tokens)
                                      for p in pool))
    return all(o.tokens == ref[(i, False)].tokens if o.ok else policy == "fail" and not o.aborted
               for i, o in enumerate(outs))


def _quiesce(server: VllmServer, timeout_s: float = 60.0) -> float | None:
    """Wait for no running or waiting request, reset the device cache; KV usage then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = server.metrics()
        busy = m.get(("vllm:num_requests_running", ()), 0) + m.get(("vllm:num_requests_waiting", ()), 0)
        if not busy and server.post("/reset_prefix_cache").get("success"):
            time.sleep(1.5)  # the gauge is refreshed with the engine's next stats report
            server.post("/v1/completions", {"model": server.model, "prompt": [1], "max_tokens": 1})
            server.post("/reset_prefix_cache")
            time.sleep(1.5)
            return server.metrics().get(("vllm:kv_cache_usage_perc", ()))
        time.sleep(0.5)
    return None


def run_chaos(cfg: ChaosConfig, name: str, tiers: list[dict[str, Any]], policy: str, workdir: Path,
              ref: dict[tuple[int, bool], Completion], corrupt_dir: Path | None = None) -> ChaosReport:
    report = ChaosReport(name)
    kv = kvoffload_config(tiers, policy) if tiers else None  # no tiers: plain vLLM under the same traffic
    args = _server_args(split_prefills=False)
    with VllmServer(cfg.model, workdir / f"{name.replace('/', '-')}.log", kv, extra_args=args) as server:
        asyncio.run(_traffic(cfg, server, ref, report, corrupt_dir, policy))
        report.alive = server.alive()
        if report.alive:
            report.usage_after = _quiesce(server)
            report.counters = {f"{name}{{{','.join(f'{k}={v}' for k, v in labels)}}}": value
                               for (name, labels), value in server.metrics().items()
                               if name.startswith(("kvoffload_hit_tokens", "kvoffload_failed_hit", "kvoffload_tier_rejected",
                                                   "kvoffload_loaded_blocks", "vllm:num_preemptions"))
                               and name.endswith("_total")}
            report.final_round_ok = asyncio.run(_final_round(cfg, server, ref, policy))
            report.alive = server.alive()
        if not report.alive:
            report.errors.append("server died:\n" + server.log_tail())
    return report


def configurations(workdir: Path) -> list[tuple[str, list[dict[str, Any]], str, Path | None]]:
    """(name, tiers, kv_load_failure_policy, disk or fs directory to corrupt) of each run."""
    disk = workdir / "disk"
    disk.mkdir(exist_ok=True)
    cpu = {"medium": "cpu", "capacity": "16MiB"}  # 128 blocks of 128 KiB (float32): evicts under the pool
    disk_tier = {"medium": "disk", "path": str(disk), "capacity": "64MiB"}
    fs = workdir / "fs"
    return [("cpu/fail", [cpu], "fail", None),
            ("cpu+disk/recompute", [{**cpu, "capacity": "4MiB"}, disk_tier], "recompute", disk),
            ("cpu+fs/recompute", [{**cpu, "capacity": "4MiB"}, {"medium": "fs", "path": str(fs), "capacity": "64MiB"}],
             "recompute", fs),
            ("cpu+disk/fail", [{**cpu, "capacity": "4MiB"}, {**disk_tier, "path": str(disk) + "-f"}], "fail",
             Path(str(disk) + "-f"))]
