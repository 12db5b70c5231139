"""What the scheduler hands the model runner each step.

New requests carry everything; continuing ones only the diff (new block ids, computed count);
a request resumed after preemption carries its full token list and a full block-id replacement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvoffload.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    seed: int
    #: Prompt length (prompt_token_ids may also hold generated tokens: forks, resumes).
    num_prompt_tokens: int = -1


@dataclass(slots=True)
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    resumed_from_preemption: list[bool] = field(default_factory=list)
    #: Full token ids for resumed requests (the runner dropped their rows), else None.
    resumed_token_ids: list[list[int] | None] = field(default_factory=list)
    #: New block ids to append, or the full replacement for resumed requests.
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    #: Tokens the scheduler appended that the runner did not sample itself (beam search).
    new_token_ids: list[list[int]] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: set[str] = field(default_factory=set)
    finished_req_ids: set[str] = field(default_factory=set)
    kv_connector_metadata: Any = None
    #: Copy-on-write: device block copies (src, dst) to run before the forward pass, and the
    #: block-table entries they redirect, per request: [(group, block index, new block id)].
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    block_replacements: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
