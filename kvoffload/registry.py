"""Registries of plugins by name: one small generic class serves connectors, specs, eviction
policies and tier kinds.

A name resolves, in order, to a target registered in code (built-ins are import strings, so
naming one imports nothing else), to ``"package.module:Name"`` itself, or to an entry point of
the registry's group. The base class is an import string too: this module is a leaf, and a
registry defined here can be consulted (e.g. by config validation) without importing the layer
that implements its plugins.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, cast

from kvoffload.errors import UnknownPluginError


def load_object(target: str, error: type[Exception], what: str) -> Any:
    """Import ``module:attr``; any failure becomes ``error`` naming ``what`` and the target."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise error(f"{what}: {target!r} is not of the form 'package.module:ClassName'")
    if module_name.startswith("."):
        raise error(f"{what}: {target!r} is a relative module; give the full dotted path, e.g. 'mypkg.mod:{attr}'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise error(f"{what}: cannot import {target!r} ({exc})") from None


class Registry:
    """Names of one kind of plugin → classes, imported on first use."""

    def __init__(self, kind: str, group: str, base: str, builtins: dict[str, str]) -> None:
        self.kind = kind  # "eviction policy", used in messages
        self.group = group  # entry-point group plugins publish under
        self._base = base  # "module:Class" every plugin must subclass
        self._targets = dict(builtins)

    def register(self, name: str, target: str) -> None:
        """Add ``name`` → ``"module:Class"`` (imported on first use); re-registering replaces."""
        self._targets[name] = target

    def known(self) -> list[str]:
        names = set(self._targets)
        names.update(ep.name for ep in entry_points(group=self.group))
        return sorted(names)

    def target(self, name: str) -> str:
        """The import string ``name`` stands for; an unknown name lists the known ones."""
        if name in self._targets:
            return self._targets[name]
        if ":" in name:
            return name
        for ep in entry_points(group=self.group):
            if ep.name == name:
                return ep.value
        raise UnknownPluginError(
            f"unknown {self.kind} {name!r}; known: {', '.join(self.known())}, or 'package.module:ClassName'"
        )

    def load(self, name: str) -> type:
        """Import the class ``name`` stands for and check it subclasses the registry's base."""
        target = self.target(name)
        cls = load_object(target, UnknownPluginError, f"{self.kind} {name!r}")
        base = load_object(self._base, UnknownPluginError, f"{self.kind} base")
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise UnknownPluginError(f"{self.kind} {name!r} resolved to {cls!r}, not a {base.__name__} subclass")
        return cls


CONNECTORS = Registry("connector", "kvoffload.connectors", "kvoffload.connector.base:KVConnectorBase", {
    "OffloadingConnector": "kvoffload.connector.offloading_connector:OffloadingConnector",
})
SPECS = Registry("spec", "kvoffload.specs", "kvoffload.offload.spec:OffloadingSpec", {
    "TieredOffloadingSpec": "kvoffload.tiers.tiered_spec:TieredOffloadingSpec",
    # Its name before it said what it builds (the whole chain, not only host memory): configs
    # written with it keep working.
    "CPUOffloadingSpec": "kvoffload.tiers.tiered_spec:TieredOffloadingSpec",
})
POLICIES = Registry("eviction policy", "kvoffload.policies", "kvoffload.offload.policy:CachePolicy", {
    "lru": "kvoffload.offload.lru:LRUCachePolicy",
    "arc": "kvoffload.offload.arc:ARCCachePolicy",
})
#: Kinds of secondary tier (the host tier, ``cpu``, is always first and is not a plugin).
TIER_KINDS = Registry("tier medium", "kvoffload.tiers", "kvoffload.tiers.base:TierKind", {
    "disk": "kvoffload.tiers.disk.kind:DiskKind",
    "mooncake": "kvoffload.tiers.mooncake.kind:MooncakeKind",
    "fs": "kvoffload.tiers.fs.kind:FsKind",
})


class PolicyClass(Protocol):
    """An eviction policy class as config sees it, below the layer that defines its contract
    (``kvoffload.offload.policy.CachePolicy``, which declares both members)."""

    needs_future: bool

    def __call__(self, cache_capacity: int) -> object: ...


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """An eviction policy resolved once, at config time: its name (how the native ledger and
    reports know it) and its class (what the tier instantiates, with no second lookup)."""

    name: str
    cls: PolicyClass


def resolve_policy(name: str) -> PolicyRef:
    """The policy ``name`` stands for; UnknownPluginError names it and the known ones."""
    return PolicyRef(name, cast(PolicyClass, POLICIES.load(name)))
