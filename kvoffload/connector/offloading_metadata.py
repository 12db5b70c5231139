"""The per-step plan the offloading scheduler half sends its worker half."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.connector.base import KVConnectorMetadata
from kvoffload.connector.jobs import TransferJob

__all__ = ["LoadReading", "OffloadingConnectorMetadata", "StepTiming", "TransferJob"]


@dataclass(frozen=True, slots=True)
class StepTiming:
    """What a worker measured of one forward pass (start_load_kv to wait_for_save), sent back
    with its copy results: the scheduler half prices recomputation by it, and a layer-wise load
    by what the steps that carried one lost (``sync_blocks`` loaded inside the step, the
    forward pass blocked ``sync_wait_s`` waiting for their layers)."""

    tokens: int
    seconds: float
    sync_blocks: int = 0
    sync_wait_s: float = 0.0
    #: Requests whose loads the step issued, and the host seconds issuing them took.
    load_requests: int = 0
    load_host_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LoadReading:
    """A load job a worker is running, and how long it has been reading (sent each step while
    it runs): the scheduler half's evidence of a tier slower than it was timed."""

    job_id: int
    seconds: float
    #: The share of the job read so far (whole pieces), the share one piece is, and how long
    #: the piece in progress has been reading (None: not reported).
    done: float = 0.0
    piece: float = 1.0
    piece_s: float | None = None


@dataclass
class OffloadingConnectorMetadata(KVConnectorMetadata):
    reqs_to_load: dict[str, list[TransferJob]] = field(default_factory=dict)
    #: Planned this step, submitted by the worker at the start of the next one.
    reqs_to_store: dict[str, list[TransferJob]] = field(default_factory=dict)
    preempted_req_ids: set[str] = field(default_factory=set)
    #: Copies of a tier's victims into the next tier; run before their slots are overwritten.
    demotions: list[TransferJob] = field(default_factory=list)
    #: Swap-mode preemption: copies of preempted requests' KV, run (and awaited) before the
    #: forward pass, since their blocks may be reused in this very step.
    swap_out: dict[str, list[TransferJob]] = field(default_factory=dict)
    #: Finished requests whose blocks the engine keeps for us: report each one as
    #: finished-sending once none of its copies is outstanding (and only those).
    await_finish: set[str] = field(default_factory=set)
    #: Store jobs (planned earlier) reading device blocks the engine handed out again this
    #: step (a sliding window released them): the worker waits for them before any copy or
    #: forward pass of this step can write those blocks.
    flush_jobs: set[int] = field(default_factory=set)
    #: Requests in reqs_to_load the engine scheduled in this step: their loads are waited for
    #: layer by layer inside the forward pass (the others are asynchronous).
    sync_loads: set[str] = field(default_factory=set)
    #: Tokens this step computes, over all requests (the worker times the step's forward pass).
    num_step_tokens: int = 0
    #: Asynchronous load jobs given up (now slower than recomputing): the worker cancels each
    #: that has not begun writing the device blocks and reports it failed, cancelled.
    cancel_loads: set[int] = field(default_factory=set)
