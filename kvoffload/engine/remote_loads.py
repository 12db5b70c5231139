"""RemoteLoads: the requests whose external KV is loading, and what the connector said of them.

A request admitted with an asynchronous load waits (``WAITING_FOR_REMOTE_KVS``) holding its
blocks until the connector reports the load finished or failed; only then may it run (or
recompute). Loading requests count against ``max_num_seqs``. Hits are counted when a load
lands, so a failed one serves nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvoffload.connector.base import KVConnectorOutput
from kvoffload.engine.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class PendingLoad:
    """What a request gets once its load lands."""

    computed_tokens: int  # local hits + external hits
    local_hit_tokens: int
    external_hit_tokens: int


class LoadOutcome(enum.Enum):
    IN_FLIGHT = "in flight"
    LANDED = "landed"
    FAILED = "failed"


@dataclass(slots=True)
class RemoteLoads:
    #: Requests whose load was planned and not yet resumed (in flight or landed, not consumed).
    pending: dict[str, PendingLoad] = field(default_factory=dict)
    #: Reported by the connector, not yet consumed by the scheduler.
    finished: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.pending)

    def start(self, rid: str, load: PendingLoad) -> None:
        self.pending[rid] = load

    def landed(self, request: Request) -> bool:
        """Its load was reported (finished or failed): resuming it frees what it holds."""
        rid = request.request_id
        return request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and (rid in self.finished or rid in self.failed)

    def num_landed(self, waiting: Iterable[Request]) -> int:
        """Waiting requests whose load has landed."""
        return sum(1 for r in waiting if self.landed(r))

    def take(self, rid: str) -> tuple[LoadOutcome, PendingLoad]:
        """Consume the connector's report of ``rid`` (IN_FLIGHT: none yet, nothing changes)."""
        if rid in self.failed:
            self.failed.discard(rid)
            return LoadOutcome.FAILED, self.pending.pop(rid, PendingLoad(0, 0, 0))
        if rid not in self.finished:
            return LoadOutcome.IN_FLIGHT, self.pending[rid]
        self.finished.discard(rid)
        return LoadOutcome.LANDED, self.pending.pop(rid)

    def abort(self, rid: str) -> bool:
        """Forget ``rid`` (aborted while waiting for its load); True if the load was not
        reported yet, so its blocks stay allocated until the report frees them."""
        unreported = rid not in self.finished and rid not in self.failed
        self.finished.discard(rid)
        self.failed.discard(rid)
        self.pending.pop(rid, None)
        return unreported

    def digest(self, kv_out: KVConnectorOutput, requests: Mapping[str, Request]) -> list[Request]:
        """Take the worker's report; returns the finished requests it frees. As in vLLM, every
        request it names must still be known (a finished one is freed by the report): a second
        report of one request is a connector bug and fails loudly here, as it would kill
        vLLM's engine."""
        freed = []
        for rid in kv_out.finished_recving | kv_out.failed_recving:
            request = requests.get(rid)
            assert request is not None, f"connector reported request {rid!r} as received after it was freed"
            if request.is_finished:  # finished while loading: this report frees it
                freed.append(request)
            elif rid in kv_out.failed_recving:
                self.failed.add(rid)
            else:
                assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS, (
                    f"connector reported request {rid!r} as received while it is {request.status.name}")
                self.finished.add(rid)
        for rid in kv_out.finished_sending:
            request = requests.get(rid)
            assert request is not None and request.is_finished, (
                f"connector reported request {rid!r} as sent while it is "
                f"{'freed' if request is None else request.status.name}")
            freed.append(request)
        return freed
