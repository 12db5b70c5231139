"""LedgerTier: a tier whose slots this process owns (host memory, a local disk file, the test
tiers). It keeps the writes of the manager contract (pins, stores), its events, its I/O health
and its report; which hash is in which slot, and which slot goes first, is its ``index``, a
``SlotTable``: the C one for the policies the native ledger implements (where it is built), the
Python one for any other CachePolicy, chosen when the tier is built (``make_slot_table``). Reads
go to the index directly (the chain's, and a lone tier's ``lookup``/``touch``), never through
the tier. Tensor-free, like everything scheduler-side.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import BlockHash, LoadStoreSpec, OffloadingEvent, PrepareStoreOutput, as_list
from kvoffload.offload.event_queue import EventQueue
from kvoffload.offload.native_ledger import NativeSlotTable, wants_native
from kvoffload.offload.policy import CachePolicy
from kvoffload.offload.python_slots import PythonSlotTable
from kvoffload.offload.slot_table import SlotTable
from kvoffload.offload.tier import Tier
from kvoffload.offload.tier_health import TierHealth
from kvoffload.offload.tier_report import TierReport
from kvoffload.registry import PolicyRef

#: Undrained events kept per tier before the oldest are dropped.
MAX_QUEUED_EVENTS = 10_000


def make_slot_table(capacity: int, cache_policy: str | PolicyRef | CachePolicy, medium: str,
                    native: bool | None = None) -> SlotTable:
    """The C table where it is built and implements ``cache_policy`` (a name), else the Python
    one; ``native``: None = as available, False = Python, True = C or NativeLedgerUnavailableError."""
    if wants_native(cache_policy, native):
        return NativeSlotTable(capacity, cache_policy, medium)
    return PythonSlotTable(capacity, cache_policy, medium)


class LedgerTier(Tier):
    def __init__(self, capacity: int, cache_policy: str | PolicyRef | CachePolicy, spec_type: type[LoadStoreSpec],
                 block_size: int = 0, enable_events: bool = False, retry_after_s: float | None = None,
                 native: bool | None = None) -> None:
        """``retry_after_s``: a tier whose copies can fail (a file) keeps I/O health and goes out
        of service that long after errors in a row; None = it cannot fail (host memory).
        ``native``: None = the native slot table when it is built and runs ``cache_policy``,
        False = the Python one, True = the native one or NativeLedgerUnavailableError."""
        if capacity < 1:
            raise ValueError(f"num_blocks={capacity}: a tier needs at least one block")
        self.spec_type = spec_type
        #: ``slot_spec`` without its frame, for the two calls made per request.
        self._spec_for = spec_type.for_blocks
        self.medium = spec_type.medium()
        self.num_blocks = self.capacity = capacity
        self.block_size = block_size
        self.health = TierHealth(retry_after_s, self.describe) if retry_after_s is not None else None
        self.num_corrupt = 0
        self._events: EventQueue[OffloadingEvent] | None = EventQueue(
            MAX_QUEUED_EVENTS, f"{self.medium} tier", "call take_events() regularly") if enable_events else None
        self.index: SlotTable = make_slot_table(capacity, cache_policy, self.medium, native)

    def describe(self) -> str:
        """How log lines name this tier."""
        return f"{self.medium.lower()} tier"

    @property
    def num_events_dropped(self) -> int:
        return self._events.num_dropped if self._events is not None else 0

    def _emit(self, hashes: list[BlockHash], removed: bool) -> None:
        if self._events is not None and hashes:
            self._events.put(OffloadingEvent(hashes, self.block_size, self.medium, removed))

    # ---- the manager contract, over the slot primitives below -----------------------------
    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        hashes = as_list(block_hashes)
        return self._spec_for(self.index.pin(hashes), hashes)

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        self.index.unpin(as_list(block_hashes))

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        out = self.index.allocate(block_hashes)
        if out is None:
            return None
        if out.evicted and self._events is not None:
            self._emit(out.evicted, removed=True)
        return PrepareStoreOutput(out.new, self._spec_for(out.slots, out.new), out.evicted, out.evicted_slots)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        done = self.index.complete(block_hashes, success)
        if success and self._events is not None:  # the test first: no call per store without events
            self._emit(done, removed=False)

    def sole_table(self) -> SlotTable | None:
        """The slot table, when this tier's writes are the table's and nothing more: no events
        queued, no I/O health kept, no subclass write path (see TierChain.sole_table)."""
        cls = type(self)
        plain = (cls.prepare_load is LedgerTier.prepare_load and cls.complete_load is LedgerTier.complete_load
                 and cls.prepare_store is LedgerTier.prepare_store and cls.complete_store is LedgerTier.complete_store)
        return self.index if plain and self._events is None and self.health is None else None

    def take_events(self) -> list[OffloadingEvent]:
        return self._events.take() if self._events is not None else []

    def slot_spec(self, slots: Sequence[int], block_hashes: list[BlockHash]) -> LoadStoreSpec:
        return self.spec_type.for_blocks(slots, block_hashes)

    def drop(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Forget ready, unpinned blocks (found corrupt); returns the hashes dropped."""
        dropped = self.index.forget_ready(block_hashes)
        self._emit(dropped, removed=True)
        return dropped

    def drop_slots(self, slots: list[int]) -> int:
        hashes = [h for h in map(self.index.hash_at, slots) if h is not None]
        n = len(self.drop(hashes))
        self.num_corrupt += n
        return n

    @property
    def in_service(self) -> bool:
        return self.health is None or self.health.in_service

    def note_io(self, ok: bool, write: bool = False) -> None:
        if self.health is not None:
            self.health.note_io(ok, write)

    @property
    def num_free_blocks(self) -> int:
        return self.index.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.index.num_used

    def report(self) -> TierReport:
        pinned, writing = self.index.busy()
        health = self.health
        return TierReport(self.medium, self.index.num_used, self.num_blocks, pinned, writing,
                          in_service=self.in_service, corrupt_blocks=self.num_corrupt,
                          io_errors=health.num_io_errors if health else 0,
                          outages=health.num_outages if health else 0)
