"""The configurations ``bench serve`` compares, by name (``plain``, ``cpu``, ``cpu+disk:async``,
``cpu@hinted``, ...): each name's offload config, and the check that vLLM ran every one of them
with the same effective engine config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvoffload.config import OffloadConfig


def tier_sets(cpu: str, disk: str, workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """The tiers of each kvoffload configuration (the same for both engines)."""
    return {
        "cpu": [{"medium": "cpu", "capacity": cpu}],
        "cpu+disk": [{"medium": "cpu", "capacity": cpu},
                     {"medium": "disk", "path": str(workdir / "disk"), "capacity": disk, "write_through": True}],
    }


def sends_hints(name: str) -> bool:
    """Whether a configuration's requests carry their hints: those whose host tier evicts by
    the hinted policy (``cpu@hinted``); the same policy without hints is ``prefix_value``."""
    return name.partition("@")[2] == "hinted"


def offload_config(name: str, tiers: dict[str, list[dict[str, Any]]], throttled: bool,
                   hints: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """kvoffload's config of a configuration named ``TIERS[:LOAD_MODE][@POLICY]``
    (``cpu+disk:never-recompute``, ``cpu@hinted``: the host tier's eviction policy); None for
    ``plain``. ``throttled``: the tiers' I/O is slowed as ``--throttle-tier`` says
    (``kvoffload.testing.throttle``). ``hints``: the config's ``hints`` section."""
    if name == "plain":
        return None
    base, _, policy = name.partition("@")
    tier_name, _, mode = base.partition(":")
    if tier_name not in tiers or (policy == "" and "@" in name):
        raise ValueError(f"--configs: {name!r}; use plain, cpu, cpu+disk (each may end in :auto, :async or "
                         ":never-recompute, then in @POLICY, e.g. cpu@hinted)")
    config: dict[str, Any] = {"tiers": tiers[tier_name]}
    if mode:
        config["load_mode"] = mode
    if mode or policy:
        # Each server owns its disk directory: the same tiers in another mode get their own.
        suffix = "-".join(x for x in (mode, policy) if x)
        config["tiers"] = [{**t, "path": f"{t['path']}-{suffix}"} if "path" in t else t for t in tiers[tier_name]]
    if policy:
        config["tiers"] = [{**config["tiers"][0], "eviction_policy": policy}, *config["tiers"][1:]]
    if hints:
        config["hints"] = hints
    if throttled:
        config.update(spec_name="ThrottledOffloadingSpec", spec_module_path="kvoffload.testing.throttle")
    OffloadConfig.from_dict(config)  # a bad load mode fails here, in one line, before any server starts
    return config


def configurations(names: list[str], cpu: str, disk: str, workdir: Path, throttled: bool = False,
                   hints: dict[str, Any] | None = None) -> dict[str, dict[str, Any] | None]:
    """vLLM's ``--kv-transfer-config`` of each configuration named (None: plain vLLM)."""
    tiers = tier_sets(cpu, disk, workdir)
    out: dict[str, dict[str, Any] | None] = {}
    for name in names:
        config = offload_config(name, tiers, throttled, hints)
        out[name] = None if config is None else kv_transfer_config(config)
    return out


def kv_transfer_config(config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` serving kvoffload ``config`` (a failed load recomputes)."""
    return {"kv_connector": "KVOffloadConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"config": config}}


def server_flags(engine: dict[str, Any]) -> list[str]:
    """``vllm serve`` flags for engine settings (the memory share is VllmServer's own argument)."""
    return [a for k, v in engine.items() if k != "gpu_memory_utilization" for a in (f"--{k.replace('_', '-')}", str(v))]


def config_names(spec: str) -> list[str]:
    """The ``--configs`` list, duplicates dropped. "plain-default" is read as "plain": it named
    plain vLLM with its hybrid allocator on while the connector turned it off; the connector is
    HMA-aware now, so plain vLLM's defaults equal the kvoffload servers' effective config."""
    return list(dict.fromkeys("plain" if n == "plain-default" else n for n in spec.split(",")))


def effective_differences(model: str, engine_kwargs: dict[str, Any],
                          kv_configs: dict[str, dict[str, Any] | None]) -> list[str]:
    """vLLM's effective engine config for each configuration, built the way ``vllm serve``
    builds it, compared with plain vLLM's field by field: one line per differing field."""
    from vllm.engine.arg_utils import EngineArgs

    def build(kv: dict[str, Any] | None) -> Any:
        return EngineArgs(model=model, skip_tokenizer_init=True, enforce_eager=True, seed=0,
                          kv_transfer_config=kv, **engine_kwargs).create_engine_config()

    base = build(None)
    inert = set() if _has_several_kv_kinds(base.model_config) else {("scheduler_config", "disable_hybrid_kv_cache_manager")}
    diffs: list[str] = []
    for name, kv in kv_configs.items():
        cfg = build(kv)
        for section in ("scheduler_config", "cache_config", "parallel_config", "model_config", "compilation_config",
                        "load_config", "device_config"):
            a, b = getattr(base, section), getattr(cfg, section)
            for key in vars(a):
                if (section, key) in inert:
                    continue
                try:
                    same = bool(getattr(a, key) == getattr(b, key, None))
                except Exception:  # noqa: BLE001 - fields without a usable ==: not compared
                    continue
                if not same:
                    line = f"{name}: {section}.{key}={getattr(b, key, None)!r} (plain: {getattr(a, key)!r})"
                    diffs.append(line)
    return diffs


def _has_several_kv_kinds(model_config: Any) -> bool:
    """Whether the model has more than one kind of KV cache (sliding window beside full
    attention, or Mamba state). Only then does vLLM's hybrid allocator change anything, so
    only then is a difference in ``disable_hybrid_kv_cache_manager`` a difference in the
    engine: one CI machine resolved it to True for plain vLLM on a full-attention model."""
    hf = model_config.hf_text_config
    kinds = set(getattr(hf, "layer_types", None) or [])
    return bool(model_config.is_hybrid or len(kinds) > 1 or getattr(hf, "sliding_window", None))
