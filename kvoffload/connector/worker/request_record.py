"""WorkerRequestState: everything the worker half knows of one request, in one record.

Its copies in flight, the stores it has planned and not yet submitted, and what it still owes
the engine (a finished-sending or a failed-receiving report). The worker keeps one table of
these, keyed by request, and drops a record once it holds and owes nothing: no other table
anywhere in the worker half holds a request id (``tests/connector/test_worker_request_record.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvoffload.connector.jobs import TransferJob


@dataclass(slots=True)
class WorkerRequestState:
    outstanding: int = 0  # copies submitted and not finished (loads and stores)
    loads_pending: int = 0  # of those, loads
    awaiting_finish: bool = False  # the scheduler half kept its blocks: report finished-sending
    load_failed: bool = False  # one of its loads failed: report failed once all loads are done
    report_failed: bool = False  # its loads are done and one failed: report failed-receiving
    #: Stores the step being run planned, not yet opened layer by layer. From the step's
    #: ``start_load_kv`` on, the same list is ``deferred`` (opening one takes it out of both).
    planned: list[TransferJob] = field(default_factory=list)
    #: Stores submitted at the next hook (the KV they read is written by the forward pass).
    deferred: list[TransferJob] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not (self.outstanding or self.loads_pending or self.awaiting_finish or self.load_failed
                    or self.report_failed or self.planned or self.deferred)


def take_deferred(records: Iterable[WorkerRequestState]) -> list[TransferJob]:
    """Every request's deferred stores, taken out of its record (and out of its planned
    stores, where the step's start made them one list: none of them is opened again)."""
    jobs: list[TransferJob] = []
    for st in records:
        if st.deferred:
            jobs += st.deferred
            if st.planned is st.deferred:
                st.planned = []
            st.deferred = []
    return jobs
