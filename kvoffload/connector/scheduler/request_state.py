"""RequestOffloadState: everything the scheduler half knows of one request, in one record.

A record is made at the request's first lookup (or allocation) and dropped in one place
(``SchedulerRecords.drop``): when the engine finishes the request, or, if copies still read or
fill its blocks then, when the last of them lands. No planner keeps a table of its own keyed by
request, so nothing can outlive the request (tests count the scheduler half's tables).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvoffload.connector.base import EngineRequest
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.offload.abstract import BlockHash, Medium
from kvoffload.offload.hints import RequestHint


@dataclass(frozen=True, slots=True)
class SwapRecord:
    """A request swapped out at preemption: what a swap-in must restore, exactly."""

    computed_tokens: int  # its computed tokens when it was preempted
    tail_key: BlockHash | None  # the key its partial last block was stored under (None: no tail)


@dataclass(frozen=True, slots=True)
class TenantHint:
    """A request's parsed hint and the tenant its session is scoped to."""

    hint: RequestHint
    tenant: bytes


@dataclass(slots=True)
class RequestOffloadState:
    # ---- lookups (before the engine allocates) ---------------------------------------------
    #: Its blocks were touched and its hint given (once: a waiting request is looked up every
    #: step, and each look is not a reuse).
    touched: bool = False
    #: Its hint was read from the request (``hint`` is what it said: None for no hint).
    hint_read: bool = False
    hint: TenantHint | None = None
    #: The load decision for its hit was counted (once per request).
    decision_counted: bool = False
    #: Tokens the engine found on the device at the last lookup (where its loads start).
    local_tokens: int | None = None
    #: The last lookup answered a synchronous (layer-wise) load.
    sync_answer: bool = False
    #: The tier each key the last lookup found is in (the plan pins where the lookup found).
    found: dict[BlockHash, Medium] | None = None
    # ---- allocated ---------------------------------------------------------------------------
    #: The engine's request (None until it is allocated, and after it finished).
    request: EngineRequest | None = None
    #: Its device block ids per KV-cache group, in order (engine blocks, not offloaded slots;
    #: 0, the null block, where a sliding window keeps none).
    block_ids: list[list[int]] = field(default_factory=list)
    #: Offloaded blocks below this index are stored or being stored (the store cursor).
    next_stored: int = 0
    #: It read device KV computed before the last offload-cache reset: nothing of it is stored
    #: (``ResetGuard``), and it is not swapped out at preemption.
    stale_kv: bool = False
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
    def allocated(self) -> bool:
        """The engine allocated it blocks (it was not only looked up)."""
        return self.request is not None or self.finished or bool(self.block_ids)

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
