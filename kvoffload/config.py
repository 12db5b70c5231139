"""Offload configuration: one YAML file (or dict) → frozen, validated dataclasses.

Every problem raises ``ConfigError`` with the key path and the fix, in one line. Nothing is
silently rewritten: a value is either accepted as given or rejected.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvoffload.auth import AuthConfig, parse_auth
from kvoffload.errors import ConfigError, UnknownPluginError
from kvoffload.examples import resolve_config
from kvoffload.registry import SPECS, TIER_KINDS, PolicyRef, resolve_policy

_UNITS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
#: Larger sizes are typos; they would only fail later, deep inside an allocation.
MAX_SIZE = 1 << 60
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any, key: str) -> int:
    """``8GiB``, ``1.5GB``, ``512MiB`` or an int → bytes (> 0)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: {value!r} is not a size; use bytes or a string like '8GiB'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        if _SIZE_RE.match(value.strip().lstrip("-+")) and value.strip().startswith("-"):
            raise ConfigError(f"{key}: size must be positive, got {value!r}")
        m = _SIZE_RE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ConfigError(
                f"{key}: cannot parse size {value!r}; use a number with KiB, MiB, GiB, TiB, KB, MB, GB or TB"
            )
        scaled = float(m.group(1)) * _UNITS[unit]  # inf for hundreds of digits
        if not scaled <= MAX_SIZE:
            raise ConfigError(f"{key}: {value[:40]!r} is too large; at most {MAX_SIZE} bytes (1 EiB)")
        size = int(scaled)
    else:
        raise ConfigError(f"{key}: {value!r} is not a size; use bytes or a string like '8GiB'")
    if size <= 0:
        raise ConfigError(f"{key}: size must be positive, got {value!r}")
    if size > MAX_SIZE:
        raise ConfigError(f"{key}: {str(value)[:40]} is too large; at most {MAX_SIZE} bytes (1 EiB)")
    return size


def _check_keys(raw: Mapping[str, Any], allowed: set[str], path: str) -> None:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(k if isinstance(k, str) and k.isprintable() else repr(k) for k in set(raw) - allowed)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{where}: unknown key; allowed keys here: {', '.join(sorted(allowed))}")


