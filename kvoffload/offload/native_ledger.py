"""NativeSlotTable: a tier's slot table in C (``kvoffload_ext.ledger._ledger``) for "lru", "arc",
"arc_classic" and "prefix_value".

The same contract, slots, eviction order and ghost lists as the Python table; one C call per
run of hashes instead of Python work per hash. A tier is built on it for those names when the
extension was built at install time (``wants_native``, ``make_slot_table``); the Python table
stays the reference and the fallback (``native=False``, ``KVOFFLOAD_NO_NATIVE=1``, a policy
object, or no compiler at install).
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Iterable, Sequence

import numpy as np

from kvoffload.errors import ConfigError, require_positive
from kvoffload.offload.abstract import SLOT_ID_DTYPE, BlockHash, BlockNotReadyError, SlotIds, as_list
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.native_views import NativeARCView, NativeLedgerView, NativeLRUView
from kvoffload.offload.policy import CachePolicy
from kvoffload.offload.slot_table import Shown, SlotTable, StoreSlots
from kvoffload.registry import PolicyRef

try:
    from kvoffload_ext.ledger import _ledger
except ImportError as exc:  # built optionally: no compiler or headers at install time
    _ledger = None  # type: ignore[assignment]
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

logger = logging.getLogger(__name__)

#: Policy names the native ledger implements, and its code for each.
NATIVE_POLICIES = {"lru": 1, "arc": 2, "arc_classic": 3, "prefix_value": 4}

_warned = False

class NativeLedgerUnavailableError(ConfigError):
    """native=True was asked for but the extension is not built."""


def native_available() -> bool:
    return _ledger is not None


def wants_native(cache_policy: object, native: bool | None) -> bool:
    """Whether a CPU tier with this policy runs on the native ledger (None: when it can)."""
    global _warned
    name = cache_policy.name if isinstance(cache_policy, PolicyRef) else cache_policy
    named = isinstance(name, str) and name in NATIVE_POLICIES
    if native and not named:
        raise NativeLedgerUnavailableError(
            f"native=True with cache_policy={cache_policy!r}: the native ledger implements "
            f"{sorted(NATIVE_POLICIES)}; pass one of those names or native=None")
    if native is False or not named:
        return False
    if native is None and os.environ.get("KVOFFLOAD_NO_NATIVE"):
        return False
    if _ledger is None:
        if native:
            raise NativeLedgerUnavailableError(
                f"native=True but kvoffload_ext.ledger._ledger is not built ({_IMPORT_ERROR}); reinstall kvoffload "
                "where a C compiler and the Python headers are present (pip install -e .)")
        if not _warned:
            _warned = True
            logger.warning("native block ledger not built (%s): the %s tier runs the Python ledger, several "
                           "times slower; reinstall with a C compiler and Python headers to build it", _IMPORT_ERROR,
                           cache_policy)
        return False
    return True


class NativeSlotTable(SlotTable):
    """The slot table in C: every primitive one call into the extension."""

    def __init__(self, capacity: int, cache_policy: str | PolicyRef | CachePolicy, medium: str) -> None:
        wants_native(cache_policy, native=True)  # raises unless the extension runs this policy
        super().__init__(capacity, medium)
        require_positive("ledger capacity", capacity)
        name = cache_policy.name if isinstance(cache_policy, PolicyRef) else cache_policy
        assert isinstance(name, str)  # wants_native accepts names only
        cache_policy = name
        refs = array("i", bytes(4 * capacity))
        self._core = core = _ledger.Ledger(capacity, NATIVE_POLICIES[cache_policy], refs)
        self._view = NativeLedgerView(core, refs, capacity)
        view = NativeLRUView if cache_policy in ("lru", "prefix_value") else NativeARCView
        self._policy_view = view(core, refs, capacity)
        # The calls that need no translation are C's own, bound over the methods below (which
        # say what each does): a Python frame each is a tenth of the ledger's time per request.
        self.lookup = core.lookup  # type: ignore[method-assign, assignment]
        self.touch = core.touch  # type: ignore[method-assign, assignment]
        self.refresh = core.refresh  # type: ignore[method-assign, assignment]
        self.store_miss = core.store_miss  # type: ignore[method-assign, assignment]
        self.is_ready = core.is_ready  # type: ignore[method-assign, assignment]
        self.is_pending = core.is_pending  # type: ignore[method-assign, assignment]
        self.slot_of = core.slot_of  # type: ignore[method-assign, assignment]
        self.hash_at = core.hash_at  # type: ignore[method-assign]
        self.complete = core.complete_store  # type: ignore[method-assign, assignment]

    def debug_snapshot(self) -> NativeLedgerView:
        return self._view

    @property
    def policy(self) -> NativeLRUView:
        return self._policy_view

    @property
    def num_free(self) -> int:
        return self._core.num_free

    @property
    def num_used(self) -> int:
        return self._core.num_used

    def _refuse(self, hashes: list[BlockHash], bad: tuple[int, int], load: bool) -> Exception:
        block_hash = hashes[bad[0]]
        if bad[1] == 0:
            return BlockNotReadyError(f"block {block_hash!r} is not stored in the {self.medium} tier")
        if load:
            return BlockNotReadyError(f"block {block_hash!r} is still being written; lookup() before prepare_load()")
        return ValueError(f"complete_load for block {block_hash!r} without a matching prepare_load")

    # ---- the slot primitives in C --------------------------------------------------------
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        return self._core.lookup(block_hashes)

    def pin(self, block_hashes: list[BlockHash]) -> SlotIds:
        slots = self._core.pin(block_hashes)
        if isinstance(slots, tuple):
            raise self._refuse(block_hashes, slots, load=True)
        return np.frombuffer(slots, SLOT_ID_DTYPE)  # dtype positional: numpy parses a keyword slower

    def unpin(self, block_hashes: list[BlockHash]) -> None:
        bad = self._core.unpin(block_hashes)
        if bad is not None:
            raise self._refuse(block_hashes, bad, load=False)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self._core.touch(block_hashes)

    def store_miss(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        return self._core.store_miss(block_hashes)

    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        self._core.refresh(block_hashes)

    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None:
        """The native policies order by sightings alone: hints are for Python policies."""

    def allocate(self, block_hashes: Iterable[BlockHash], shown: Shown | None = None,
                 victim_slots: bool = True) -> StoreSlots | None:
        out = self._core.prepare_store(block_hashes, shown, victim_slots)
        if out is None:
            return None
        new, slots, evicted, evicted_slots = out
        return StoreSlots(new, np.frombuffer(slots, SLOT_ID_DTYPE), evicted, evicted_slots)

    def complete(self, block_hashes: Iterable[BlockHash], success: bool) -> list[BlockHash]:
        return self._core.complete_store(block_hashes, success)

    def restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        entries = sorted(entries, key=lambda e: e[1])
        self._core.restore([h for h, _ in entries], [s for _, s in entries])

    def forget_ready(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        return self._core.drop(as_list(block_hashes))

    def hash_at(self, slot: int) -> BlockHash | None:
        return self._core.hash_at(slot)

    def slot_of(self, block_hash: BlockHash) -> int | None:
        return self._core.slot_of(block_hash)

    def contains(self, block_hash: BlockHash) -> bool:
        return block_hash in self._core

    def is_ready(self, block_hash: BlockHash) -> bool:
        return self._core.is_ready(block_hash)

    def is_pending(self, block_hash: BlockHash) -> bool:
        return self._core.is_pending(block_hash)

    def busy(self) -> tuple[int, int]:
        return self._core.busy()
