"""A request's token state, lifecycle status and incrementally grown block hashes."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from kvoffload.engine.hashing import BlockHash, hash_request_blocks
from kvoffload.engine.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


@dataclass(slots=True, eq=False)
class Request:
    """One generation request as the scheduler sees it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_size: int
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    #: Sampling seed used when SamplingParams.seed is None (the engine derives it).
    seed: int = 0
    cache_salt: str | None = None
    extra_keys: tuple | None = None
    #: The caller's parameters for the KV connector (vLLM's field): ``{"kvoffload": hint}``.
    kv_transfer_params: dict[str, object] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    #: Tokens whose KV was swapped out at the last preemption (0 = recompute).
    swapped_tokens: int = 0
    #: Most tokens ever computed before a preemption (to count what is recomputed).
    computed_before_preemption: int = 0
    status: RequestStatus = RequestStatus.WAITING
    block_hashes: list[BlockHash] = field(default_factory=list)
    first_token_time: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: empty prompt; give at least one token")
        self.all_token_ids = list(self.prompt_token_ids)
        self.update_block_hashes()

    @property
    def hash_extra_keys(self) -> tuple | None:
        keys = tuple(k for k in (self.cache_salt, *(self.extra_keys or ())) if k is not None)
        return keys or None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def update_block_hashes(self) -> None:
        """Hash only the full blocks that appeared since the last call (O(new blocks))."""
        start = len(self.block_hashes)
        parent = self.block_hashes[-1] if start else None
        self.block_hashes.extend(
            hash_request_blocks(
                self.all_token_ids, self.block_size, self.hash_extra_keys, parent, start
            )
        )

    def append_output_token_ids(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.update_block_hashes()

    def check_stop(self, max_model_len: int) -> bool:
        """Set a FINISHED status when the last token ends the request; return whether it did."""
        params = self.sampling_params
        last = self.output_token_ids[-1] if self.output_token_ids else None
        if last is not None and ((not params.ignore_eos and last == self.eos_token_id) or last in params.stop_token_ids):
            self.status = RequestStatus.FINISHED_STOPPED
        elif self.num_output_tokens >= params.max_tokens or self.num_tokens >= max_model_len:
            self.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return self.is_finished

    def fork(self, child_id: str, params: SamplingParams | None = None) -> Request:
        """A running copy of this request under ``child_id`` (parallel samples, beams): same
        prompt, output so far, hashes and progress; ``params`` replaces its sampling."""
        child = Request(
            request_id=child_id,
            prompt_token_ids=list(self.prompt_token_ids),
            sampling_params=params or self.sampling_params,
            block_size=self.block_size,
            eos_token_id=self.eos_token_id,
            priority=self.priority,
            cache_salt=self.cache_salt,
            extra_keys=self.extra_keys,
            kv_transfer_params=self.kv_transfer_params,
            seed=self.seed,
        )
        child.output_token_ids = list(self.output_token_ids)
        child.all_token_ids = list(self.all_token_ids)
        child.block_hashes = list(self.block_hashes)
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.arrival_time = self.arrival_time
        child.first_token_time = self.first_token_time
        child.status = RequestStatus.RUNNING
        return child
