"""The ``tiers`` list: each tier's medium, capacity, policy, path and its kind's own keys,
validated in order (cpu first, a last-in-chain kind last)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvoffload.config.values import capacity_share_of, check_keys, expand_path, load_mode_of, parse_size
from kvoffload.errors import ConfigError, UnknownPluginError, describe_value
from kvoffload.registry import TIER_KINDS, PolicyRef, resolve_policy


@dataclass(frozen=True, slots=True)
class TierConfig:
    name: str
    medium: str
    capacity_bytes: int
    eviction_policy: str = "lru"
    path: str | None = None
    #: Disk tiers: copy every block stored in the CPU tier to disk too, not only CPU victims,
    #: so a restarted engine finds the whole cache (costs disk bandwidth on every store).
    write_through: bool = False
    #: The tier kind's own keys, as its ``parse_options`` validated them (None for cpu).
    options: Any = None
    #: ``eviction_policy`` resolved by config (None for a TierConfig built by hand: the tier
    #: resolves the name itself).
    policy: PolicyRef | None = field(default=None, compare=False)
    #: How hits in this tier are served (None: the config's top-level ``load_mode``).
    load_mode: str | None = None
    #: ``capacity: 50%`` (a disk tier): the share of the free space it was sized from at start-up
    #: (``capacity_bytes`` is the size chosen); None for a capacity given as a size.
    capacity_share: float | None = None

    @property
    def cache_policy(self) -> PolicyRef | str:
        """What the tier's ledger evicts by: the resolved policy, else its name."""
        return self.policy if self.policy is not None else self.eviction_policy

    def num_blocks(self, block_bytes: int, key: str = "", overhead: tuple[int, int] = (0, 0)) -> int:
        """Blocks of ``block_bytes`` that ``capacity`` holds, with the tier's own bytes beside
        them (``overhead``: per block, in all; e.g. a disk tier's record and file headers)."""
        per_block, fixed = overhead
        n = max(self.capacity_bytes - fixed, 0) // (block_bytes + per_block)
        if n < 1:
            beside = f", plus the tier's own {fixed} bytes and {per_block} a block" if fixed or per_block else ""
            raise ConfigError(
                f"{key or 'tiers'}.capacity: {self.capacity_bytes} bytes is smaller than one offloaded block "
                f"({block_bytes} bytes{beside}); raise the capacity"
            )
        return n


