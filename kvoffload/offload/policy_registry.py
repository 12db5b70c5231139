"""Eviction policies by name: built-ins, the ``kvoffload.policies`` entry points, module:Class
(all through the generic ``kvoffload.registry.POLICIES``)."""

from __future__ import annotations

from kvoffload.errors import UnknownPluginError
from kvoffload.offload.policy import CachePolicy
from kvoffload.registry import POLICIES, PolicyRef

ENTRY_POINT_GROUP = POLICIES.group

#: Kept for callers that catch it by this name; every registry raises the same error.
UnknownPolicyError = UnknownPluginError


def known_policies() -> list[str]:
    return POLICIES.known()


def get_policy_class(name: str) -> type[CachePolicy]:
    return POLICIES.load(name)


def create_policy(policy: str | PolicyRef | CachePolicy, capacity: int) -> CachePolicy:
    """A policy of ``capacity`` blocks: an instance as given, a resolved policy's class (config
    resolved it once), or a name resolved now."""
    if isinstance(policy, CachePolicy):
        return policy
    if isinstance(policy, PolicyRef):
        made = policy.cls(capacity)
        if not isinstance(made, CachePolicy):  # the registry checked the class; a plugin's __new__ may not
            raise TypeError(f"eviction policy {policy.name!r} made a {type(made).__name__}, not a CachePolicy")
        return made
    return get_policy_class(policy)(capacity)
