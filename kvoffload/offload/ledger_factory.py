"""make_ledger: the one place that chooses between the native and the Python SlotLedger."""

from __future__ import annotations

from kvoffload.offload.native_ledger import NativeSlotLedger, wants_native
from kvoffload.offload.policy import CachePolicy
from kvoffload.offload.py_ledger import PySlotLedger
from kvoffload.offload.slot_ledger import SlotLedger
from kvoffload.registry import PolicyRef


def make_ledger(cache_policy: str | PolicyRef | CachePolicy, capacity: int, native: bool | None = None,
                name: str = "CPU") -> SlotLedger:
    """A ledger of ``capacity`` slots evicting by ``cache_policy`` (a registered name or a
    CachePolicy). ``native``: None = the C ledger when it is built and runs this policy, False =
    never, True = the C ledger or NativeLedgerUnavailableError. ``name`` is the tier, as errors
    name it."""
    if capacity < 1:
        raise ValueError(f"num_blocks={capacity}: a tier needs at least one block")
    if wants_native(cache_policy, native):
        policy_name = cache_policy.name if isinstance(cache_policy, PolicyRef) else cache_policy
        assert isinstance(policy_name, str)  # wants_native accepts names only
        return NativeSlotLedger(capacity, policy_name, name)
    return PySlotLedger(capacity, cache_policy, name)
