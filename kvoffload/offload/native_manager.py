"""CPUOffloadingManager over the native ledger (``kvoffload_ext._ledger``): "lru", "arc", "arc_classic".

The same contract, slots, eviction order, ghost lists and events as the Python ledger; one C
call per run of hashes instead of Python work per hash. ``CPUOffloadingManager(...)`` returns
this class by itself when the policy is one of those names and the extension was built at
install time; the Python ledger stays the reference and the fallback (``native=False``,
``KVOFFLOAD_NO_NATIVE=1``, a policy object, or no compiler when the package was installed).
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Iterable

from kvoffload.errors import ConfigError
from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, PrepareStoreOutput, as_list
from kvoffload.offload.cpu_manager import BlockNotReadyError, CPUOffloadingManager
from kvoffload.offload.native_views import NativeARCView, NativeLedgerView, NativeLRUView

try:
    from kvoffload_ext import _ledger
except ImportError as exc:  # built optionally: no compiler or headers at install time
    _ledger = None  # type: ignore[assignment]
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

logger = logging.getLogger(__name__)

#: Policy names the native ledger implements, and its code for each.
NATIVE_POLICIES = {"lru": 1, "arc": 2, "arc_classic": 3}

_warned = False


class NativeLedgerUnavailableError(ConfigError):
    """native=True was asked for but the extension is not built."""


def native_available() -> bool:
    return _ledger is not None


def wants_native(cache_policy: object, native: bool | None) -> bool:
    """Whether a CPU tier with this policy runs on the native ledger (None: when it can)."""
    global _warned
    named = isinstance(cache_policy, str) and cache_policy in NATIVE_POLICIES
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
                f"native=True but kvoffload_ext._ledger is not built ({_IMPORT_ERROR}); reinstall kvoffload "
                "where a C compiler and the Python headers are present (pip install -e .)")
        if not _warned:
            _warned = True
            logger.warning("native block ledger not built (%s): the %s tier runs the Python ledger, several "
                           "times slower; reinstall with a C compiler and Python headers to build it", _IMPORT_ERROR,
                           cache_policy)
        return False
    return True


class NativeCPUOffloadingManager(CPUOffloadingManager):
    def __init__(
        self,
        num_blocks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
        block_size: int = 0,
        native: bool | None = None,
    ) -> None:
        wants_native(cache_policy, native=True)  # raises unless the extension runs this policy
        self._init_tier(num_blocks, block_size, enable_events)
        refs = array("i", bytes(4 * num_blocks))
        self._core = core = _ledger.Ledger(num_blocks, NATIVE_POLICIES[cache_policy], refs)
        self.ledger = NativeLedgerView(core, refs, num_blocks)  # type: ignore[assignment]
        view = NativeLRUView if cache_policy == "lru" else NativeARCView
        self.policy = view(core, refs, num_blocks)  # type: ignore[assignment]

    @property
    def num_free_blocks(self) -> int:
        return self._core.num_free

    @property
    def num_used_blocks(self) -> int:
        return self._core.num_used

    def _refuse(self, hashes: list[BlockHash], bad: tuple[int, int], load: bool) -> Exception:
        block_hash = hashes[bad[0]]
        if bad[1] == 0:
            return BlockNotReadyError(f"block {block_hash!r} is not stored in the {self.medium} tier")
        if load:
            return BlockNotReadyError(f"block {block_hash!r} is still being written; lookup() before prepare_load()")
        return ValueError(f"complete_load for block {block_hash!r} without a matching prepare_load")

    # ---- contract ------------------------------------------------------------------------
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        return self._core.lookup(block_hashes)

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        hashes = as_list(block_hashes)
        slots = self._core.pin(hashes)
        if isinstance(slots, tuple):
            raise self._refuse(hashes, slots, load=True)
        return self.spec_type(slots)

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self._core.touch(block_hashes)

    def on_store_miss(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        return self._core.store_miss(block_hashes)

    def refresh(self, block_hashes: Iterable[BlockHash]) -> None:
        self._core.refresh(block_hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        hashes = as_list(block_hashes)
        bad = self._core.unpin(hashes)
        if bad is not None:
            raise self._refuse(hashes, bad, load=False)

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        out = self._core.prepare_store(block_hashes)
        if out is None:
            return None
        new, slots, evicted, evicted_slots = out
        if evicted and self._events is not None:
            self._emit(evicted, removed=True)
        return PrepareStoreOutput(new, self.spec_type(slots), evicted, evicted_slots)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        done = self._core.complete_store(block_hashes, success)
        if success and self._events is not None:
            self._emit(done, removed=False)

    def restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        entries = sorted(entries, key=lambda e: e[1])
        self._core.restore([h for h, _ in entries], [s for _, s in entries])

    def drop(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        dropped = self._core.drop(as_list(block_hashes))
        self._emit(dropped, removed=True)
        return dropped

    def hash_at(self, slot: int) -> BlockHash | None:
        return self._core.hash_at(slot)

    def usage(self) -> dict[str, tuple[int, int]]:
        return {self.medium.lower(): (self._core.num_used, self.num_blocks)}

    def busy_blocks(self) -> tuple[int, int]:
        return self._core.busy()

    def contains(self, block_hash: BlockHash) -> bool:
        return block_hash in self._core

    def slot_of(self, block_hash: BlockHash) -> int | None:
        return self._core.slot_of(block_hash)

    def is_pending(self, block_hash: BlockHash) -> bool:
        return self._core.is_pending(block_hash)

    def is_ready(self, block_hash: BlockHash) -> bool:
        return self._core.is_ready(block_hash)