def parse_tiers(raw_tiers: Any) -> tuple[TierConfig, ...]:
    if not isinstance(raw_tiers, list) or not raw_tiers:
        raise ConfigError("tiers: must be a non-empty list of tiers, fastest first")
    tiers: list[TierConfig] = []
    above: Any = None  # the previous tier's kind (None for cpu)
    for i, raw in enumerate(raw_tiers):
        key = f"tiers[{i}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(raw).__name__}")
        medium = raw.get("medium")
        kind = _check_medium(medium, i, key)
        option_keys = kind.option_keys if kind is not None else frozenset()
        check_keys(raw, {"name", "medium", "capacity", "eviction_policy", "path", "write_through", "load_mode",
                          *option_keys}, key)
        if above is not None and above.last_in_chain:
            raise ConfigError(f"{key}: a tier after the {tiers[-1].medium} tier; {tiers[-1].medium} must be the last tier "
                              "(list it after cpu and disk)")
        options = kind.parse_options({k: raw[k] for k in option_keys if k in raw}, key) if kind is not None else None
        if any(t.medium == medium for t in tiers):
            raise ConfigError(f"{key}.medium: a second {medium} tier; one tier per medium (copies are routed by it)")
        name = raw.get("name", medium)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{key}.name: {describe_value(name)} must be a non-empty string")
        if any(t.name == name for t in tiers):
            raise ConfigError(f"{key}.name: duplicate tier name {describe_value(name)}; give each tier its own name")
        default_capacity = kind.default_capacity(options) if kind is not None else None
        if "capacity" not in raw and default_capacity is None:
            raise ConfigError(f"{key}.capacity: required, e.g. 8GiB")
        share = capacity_share_of(raw.get("capacity"), f"{key}.capacity", kind is not None and kind.relative_capacity)
        capacity = parse_size(raw["capacity"], f"{key}.capacity") if "capacity" in raw and share is None \
            else default_capacity
        assert isinstance(medium, str)
        policy = raw.get("eviction_policy", "lru")
        if not isinstance(policy, str):
            raise ConfigError(f"{key}.eviction_policy: {describe_value(policy)} must be a string")
        try:
            policy_ref = resolve_policy(policy)
        except UnknownPluginError as exc:
            raise ConfigError(f"{key}.eviction_policy: {exc}") from None
        policy_cls = policy_ref.cls
        if inspect.isabstract(policy_cls):
            raise ConfigError(f"{key}.eviction_policy: {describe_value(policy)} is abstract; name a class that "
                              "implements every method")
        try:
            policy_cls(1)  # what start-up will do (with the real capacity)
        except Exception as exc:  # noqa: BLE001 - a plugin's constructor may raise anything
            raise ConfigError(f"{key}.eviction_policy: {describe_value(policy)} cannot be created ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:120]}); fix the class or pick another policy") from None
        if policy_cls.needs_future:
            raise ConfigError(f"{key}.eviction_policy: {describe_value(policy)} needs the future of the trace "
                              "(offline, `kvoffload sim` "
                              "only); use lru, arc or an online policy here")
        path = raw.get("path")
        default_path = kind.default_path() if kind is not None else None
        if default_path is not None:  # a kind that keeps files: a path, or its default
            if path is None:
                path = default_path
            if not path:
                raise ConfigError(f"{key}.path: {describe_value(path)}; give a directory, or leave path out for the "
                                  f"default ({default_path})")
        if path is not None and (not isinstance(path, str) or "\0" in path or len(path) > 4000):
            raise ConfigError(f"{key}.path: {describe_value(path)} is not a usable directory path; give a string path")
        if medium == "cpu" and path is not None:
            raise ConfigError(f"{key}.path: the cpu tier takes no path; remove it")
        write_through = raw.get("write_through", kind.default_write_through if kind is not None else False)
        if not isinstance(write_through, bool):
            raise ConfigError(f"{key}.write_through: {describe_value(write_through)}; use true or false")
        if medium == "cpu" and write_through:
            raise ConfigError(f"{key}.write_through: only a disk tier (or another tier behind cpu) is written "
                              "through to; remove it from the cpu tier")
        path = expand_path(path, f"{key}.path") if path is not None else None
        if share is not None:
            assert kind is not None and path is not None
            capacity = kind.share_of_free_space(path, share, f"{key}.capacity")
        assert capacity is not None
        tier = TierConfig(name=name, medium=medium, capacity_bytes=capacity, eviction_policy=policy, policy=policy_ref,
                          path=path, write_through=write_through, options=options,
                          load_mode=load_mode_of(raw, f"{key}.load_mode", None), capacity_share=share)
        if kind is not None:
            kind.validate(tier, key)
        tiers.append(tier)
        above = kind
    return tuple(tiers)


def _check_medium(medium: Any, i: int, key: str) -> Any:
    """tiers[0] is the host (cpu) tier; every later tier is a registered tier kind (returned)."""
    if i == 0:
        if medium != "cpu" and not (isinstance(medium, str) and medium in TIER_KINDS.known()):
            raise ConfigError(f"{key}.medium: {describe_value(medium)} is not a medium; the first tier is cpu, later ones one of "
                              f"{', '.join(TIER_KINDS.known())}")
        if medium != "cpu":
            raise ConfigError(f"{key}.medium: {describe_value(medium)}; the first (fastest) tier must be cpu: every other tier's "
                              "loads pass through host memory")
        return None
    if medium == "cpu":
        raise ConfigError(f"{key}.medium: cpu; only the first tier is cpu, list it first and once")
    if not isinstance(medium, str) or not medium:
        raise ConfigError(f"{key}.medium: {describe_value(medium)}; use cpu, or a tier kind: {', '.join(TIER_KINDS.known())}")
    try:
        return TIER_KINDS.load(medium)
    except UnknownPluginError as exc:
        raise ConfigError(f"{key}.medium: {exc}") from None
