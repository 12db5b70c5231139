"""TransferJob: one planned copy, the record the scheduler half sends its worker half and
matches the worker's TransferResult against (by ``job_id``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvoffload.offload.abstract import LoadStoreSpec


class JobKind(Enum):
    LOAD = "load"  # a tier → device (prefix hit or swap-in)
    STORE = "store"  # device → the first tier (a request's new blocks)
    SWAP_OUT = "swap_out"  # device → the first tier, awaited before the step (preemption)
    DEMOTE = "demote"  # a tier → the next one (victims, write-through); belongs to no request


@dataclass(frozen=True, slots=True)
class TransferJob:
    job_id: int
    kind: JobKind
    src: LoadStoreSpec
    dst: LoadStoreSpec
    #: The request the copy serves; None for a demotion.
    req_id: str | None = None
