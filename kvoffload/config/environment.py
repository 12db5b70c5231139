"""The config against this machine: where files go by default, what would fail at start-up,
and the resolved config as ``kvoffload config check`` prints it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvoffload.config.offload import OffloadConfig
from kvoffload.config.sections import HintsConfig
from kvoffload.config.values import format_bytes
from kvoffload.registry import TIER_KINDS


def weight_digest_dir() -> Path:
    """Where whole-file digests of weights are kept between starts (``kvoffload.weight_digests``)."""
    return default_cache_dir() / "weight-digests"


def default_cache_dir() -> Path:
    """Where a disk tier without a ``path`` keeps its file: ``$KVOFFLOAD_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/kvoffload``, else ``~/.cache/kvoffload`` (per user: users never share a file).
    The directory and its parents are created when the tier opens."""
    explicit = os.environ.get("KVOFFLOAD_CACHE_DIR")
    if explicit:
        return Path(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(os.path.expanduser(xdg)) if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "kvoffload"


def check_environment(cfg: OffloadConfig) -> list[str]:
    """What would fail at start-up on this machine (ConfigError), and what looks risky
    (returned as warnings): the secret readable, CPU tiers within the machine's memory, and
    each later tier as its kind checks it (a disk tier: its directory writable, its capacity
    within the free space)."""
    warnings: list[str] = []
    cfg.auth.load_secret()  # a missing file or variable fails here, naming it
    for i, tier in enumerate(cfg.tiers):
        key = f"tiers[{i}]"
        if tier.medium == "cpu":
            if hasattr(os, "sysconf"):
                ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                if tier.capacity_bytes > ram:
                    warnings.append(f"{key}.capacity: {format_bytes(tier.capacity_bytes)} is more than this machine's "
                                    f"memory ({format_bytes(ram)}); start-up will fail to allocate it here")
        else:
            kind: Any = TIER_KINDS.load(tier.medium)
            warnings += kind.check_environment(tier, key)
    return warnings


def describe(cfg: OffloadConfig, block_bytes: int | None = None, engine_block_size: int = 16) -> str:
    """Human-readable resolved config (tiers, blocks per tier, bytes per block)."""
    factor = cfg.block_size_factor(engine_block_size)
    if block_bytes is None:
        block_bytes = 8192 * factor  # bundled tiny model: 2 layers x K/V x 16 tokens x 2 heads x 16 dims x fp32
    blocks = cfg.tier_blocks(block_bytes)
    lines = [
        f"offloaded block: {engine_block_size * factor} tokens ({factor} engine block(s)), {format_bytes(block_bytes)}",
        f"reuse filter: {f'store on sighting #{cfg.store_threshold}' if cfg.store_threshold >= 2 else 'off'}"
        f" (tracker {cfg.max_tracker_size})",
        f"transfer: backend={cfg.transfer.backend}, streams={cfg.transfer.num_streams}",
        f"spec: {cfg.spec_module_path or cfg.spec_name}",
        f"load mode: {cfg.load_mode}",
    ]
    h = cfg.hints
    if h != HintsConfig():
        tools = f"an output holding token {', '.join(map(str, h.tool_call_token_ids))} ended in a tool call, back within " \
                f"{h.tool_return_s:g} s" if h.tool_call_token_ids else "no tool-call tokens"
        tenants = f"; tenants also by {', '.join(h.tenant_keys)}" if h.tenant_keys else ""
        lines.append(f"hints: {tools}; hint clock {h.clock_speed:g}x wall time; clients' priority at most "
                     f"{h.max_priority}{tenants}")
    lines.append("tiers:")
    for tier, n in zip(cfg.tiers, blocks):
        where = f" at {tier.path}" if tier.path else ""
        if tier.capacity_share is not None:
            where += f" (capacity {100 * tier.capacity_share:g}% of the free space there, chosen at start-up)"
        if tier.medium == "disk":
            where += ", write-through" if tier.write_through else ", CPU victims only (write-back)"
        lines.append(f"  {tier.name:<8} {tier.medium:<5} {format_bytes(tier.capacity_bytes):>12} = {n} blocks,"
                     f" policy {tier.eviction_policy}{where}"
                     + (f", load mode {tier.load_mode}" if tier.load_mode else ""))
    return "\n".join(lines)
