"""The records one scheduler step is drafted in: the plan so far (StepDraft), the waiting
queue's pass (QueuePass) and what became of each queue head (Verdict)."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from kvoffload.engine.kv_cache_manager import KVCacheBlocks
from kvoffload.engine.request import Request


class Verdict(enum.Enum):
    """What became of the head of the waiting queue."""

    ADMITTED = enum.auto()  # it runs this step
    SKIP = enum.auto()  # it stays queued (behind the next ones) and the next is tried
    SKIP_AND_STOP = enum.auto()  # it stays queued and nothing more is admitted
    LOADING = enum.auto()  # its load was planned: it waits in the queue until the load lands
    BLOCKED = enum.auto()  # no seat, budget or blocks for it


@dataclass(slots=True)
class StepDraft:
    """One step's plan as it is built."""

    budget: int
    num_scheduled: dict[str, int] = field(default_factory=dict)
    new_blocks_of: dict[str, KVCacheBlocks] = field(default_factory=dict)
    running: list[Request] = field(default_factory=list)
    new: list[Request] = field(default_factory=list)
    resumed: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    #: Running requests with nothing to compute (waiting for a token from their beam group).
    stalled: list[Request] = field(default_factory=list)

    def schedule(self, request: Request, new_blocks: KVCacheBlocks, num_new: int) -> None:
        self.new_blocks_of[request.request_id] = new_blocks
        self.num_scheduled[request.request_id] = num_new
        self.budget -= num_new

    def unschedule(self, request: Request) -> None:
        """``request`` was preempted after it was scheduled this step: give its tokens back."""
        if request in self.running:
            self.running.remove(request)
            self.budget += self.num_scheduled.pop(request.request_id)
            self.new_blocks_of.pop(request.request_id, None)


@dataclass(slots=True)
class QueuePass:
    """The waiting queue's pass through one step."""

    num_loading: int  # requests holding blocks for a load: they count against max_num_seqs
    landed_left: int = -1  # landed loads still queued, once the head blocked (-1: it has not)
    skipped: deque[Request] = field(default_factory=deque)  # requeued at the front, in order
