"""``OffloadConfig``: one YAML file (or dict) → a frozen, validated config.

Every problem raises ``ConfigError`` with the key path and the fix, in one line. Nothing is
silently rewritten: a value is either accepted as given or rejected.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvoffload.auth import AuthConfig, parse_auth
from kvoffload.config.sections import HintsConfig, MetricsConfig, TransferConfig, parse_hints
from kvoffload.config.tiers import TierConfig, parse_tiers
from kvoffload.config.values import check_keys, int_key, load_mode_of, section
from kvoffload.errors import ConfigError, UnknownPluginError, describe_value
from kvoffload.examples import known_examples, resolve_config
from kvoffload.registry import SPECS, TIER_KINDS
from kvoffload.yaml_input import load_yaml


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    tiers: tuple[TierConfig, ...]
    offloaded_block_size: int | None = None
    store_threshold: int = 0
    max_tracker_size: int = 64_000
    transfer: TransferConfig = field(default_factory=TransferConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    spec_name: str = "TieredOffloadingSpec"
    spec_module_path: str | None = None
    #: The shared secret that authenticates records of disk and shared tiers.
    auth: AuthConfig = field(default_factory=AuthConfig)
    #: How hits are served, unless a tier says otherwise (``LOAD_MODES``).
    load_mode: str = "auto"
    #: What a request's finish says of its return (tool-call tokens), for hinted policies.
    hints: HintsConfig = field(default_factory=HintsConfig)

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path) -> OffloadConfig:
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, ValueError) as exc:  # missing, unreadable, binary (UnicodeDecodeError), NUL in name
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise ConfigError(f"cannot read config file {str(path)[:200]!r} ({reason}); give a readable YAML file "
                              f"or a packaged example by name ({', '.join(known_examples())})") from None
        raw = load_yaml(text, str(path)[:200])
        try:
            return cls.from_dict(raw if raw is not None else {})
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OffloadConfig:
        check_keys(raw, {"offloaded_block_size", "store_threshold", "max_tracker_size", "tiers", "transfer",
                          "metrics", "spec_name", "spec_module_path", "auth", "load_mode", "hints"}, "")
        if "tiers" not in raw:
            raise ConfigError("tiers: required; list at least one tier, e.g. [{name: cpu, medium: cpu, capacity: 8GiB}]")
        tiers = parse_tiers(raw["tiers"])
        threshold = int_key(raw, "store_threshold", 0, "", 0)
        transfer_raw = section(raw, "transfer")
        check_keys(transfer_raw, {"backend", "num_streams"}, "transfer")
        backend = transfer_raw.get("backend", "auto")
        if backend not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"transfer.backend: {describe_value(backend)}; use auto, cuda or cpu")
        metrics_raw = section(raw, "metrics")
        check_keys(metrics_raw, {"events", "prometheus_port"}, "metrics")
        events = metrics_raw.get("events", False)
        if not isinstance(events, bool):
            raise ConfigError(f"metrics.events: {describe_value(events)}; use true or false")
        port = int_key(metrics_raw, "prometheus_port", None, "metrics.", 1)
        if port is not None and port > 65535:
            raise ConfigError(f"metrics.prometheus_port: {port} is not a TCP port (1-65535)")
        spec_name = raw.get("spec_name", "TieredOffloadingSpec")
        spec_module_path = raw.get("spec_module_path")
        for key, value in (("spec_name", spec_name), ("spec_module_path", spec_module_path)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{key}: {describe_value(value)} must be a string")
        _check_spec(spec_name, spec_module_path)
        return cls(
            tiers=tiers,
            offloaded_block_size=int_key(raw, "offloaded_block_size", None, "", 1),
            store_threshold=threshold or 0,
            max_tracker_size=int_key(raw, "max_tracker_size", 64_000, "", 1) or 64_000,
            transfer=TransferConfig(backend=backend, num_streams=int_key(transfer_raw, "num_streams", 4, "transfer.", 1) or 4),
            metrics=MetricsConfig(events=events, prometheus_port=port),
            spec_name=spec_name,
            spec_module_path=spec_module_path,
            auth=parse_auth(raw.get("auth")),
            load_mode=load_mode_of(raw, "load_mode", "auto") or "auto",
            hints=parse_hints(section(raw, "hints")),
        )

    @classmethod
    def coerce(cls, value: object) -> OffloadConfig:
        """Accept an OffloadConfig, a YAML path, a packaged example's name (``"cpu_disk"``) or a
        dict (as EngineConfig.kv_offload does)."""
        if isinstance(value, OffloadConfig):
            return value
        if isinstance(value, (str, Path)):
            return cls.from_yaml(resolve_config(str(value)))
        if isinstance(value, Mapping):
            try:
                return cls.from_dict(value)
            except RecursionError:
                raise ConfigError("kv_offload: config nested too deeply; see docs/configuration.md") from None
        raise ConfigError(f"kv_offload: {type(value).__name__} is not a config; pass OffloadConfig, a YAML path or a dict")

    # ---- derived values ------------------------------------------------------------------
    def block_size_factor(self, engine_block_size: int) -> int:
        """Engine blocks per offloaded block."""
        size = self.offloaded_block_size
        if size is None:
            return 1
        if size % engine_block_size:
            raise ConfigError(
                f"offloaded_block_size: {size} is not a multiple of the engine block size {engine_block_size}; "
                f"use {engine_block_size * max(1, size // engine_block_size)}"
            )
        return size // engine_block_size

    def tier_load_modes(self) -> dict[str, str]:
        """Each tier's load mode by the medium its jobs carry ("CPU", "DISK", "FS")."""
        kinds: list[Any] = [TIER_KINDS.load(t.medium) for t in self.tiers[1:]]  # TierKind classes
        media = ["CPU", *(str(kind.medium) for kind in kinds)]
        return {m: t.load_mode or self.load_mode for m, t in zip(media, self.tiers)}

    def tier_blocks(self, block_bytes: int, world_size: int = 1) -> list[int]:
        """Blocks each tier holds; ``block_bytes`` over all ranks, each of which keeps its own
        copy of a kind's per-rank bytes (a disk tier's file header)."""
        kinds: list[Any] = [TIER_KINDS.load(t.medium) for t in self.tiers[1:]]  # TierKind classes
        overheads = [(0, 0)] + [kind.storage_overhead() for kind in kinds]
        return [t.num_blocks(block_bytes, f"tiers[{i}]", (per_block * world_size, fixed * world_size))
                for i, (t, (per_block, fixed)) in enumerate(zip(self.tiers, overheads))]


def _check_spec(spec_name: str, spec_module_path: str | None) -> None:
    """Resolve the spec now, so a bad name or an abstract class fails here, not at start-up."""
    try:
        cls = SPECS.load(f"{spec_module_path}:{spec_name}" if spec_module_path else spec_name)
    except UnknownPluginError as exc:
        raise UnknownPluginError(f"spec_name: {exc}; or set spec_module_path") from None
    if inspect.isabstract(cls):
        raise ConfigError(f"spec_name: {describe_value(spec_name)} is abstract; name a class that implements get_manager "
                          "and get_handlers")
