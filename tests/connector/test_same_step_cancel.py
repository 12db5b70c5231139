"""A load planned and given up in the same step (the scheduler half's ``overdue`` runs after its
loads are planned) reaches the worker half in one metadata with its cancellation: the worker
used to cancel before submitting, found no such job, and let the load run to the end (a slow
disk's whole read, its request waiting for it while the scheduler half counted it given up)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kvoffload.config import OffloadConfig
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.connector.offloading_metadata import OffloadingConnectorMetadata
from kvoffload.connector.worker.offloading_worker import OffloadingConnectorWorker
from kvoffload.offload.mediums import DiskLoadStoreSpec, GPULoadStoreSpec


class Router:
    """Records submissions and cancellations, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def transfer_async(self, job_id, spec):
        self.calls.append(("submit", job_id))
        return True

    def cancel(self, job_id):
        self.calls.append(("cancel", job_id))
        return True


def test_a_load_given_up_in_the_step_that_planned_it_is_cancelled_after_its_submission():
    spec = SimpleNamespace(config=OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB"}]}))
    worker = OffloadingConnectorWorker(spec)  # type: ignore[arg-type]
    router = worker.worker = Router()  # type: ignore[assignment]
    load = TransferJob(7, JobKind.LOAD, DiskLoadStoreSpec(np.array([3, 4]), [b"a", b"b"]),
                       GPULoadStoreSpec(np.array([10, 11])), req_id="r")
    kept = TransferJob(8, JobKind.LOAD, DiskLoadStoreSpec(np.array([5]), [b"c"]), GPULoadStoreSpec(np.array([12])),
                       req_id="s")
    meta = OffloadingConnectorMetadata(reqs_to_load={"r": [load], "s": [kept]})
    meta.cancel_loads = {7}
    worker.start_load_kv(meta)
    assert router.calls == [("submit", 7), ("cancel", 7), ("submit", 8)]