def _section(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A nested mapping (absent or null: empty); anything else is an error naming it."""
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: {value!r} must be a mapping of its keys (or left out)")
    return value


def _int(raw: Mapping[str, Any], key: str, default: int | None, path: str, minimum: int) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{path}{key}: {value!r} must be an integer >= {minimum}")
    return value


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

    def num_blocks(self, block_bytes: int, key: str = "") -> int:
        n = self.capacity_bytes // block_bytes
        if n < 1:
            raise ConfigError(
                f"{key or 'tiers'}.capacity: {self.capacity_bytes} bytes is smaller than one offloaded block "
                f"({block_bytes} bytes); raise the capacity"
            )
        return n


#: How a hit is served. auto: the cost model picks, per request, loading or recomputing (all of
#: the hit or its leading part), and loads layer by layer inside the step where that fits;
#: layerwise: always load, layer by layer where the engine can; async: always load, the request
#: waits a step for the whole load (the behaviour before the cost model); never-recompute:
#: always load, layer by layer or not as auto would.
LOAD_MODES = ("auto", "layerwise", "async", "never-recompute")


def _load_mode(raw: Mapping[str, Any], key: str, default: str | None) -> str | None:
    value = raw.get("load_mode", default)
    if value is not None and value not in LOAD_MODES:
        raise ConfigError(f"{key}: {str(value)[:40]!r} is not a load mode; use one of {', '.join(LOAD_MODES)}")
    return value


@dataclass(frozen=True, slots=True)
class TransferConfig:
    backend: str = "auto"
    num_streams: int = 4


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    events: bool = False
    prometheus_port: int | None = None


#: The priorities a request hint may name (``kvoffload.offload.hints``); an operator lowers the
#: ceiling with ``hints.max_priority``.
MAX_PRIORITY = 1000


@dataclass(frozen=True, slots=True)
class HintsConfig:
    """What a request's finish says of its return (``kvoffload.offload.hints``): a request whose
    output holds one of ``tool_call_token_ids`` (the model's tool-call token, e.g. Qwen's
    ``<tool_call>``) ended in a tool call, and its caller is expected back within
    ``tool_return_s`` unless its hint said when. ``clock_speed``: hint seconds per wall-clock
    second, for a trace replayed faster than it happened (20: a replay at 20x), so hints and
    the policy's horizons keep the trace's meaning. ``max_priority``: the highest priority a
    client's hint may raise its blocks to (0: none above normal; higher ones count as this).
    ``tenant_keys``: entries of ``kv_transfer_params`` that a trusted gateway sets to name the
    tenant; with the request's ``cache_salt`` and LoRA adapter they scope hint sessions, so one
    tenant's hints never reach another's blocks."""

    tool_call_token_ids: tuple[int, ...] = ()
    tool_return_s: float = 10.0
    clock_speed: float = 1.0
    max_priority: int = 0
    tenant_keys: tuple[str, ...] = ()


def _parse_hints(raw: Mapping[str, Any]) -> HintsConfig:
    _check_keys(raw, {"tool_call_token_ids", "tool_return_s", "clock_speed", "max_priority", "tenant_keys"}, "hints")
    speed = raw.get("clock_speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.001 <= speed <= 1e6:
        raise ConfigError(f"hints.clock_speed: {str(speed)[:40]!r} must be a number in [0.001, 1e6]; 1 = real time")
    ids = raw.get("tool_call_token_ids", [])
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ConfigError(f"hints.tool_call_token_ids: {str(ids)[:80]!r} must be a list of token ids (integers >= 0)")
    ret = raw.get("tool_return_s", 10.0)
    if isinstance(ret, bool) or not isinstance(ret, (int, float)) or not 0 < ret <= 86400:
        raise ConfigError(f"hints.tool_return_s: {str(ret)[:40]!r} must be seconds in (0, 86400], e.g. 10")
    top = raw.get("max_priority", 0)
    if isinstance(top, bool) or not isinstance(top, int) or not -MAX_PRIORITY <= top <= MAX_PRIORITY:
        raise ConfigError(f"hints.max_priority: {str(top)[:40]!r} must be an integer in [-{MAX_PRIORITY}, "
                          f"{MAX_PRIORITY}]; 0 lets no client raise its priority")
    keys = raw.get("tenant_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k and k != "kvoffload" for k in keys):
        raise ConfigError(f"hints.tenant_keys: {str(keys)[:80]!r} must be a list of kv_transfer_params entry names "
                          "(not 'kvoffload'), e.g. [tenant]")
    return HintsConfig(tuple(ids), float(ret), float(speed), top, tuple(keys))


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
            raise ConfigError(f"cannot read config file {str(path)[:200]!r} ({reason}); give a readable YAML file") from None
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
        except RecursionError:
            raise ConfigError(f"{path}: YAML nested too deeply; the schema is at most three levels deep") from None
        try:
            return cls.from_dict(raw if raw is not None else {})
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OffloadConfig:
        _check_keys(raw, {"offloaded_block_size", "store_threshold", "max_tracker_size", "tiers", "transfer",
                          "metrics", "spec_name", "spec_module_path", "auth", "load_mode", "hints"}, "")
        if "tiers" not in raw:
            raise ConfigError("tiers: required; list at least one tier, e.g. [{name: cpu, medium: cpu, capacity: 8GiB}]")
        tiers = _parse_tiers(raw["tiers"])
        threshold = _int(raw, "store_threshold", 0, "", 0)
        transfer_raw = _section(raw, "transfer")
        _check_keys(transfer_raw, {"backend", "num_streams"}, "transfer")
        backend = transfer_raw.get("backend", "auto")
        if backend not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"transfer.backend: {backend!r}; use auto, cuda or cpu")
        metrics_raw = _section(raw, "metrics")
        _check_keys(metrics_raw, {"events", "prometheus_port"}, "metrics")
        events = metrics_raw.get("events", False)
        if not isinstance(events, bool):
            raise ConfigError(f"metrics.events: {events!r}; use true or false")
        port = _int(metrics_raw, "prometheus_port", None, "metrics.", 1)
        if port is not None and port > 65535:
            raise ConfigError(f"metrics.prometheus_port: {port} is not a TCP port (1-65535)")
        spec_name = raw.get("spec_name", "TieredOffloadingSpec")
        spec_module_path = raw.get("spec_module_path")
        for key, value in (("spec_name", spec_name), ("spec_module_path", spec_module_path)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{key}: {value!r} must be a string")
        _check_spec(spec_name, spec_module_path)
        return cls(
            tiers=tiers,
            offloaded_block_size=_int(raw, "offloaded_block_size", None, "", 1),
            store_threshold=threshold or 0,
            max_tracker_size=_int(raw, "max_tracker_size", 64_000, "", 1) or 64_000,
            transfer=TransferConfig(backend=backend, num_streams=_int(transfer_raw, "num_streams", 4, "transfer.", 1) or 4),
            metrics=MetricsConfig(events=events, prometheus_port=port),
            spec_name=spec_name,
            spec_module_path=spec_module_path,
            auth=parse_auth(raw.get("auth")),
            load_mode=_load_mode(raw, "load_mode", "auto") or "auto",
            hints=_parse_hints(_section(raw, "hints")),
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

    def tier_blocks(self, block_bytes: int) -> list[int]:
        return [t.num_blocks(block_bytes, f"tiers[{i}]") for i, t in enumerate(self.tiers)]


def _check_spec(spec_name: str, spec_module_path: str | None) -> None:
    """Resolve the spec now, so a bad name or an abstract class fails here, not at start-up."""
    try:
        cls = SPECS.load(f"{spec_module_path}:{spec_name}" if spec_module_path else spec_name)
    except UnknownPluginError as exc:
        raise UnknownPluginError(f"spec_name: {exc}; or set spec_module_path") from None
    if inspect.isabstract(cls):
        raise ConfigError(f"spec_name: {spec_name!r} is abstract; name a class that implements get_manager and get_handlers")


def _parse_tiers(raw_tiers: Any) -> tuple[TierConfig, ...]:
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
        _check_keys(raw, {"name", "medium", "capacity", "eviction_policy", "path", "write_through", "load_mode",
                          *option_keys}, key)
        if above is not None and above.last_in_chain:
            raise ConfigError(f"{key}: a tier after the {tiers[-1].medium} tier; {tiers[-1].medium} must be the last tier "
                              "(list it after cpu and disk)")
        options = kind.parse_options({k: raw[k] for k in option_keys if k in raw}, key) if kind is not None else None
        if any(t.medium == medium for t in tiers):
            raise ConfigError(f"{key}.medium: a second {medium} tier; one tier per medium (copies are routed by it)")
        name = raw.get("name", medium)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{key}.name: {name!r} must be a non-empty string")
        if any(t.name == name for t in tiers):
            raise ConfigError(f"{key}.name: duplicate tier name {name!r}; give each tier its own name")
        default_capacity = kind.default_capacity(options) if kind is not None else None
        if "capacity" not in raw and default_capacity is None:
            raise ConfigError(f"{key}.capacity: required, e.g. 8GiB")
        share = _share(raw.get("capacity"), f"{key}.capacity", kind is not None and kind.relative_capacity)
        capacity = parse_size(raw["capacity"], f"{key}.capacity") if "capacity" in raw and share is None \
            else default_capacity
        assert isinstance(medium, str)
        policy = raw.get("eviction_policy", "lru")
        if not isinstance(policy, str):
            raise ConfigError(f"{key}.eviction_policy: {policy!r} must be a string")
        try:
            policy_ref = resolve_policy(policy)
        except UnknownPluginError as exc:
            raise ConfigError(f"{key}.eviction_policy: {exc}") from None
        policy_cls = policy_ref.cls
        if inspect.isabstract(policy_cls):
            raise ConfigError(f"{key}.eviction_policy: {policy!r} is abstract; name a class that implements every method")
        try:
            policy_cls(1)  # what start-up will do (with the real capacity)
        except Exception as exc:  # noqa: BLE001 - a plugin's constructor may raise anything
            raise ConfigError(f"{key}.eviction_policy: {policy!r} cannot be created ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:120]}); fix the class or pick another policy") from None
        if policy_cls.needs_future:
            raise ConfigError(f"{key}.eviction_policy: {policy!r} needs the future of the trace (offline, `kvoffload sim` "
                              "only); use lru, arc or an online policy here")
        path = raw.get("path")
        default_path = kind.default_path() if kind is not None else None
        if default_path is not None:  # a kind that keeps files: a path, or its default
            if path is None:
                path = default_path
            if not path:
                raise ConfigError(f"{key}.path: {path!r}; give a directory, or leave path out for the default ({default_path})")
        if path is not None and (not isinstance(path, str) or "\0" in path or len(path) > 4000):
            raise ConfigError(f"{key}.path: {str(path)[:60]!r} is not a usable directory path; give a string path")
        if medium == "cpu" and path is not None:
            raise ConfigError(f"{key}.path: the cpu tier takes no path; remove it")
        write_through = raw.get("write_through", kind.default_write_through if kind is not None else False)
        if not isinstance(write_through, bool):
            raise ConfigError(f"{key}.write_through: {write_through!r}; use true or false")
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
                          load_mode=_load_mode(raw, f"{key}.load_mode", None), capacity_share=share)
        if kind is not None:
            kind.validate(tier, key)
        tiers.append(tier)
        above = kind
    return tuple(tiers)


def _share(value: Any, key: str, allowed: bool) -> float | None:
    """``capacity: 50%`` as 0.5 (None: a size, parsed as such); only where the kind sizes
    itself from the free space (``TierKind.relative_capacity``)."""
    if not isinstance(value, str) or not value.strip().endswith("%"):
        return None
    if not allowed:
        raise ConfigError(f"{key}: {value[:40]!r} is a share of the free disk space, which only a disk tier takes; "
                          "give a size, e.g. 8GiB")
    number = value.strip()[:-1].strip()
    try:
        share = float(number)
    except ValueError:
        share = float("nan")
    if not 0 < share <= 100:
        raise ConfigError(f"{key}: {value[:40]!r}; give a share of the free space in (0%, 100%], e.g. 50%, or a "
                          "size, e.g. 200GiB")
    return share / 100


_UNSET_VAR_RE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(path: str, key: str) -> str:
    """``~`` and ``$VARS`` expanded; a variable left unset is an error naming it (expanding it to
    nothing, or keeping ``$VAR`` as a directory name, would quietly open another directory:
    replicas that should share one would each get their own)."""
    expanded = os.path.expanduser(os.path.expandvars(path))
    unset = _UNSET_VAR_RE.search(expanded)
    if unset:
        name = unset.group(1).strip("{}")
        raise ConfigError(f"{key}: {path[:200]!r} uses ${name}, which is not set; set {name} in the engine's "
                          "environment or write the directory out")
    return expanded


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


def _check_medium(medium: Any, i: int, key: str) -> Any:
    """tiers[0] is the host (cpu) tier; every later tier is a registered tier kind (returned)."""
    if i == 0:
        if medium != "cpu" and not (isinstance(medium, str) and medium in TIER_KINDS.known()):
            raise ConfigError(f"{key}.medium: {medium!r} is not a medium; the first tier is cpu, later ones one of "
                              f"{', '.join(TIER_KINDS.known())}")
        if medium != "cpu":
            raise ConfigError(f"{key}.medium: {medium!r}; the first (fastest) tier must be cpu: every other tier's "
                              "loads pass through host memory")
        return None
    if medium == "cpu":
        raise ConfigError(f"{key}.medium: cpu; only the first tier is cpu, list it first and once")
    if not isinstance(medium, str) or not medium:
        raise ConfigError(f"{key}.medium: {medium!r}; use cpu, or a tier kind: {', '.join(TIER_KINDS.known())}")
    try:
        return TIER_KINDS.load(medium)
    except UnknownPluginError as exc:
        raise ConfigError(f"{key}.medium: {exc}") from None


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


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


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
