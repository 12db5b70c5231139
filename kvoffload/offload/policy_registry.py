"""Eviction policies by name: built-ins, the ``kvoffload.policies`` entry points, module:Class."""

from __future__ import annotations

from importlib.metadata import entry_points

from kvoffload.offload.policy import CachePolicy
from kvoffload.registry import load_object

ENTRY_POINT_GROUP = "kvoffload.policies"

_BUILTIN: dict[str, str] = {
    "lru": "kvoffload.offload.lru:LRUCachePolicy",
    "arc": "kvoffload.offload.arc:ARCCachePolicy",
}


class UnknownPolicyError(ValueError):
    pass


def known_policies() -> list[str]:
    names = set(_BUILTIN)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _load(target: str, name: str) -> type[CachePolicy]:
    cls = load_object(target, UnknownPolicyError, f"eviction policy {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, CachePolicy)):
        raise UnknownPolicyError(f"eviction policy {name!r} resolved to {cls!r}, not a CachePolicy subclass")
    return cls


def get_policy_class(name: str) -> type[CachePolicy]:
    if name in _BUILTIN:
        return _load(_BUILTIN[name], name)
    if ":" in name:
        return _load(name, name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return _load(ep.value, name)
    raise UnknownPolicyError(
        f"unknown eviction policy {name!r}; known: {', '.join(known_policies())}, or 'package.module:ClassName'"
    )


def create_policy(policy: str | CachePolicy, capacity: int) -> CachePolicy:
    if isinstance(policy, CachePolicy):
        return policy
    return get_policy_class(policy)(capacity)
