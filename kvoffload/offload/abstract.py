"""The scheduler-side offload contract: OffloadingManager and the records it returns.

Everything here is tensor-free bookkeeping. A manager tracks which offloaded blocks exist,
where (slot ids in its medium) and whether they are ready; the worker moves the bytes.

Protocol (per block hash):
    prepare_store → [worker writes] → complete_store(success)   store path
    lookup → prepare_load → [worker reads] → complete_load       load path
A block is *ready* once its store completed. Loads pin blocks (ref_cnt > 0) so eviction
cannot reuse their slots while a copy reads them; a block being written (ref_cnt == -1) is
neither loadable nor evictable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

import numpy as np
import numpy.typing as npt

BlockHash = Hashable
#: ``(is_ready, is_pending)`` of one key (``TierChain.key_probes``).
KeyProbes = tuple[Callable[[BlockHash], bool], Callable[[BlockHash], bool]]
#: Slot (or device block) ids as the copy layer takes them.
SlotIds = npt.NDArray[np.int64]
#: Their dtype, as one object: ``dtype is SLOT_ID_DTYPE`` tells an array needs no conversion.
SLOT_ID_DTYPE = np.dtype(np.int64)


def as_list(block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
    """The hashes as a list, without a copy when they are one already (the hot paths pass lists)."""
    return block_hashes if isinstance(block_hashes, list) else list(block_hashes)


class Medium(str):
    """Where a LoadStoreSpec's slots live, as a plain string (``Medium.CPU == "CPU"``), so events
    and stats keep their plain names. The set is open: GPU and CPU are the engine's and the host
    tier's; every other medium is registered beside the spec of the tier kind that owns it
    (``DISK = Medium.register("DISK")``), so a new kind changes nothing here."""

    GPU: ClassVar[Medium]
    CPU: ClassVar[Medium]
    _registered: ClassVar[dict[str, Medium]] = {}
    #: Per medium: the name KV events give it, and whether every replica reaches it.
    _routing: ClassVar[dict[str, tuple[str, bool]]] = {}

    @classmethod
    def register(cls, name: str, event_name: str | None = None, shared: bool = False) -> Medium:
        """The medium called ``name`` (upper case); the same object for the same name, so a kind
        registered twice (a re-import) is one medium. ``event_name``: the medium KV events name
        it by, one KV-aware routers place (``CPU``: host memory; ``DISK``: this machine's
        storage; ``SHARED``: storage every replica reads); default ``name``. ``shared``: every
        replica pointed at the same store reaches its blocks."""
        for n in (name, event_name or name):
            if not n or not n.isupper() or not n.replace("_", "").isalnum():
                raise ValueError(f"medium name {n!r}: use upper-case letters, digits and _ (e.g. 'NVME')")
        cls._routing.setdefault(name, (event_name or name, shared))
        return cls._registered.setdefault(name, cls(name))

    @classmethod
    def of(cls, name: str) -> Medium:
        """The registered medium called ``name`` (an unregistered name: a medium of that name
        that events call by it, local to this replica)."""
        return cls._registered.get(name) or cls(name)

    @property
    def event_name(self) -> str:
        """The medium KV events carry for this one (see ``register``)."""
        return self._routing.get(str.__str__(self), (str.__str__(self), False))[0]

    @property
    def shared(self) -> bool:
        """Every replica pointed at the same store reaches this medium's blocks."""
        return self._routing.get(str.__str__(self), ("", False))[1]

    def __repr__(self) -> str:
        return f"Medium({str.__str__(self)!r})"


Medium.GPU = Medium.register("GPU")
Medium.CPU = Medium.register("CPU")


