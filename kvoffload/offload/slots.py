"""``make_slot_table``: the slot table a ledger tier is built on, chosen once when it is built."""

from __future__ import annotations

from kvoffload.offload.native_ledger import NativeSlotTable, wants_native
from kvoffload.offload.policy import CachePolicy
from kvoffload.offload.python_slots import PythonSlotTable
from kvoffload.offload.slot_table import SlotTable
from kvoffload.registry import PolicyRef


def make_slot_table(capacity: int, cache_policy: str | PolicyRef | CachePolicy, medium: str,
                    native: bool | None = None) -> SlotTable:
    """The C table where it is built and implements ``cache_policy`` (a name), else the Python
    one; ``native``: None = as available, False = Python, True = C or NativeLedgerUnavailableError."""
    if wants_native(cache_policy, native):
        return NativeSlotTable(capacity, cache_policy, medium)
    return PythonSlotTable(capacity, cache_policy, medium)
