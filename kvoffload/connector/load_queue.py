"""LoadQueue: a tier's load jobs in flight, what they say of the tier before they finish, and
which of them no longer beat recomputing.

A tier's fitted speed is history: a disk that slows down after the cost model timed it keeps
being chosen until slow jobs *finish* and are timed, and a burst planned in one step queues
behind the slow one. The jobs in flight tell sooner:

- **Evidence.** A worker reports, each step, how long each load it is running has been reading
  (``LoadRunning``: its own time, not the time it queued or waited for a thread). Once the
  oldest job (the one the tier is running: a tier's loads run in order) has read for more than
  ``CLIP`` times its estimate (plus a little slack), the tier is at least ``slowdown = read /
  estimate`` times slower than fitted.
- **Waiting.** A new job of this tier waits for those ahead of it: what is left of the oldest
  (its estimate minus its read so far; once it overran, as long again as it has read: the
  longer a stalled job has run, the longer it is likely to run), then each queued job's
  estimate, everything scaled by the slowdown.
- **Deadlines.** A job planned with a budget (the time recomputing its blocks would take)
  that is now predicted to finish later than recomputing from here would, is given up: the
  scheduler cancels it and its request recomputes (``overdue``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvoffload.connector.cost_fit import CLIP

#: A job's read counts as evidence once it is this much past CLIP x its estimate.
SLACK_S = 0.005


@dataclass(slots=True)
class InFlightLoad:
    blocks: int
    #: Its estimate alone, from the tier's fit when planned (None: the tier was untimed).
    own_s: float | None
    #: The time recomputing its blocks would take (None: never given up).
    budget_s: float | None
    #: How long a worker last reported it reading (0: not started yet).
    read_s: float = 0.0
    #: Seen reading past its estimate: its time is evidence, taken unclipped.
    overran: bool = False


@dataclass(slots=True)
class LoadQueue:
    """One tier's loads in flight, in the order they were planned."""

    loads: OrderedDict[int, InFlightLoad] = field(default_factory=OrderedDict)

    def add(self, job_id: int, load: InFlightLoad) -> None:
        self.loads[job_id] = load

    def pop(self, job_id: int) -> InFlightLoad | None:
        return self.loads.pop(job_id, None)

    def reading(self, job_id: int, seconds: float) -> None:
        """A worker reports the job has been reading for ``seconds`` (ranks: the slowest)."""
        load = self.loads.get(job_id)
        if load is not None:
            load.read_s = max(load.read_s, seconds)

    def slowdown(self) -> float:
        """How many times slower than fitted the tier has shown itself to be (1: no evidence)."""
        head = next(iter(self.loads.values()), None)
        if head is None or head.own_s is None or head.read_s <= CLIP * head.own_s + SLACK_S:
            return 1.0
        head.overran = True
        return max(1.0, head.read_s / max(head.own_s, 1e-6))

    def wait_s(self, slowdown: float) -> float:
        """Predicted seconds until the tier could start a new job."""
        wait = 0.0
        for i, load in enumerate(self.loads.values()):
            own = (load.own_s or 0.0) * slowdown
            if i == 0:
                wait += load.read_s if load.overran else max(0.0, own - load.read_s)
            else:
                wait += own
        return wait

    def overdue(self, slowdown: float) -> list[int]:
        """Jobs predicted to finish later than recomputing their blocks from now would; taken
        out of the queue (the caller cancels them). A tier not timed yet has no estimate to
        overrun: its oldest job counts once it has read for longer than its budget."""
        head = next(iter(self.loads.values()), None)
        if head is None or (slowdown <= 1.0 and not (head.own_s is None and head.read_s > 0)):
            return []
        out = []
        wait = 0.0
        for i, (job_id, load) in enumerate(list(self.loads.items())):
            own = (load.own_s or 0.0) * slowdown
            left = load.read_s if i == 0 else wait + own  # the oldest: as long again as it has read
            if load.budget_s is not None and left > load.budget_s:
                out.append(job_id)
                del self.loads[job_id]
                continue
            wait = left if i == 0 else wait + own
        return out
