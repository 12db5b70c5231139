"""RequestOffloadState: everything the scheduler half tracks about one request, in one record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvoffload.connector.base import EngineRequest
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.offload.abstract import BlockHash, Medium


@dataclass(frozen=True, slots=True)
class SwapRecord:
    """A request swapped out at preemption: what a swap-in must restore, exactly."""

    computed_tokens: int  # its computed tokens when it was preempted
    tail_key: BlockHash | None  # the key its partial last block was stored under (None: no tail)


@dataclass(slots=True)
class RequestOffloadState:
    #: The engine's request (None until it is allocated, and after it finished).
    request: EngineRequest | None = None
    #: Its device block ids per KV-cache group, in order (engine blocks, not offloaded slots;
    #: 0, the null block, where a sliding window keeps none).
    block_ids: list[list[int]] = field(default_factory=list)
    #: Offloaded blocks below this index are stored or being stored (the store cursor).
    next_stored: int = 0
    #: Hashes of the load in flight (None when none is), so the engine keeps its blocks.
    loading: list[BlockHash] | None = None
    #: Its load jobs planned and not yet completed (``loading`` clears when this reaches 0).
    loads_in_flight: int = 0
    #: The load in flight is synchronous: the engine scheduled the request in the step that
    #: runs it and expects no finished-receiving report.
    sync_load: bool = False
    #: Hashes being stored (multiset), so the engine keeps the blocks the stores read.
    storing: Counter[BlockHash] = field(default_factory=Counter)
    #: Swapped out at preemption (None when not, or once restored or given up).
    swapped: SwapRecord | None = None
    #: Finished by the engine while copies were still in flight: dropped once they land.
    finished: bool = False

    @property
    def busy(self) -> bool:
        """A planned or in-flight copy still reads or fills this request's device blocks."""
        return bool(self.storing) or self.loading is not None


@dataclass(slots=True)
class JobRecord:
    """The scheduler half's view of a submitted job: the job and the hashes it moves."""

    job: TransferJob
    block_hashes: list[BlockHash]
    #: Prompt tokens a prefix-hit load serves once it lands (0 for every other job).
    hit_tokens: int = 0

    @property
    def kind(self) -> JobKind:
        return self.job.kind

    @property
    def req_id(self) -> str | None:
        return self.job.req_id

    @property
    def medium(self) -> Medium:
        """The offload tier the job reads (a load) or writes (a store or demotion)."""
        return self.job.src.medium() if self.job.kind is JobKind.LOAD else self.job.dst.medium()
