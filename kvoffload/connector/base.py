"""The contract between an engine and a KV connector (mirrors vLLM's KVConnectorBase_V1).

The engine builds a connector twice, once per role. The scheduler-side instance plans:
it reports external prefix hits, learns the blocks allocated for them, and at the end of each
step packs a ``KVConnectorMetadata`` describing the loads and stores the worker must run. The
worker-side instance executes: it receives the KV-cache tensors once, then per step gets the
metadata bound, starts loads before the forward pass, saves after it, and reports which
requests' asynchronous loads (recved) and stores (sent) finished.

Call order per engine step::

    scheduler: get_num_new_matched_tokens → update_state_after_alloc → build_connector_meta
    worker:    bind_connector_metadata → start_load_kv → [wait_for_layer_load / save_kv_layer
               per layer] → wait_for_save → get_finished → clear_connector_metadata
    scheduler: update_connector_output(worker's KVConnectorOutput); request_finished on finish
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kvoffload.offload.abstract import BlockHash
from kvoffload.offload.hints import RequestHint as RequestHint  # the contract's: the engine passes it on
from kvoffload.offload.hints import parse_hint as parse_hint

if TYPE_CHECKING:
    import torch

#: A request's device block ids, one list per KV-cache group (vLLM's shape).
GroupBlockIds = tuple[list[int], ...]


# ---- what a connector reads of an engine (vLLM's objects have the same shape) ---------------
class EngineRequest(Protocol):
    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def block_hashes(self) -> Sequence[BlockHash]:
        """The chained hash of each full engine block of its tokens, in order."""
    @property
    def all_token_ids(self) -> Sequence[int]:
        """Its prompt and output tokens so far (KV events carry a block's tokens)."""
    @property
    def output_token_ids(self) -> Sequence[int]:
        """The tokens it generated so far (its finish tells whether it ended in a tool call)."""
    @property
    def kv_transfer_params(self) -> Mapping[str, object] | None:
        """The caller's parameters for KV connectors; kvoffload reads its hint from the
        ``"kvoffload"`` entry (``kvoffload.offload.hints``)."""
    @property
    def cache_salt(self) -> str | None:
        """The tenant's salt (vLLM's): it enters the block hashes, and scopes hint sessions."""


#: Bytes that enter a request's offload keys beside its tokens (None: nothing), e.g. a digest of
#: the adapter weights it runs with; the same for every call about one request.
RequestSalt = Callable[[EngineRequest], bytes | None]


class CachedBlock(Protocol):
    @property
    def block_hash(self) -> object | None:
        """Set once the block is full and in the prefix cache (a local hit)."""


class AllocatedBlocks(Protocol):
    """The blocks an admission allocated: local hits first, then new ones, per group."""

    @property
    def blocks(self) -> Sequence[Sequence[CachedBlock]]: ...
    def get_block_ids(self) -> GroupBlockIds: ...


class NewRequestView(Protocol):
    @property
    def req_id(self) -> str: ...
    @property
    def block_ids(self) -> GroupBlockIds: ...


class CachedRequestsView(Protocol):
    """Requests that ran before: new block ids to append, or all of them once resumed."""

    @property
    def req_ids(self) -> Sequence[str]: ...
    @property
    def resumed_from_preemption(self) -> Sequence[bool]: ...
    @property
    def new_block_ids(self) -> Sequence[GroupBlockIds | None]: ...


class ScheduledStep(Protocol):
    """One engine step's schedule, as the scheduler half plans its stores from it."""

    @property
    def scheduled_new_reqs(self) -> Sequence[NewRequestView]: ...
    @property
    def scheduled_cached_reqs(self) -> CachedRequestsView: ...
    @property
    def num_scheduled_tokens(self) -> Mapping[str, int]: ...
    @property
    def preempted_req_ids(self) -> Set[str]: ...
    @property
    def block_replacements(self) -> Mapping[str, list[tuple[int, int, int]]]:
        """Copy-on-write: block-table entries redirected this step, per request (group, block
        index, new block id); empty where the engine shares no blocks between requests."""


class EngineConfigView(Protocol):
    @property
    def kv_offload(self) -> object:
        """The offload section (an OffloadConfig, a YAML path, a packaged example's name or a dict)."""


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata:
    """Base for the per-step plan passed from the scheduler half to the worker half."""


@dataclass(slots=True)
class KVConnectorOutput:
    """What the worker half reports back each step."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    #: The worker half's own report to its scheduler half (opaque to the engine).
    worker_meta: object = None

    def is_empty(self) -> bool:
        return not (self.finished_sending or self.finished_recving or self.failed_recving or self.worker_meta)


class KVConnectorBase(ABC):
    def __init__(self, config: object, role: KVConnectorRole) -> None:
        self._config = config
        self._role = role
        self._connector_metadata: KVConnectorMetadata | None = None

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # ---- worker side -------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Receive the paged KV-cache tensors once, before the first step."""

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None, "no connector metadata bound for this step"
        return self._connector_metadata

    def handle_preemptions(self, connector_metadata: KVConnectorMetadata) -> None:
        """Finish every transfer touching preempted requests' blocks before they are reused."""

    def start_load_kv(self, **kwargs: object) -> None:
        """Begin loading this step's external KV into the paged cache (may be asynchronous)."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until layer ``layer_name``'s KV has landed (layer-wise pipelining)."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, **kwargs: object) -> None:
        """Offer one layer's freshly written KV for saving."""

    def wait_for_save(self) -> None:
        """Called after the forward pass; the KV of this step must be safe to read from here on."""

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Request ids whose async sends and receives finished; must not block."""
        return None, None

    def get_failed_recving(self) -> set[str]:
        """Requests whose async load failed since the last call: they must be recomputed."""
        return set()

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Device blocks a synchronous load of this step failed to fill (asked after
        get_finished): every request scheduled with one of them recomputes from it on."""
        return set()

    def build_connector_worker_meta(self) -> object:
        return None

    # ---- scheduler side ----------------------------------------------------------------
    @abstractmethod
    def get_num_new_matched_tokens(self, request: EngineRequest, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond ``num_computed_tokens`` the connector can supply, and whether async.

        ``None`` means "cannot tell yet, ask again next step".
        """

    @abstractmethod
    def update_state_after_alloc(self, request: EngineRequest, blocks: AllocatedBlocks, num_external_tokens: int) -> None:
        """Learn the device blocks allocated for a request (external tokens land in them)."""

    @abstractmethod
    def build_connector_meta(self, scheduler_output: ScheduledStep) -> KVConnectorMetadata:
        """Pack this step's plan for the worker; resets per-step scheduler-side state."""

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Digest the worker's report (finished loads and stores)."""

    def request_finished(self, request: EngineRequest, block_ids: GroupBlockIds) -> tuple[bool, dict[str, object] | None]:
        """Return True to keep the request's blocks until its sends are reported finished."""
        return False, None

    def has_pending_work(self) -> bool:
        """Copies in flight or queued (disk demotions) that need more engine steps to finish;
        the engine keeps stepping while this is true, so nothing planned is lost at the end."""
        return False

    def swap_out(self, request: EngineRequest, block_ids: GroupBlockIds) -> bool:
        """Preemption in swap mode: save the request's computed KV (full blocks and the partial
        last one) before its blocks are freed. False = cannot, the request is recomputed."""
        return False

    def reset_cache(self) -> bool | None:
        """Forget every externally cached block (the weights changed in place); True once
        done, False if it cannot be done now, None if this connector keeps no cache."""
        return None

    def take_events(self) -> Iterable[object]:
        return ()

    def stats(self) -> Mapping[str, object]:
        """Counters for reports (hits per tier, bytes moved); empty when there are none."""
        return {}

    def close(self) -> None:
        """Release what this half holds (tiers' files and locks, copy threads); idempotent."""