class LoadStoreSpec(ABC):
    """Where blocks live in one medium: slot ids aligned with the block hashes given."""

    __slots__ = ("block_ids",)

    def __init__(self, block_ids: Sequence[int] | SlotIds) -> None:
        # A ledger's slots come as an int64 vector already (the native one's without a copy).
        if type(block_ids) is not np.ndarray or block_ids.dtype is not SLOT_ID_DTYPE or block_ids.ndim != 1:
            block_ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
        self.block_ids: SlotIds = block_ids

    @staticmethod
    @abstractmethod
    def medium() -> Medium:
        """The medium these slots are in."""

    @classmethod
    def for_blocks(cls, block_ids: Sequence[int] | SlotIds, block_hashes: list[BlockHash]) -> LoadStoreSpec:
        """The spec of slots holding these blocks (a keyed spec also keeps their hashes)."""
        return cls(block_ids)

    def __len__(self) -> int:
        return len(self.block_ids)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and np.array_equal(self.block_ids, other.block_ids)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_ids.tolist()})"


class BlockNotReadyError(KeyError):
    """prepare_load was asked for a block that is absent or still being written."""

    def __str__(self) -> str:
        return str(self.args[0])


class LookupResult(Enum):
    """What a lookup found for one block (vLLM's names)."""

    HIT = "hit"  # ready in some tier
    MISS = "miss"  # in no tier: recompute
    HIT_PENDING = "hit_pending"  # its store has not landed yet: wait a step rather than recompute
    RETRY = "retry"  # the manager cannot answer now: ask again next step


@dataclass(slots=True)
class PrefixLookup:
    """One pass over a request's block hashes: the tier of each leading hit, and what stopped
    the run (MISS, HIT_PENDING or RETRY at ``hashes[hits]``; HIT when every block hit)."""

    media: list[Medium]
    stop: LookupResult

    @property
    def hits(self) -> int:
        return len(self.media)


@dataclass(slots=True)
class PrepareStoreOutput:
    block_hashes_to_store: list[BlockHash]
    store_spec: LoadStoreSpec
    block_hashes_evicted: list[BlockHash]
    #: Slots the evicted blocks occupied (aligned with block_hashes_evicted), for demotion.
    evicted_block_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class OffloadingEvent:
    """Blocks stored into (``removed=False``) or evicted from (``removed=True``) a medium."""

    block_hashes: list[BlockHash]
    block_size: int
    medium: str
    removed: bool


class OffloadingManager(ABC):
    """vLLM's small manager contract: all a single ledger needs. What a chain of tiers adds
    (segmented loads, demotions, health, reports) is ``TierChain``'s (offload/chain.py)."""

    #: The first tier's medium, and tokens per offloaded block (events carry both).
    medium: Medium = Medium.CPU
    block_size: int = 0

    @abstractmethod
    def lookup(self, block_hashes: Iterable[BlockHash]) -> int | None:
        """Length of the leading run of present *and ready* blocks; None = ask again later."""

    @abstractmethod
    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        """Pin every (ready) block against eviction and return their slots, in order. One spec
        is one tier: a manager of several tiers refuses blocks that span tiers (nothing stays
        pinned); ``prepare_load_segments`` is the form that always works."""

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Mark blocks recently used; ``block_hashes[0]`` ends up the most recent."""

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        """Unpin blocks after their load finished.

        ``medium`` names the tier the load was served from (the ``medium()`` of the spec
        ``prepare_load`` returned), so a manager of several tiers releases exactly the pin that
        load took, even when the same hash is pinned in two tiers at once.
        """

    @abstractmethod
    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        """Allocate slots for the hashes not yet stored, evicting if needed.

        New blocks are inserted not ready. Returns None, with nothing changed, when eviction
        cannot free enough slots.
        """

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        """Mark stored blocks ready, or drop them and free their slots on failure."""

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Drain queued stored/removed events (empty when events are disabled)."""
        return ()

    def close(self) -> None:
        """Release resources (files, threads); the manager is unusable afterwards."""


@dataclass(frozen=True, slots=True)
class Demotion:
    """A copy of blocks from a faster tier's slots (src) into a slower tier's (dst)."""

    block_hashes: list[BlockHash]
    src: LoadStoreSpec
    dst: LoadStoreSpec
