"""Eviction policies by name: built-ins, the ``kvoffload.policies`` entry points, module:Class
(all through the generic ``kvoffload.registry.POLICIES``)."""

from __future__ import annotations

from kvoffload.errors import UnknownPluginError
from kvoffload.offload.policy import CachePolicy
from kvoffload.registry import POLICIES

ENTRY_POINT_GROUP = POLICIES.group

#: Kept for callers that catch it by this name; every registry raises the same error.
UnknownPolicyError = UnknownPluginError


def known_policies() -> list[str]:
    return POLICIES.known()


def get_policy_class(name: str) -> type[CachePolicy]:
    return POLICIES.load(name)


def create_policy(policy: str | CachePolicy, capacity: int) -> CachePolicy:
    if isinstance(policy, CachePolicy):
        return policy
    return get_policy_class(policy)(capacity)
