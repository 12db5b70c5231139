"""LoadQueue: a tier's load jobs in flight, what they say of the tier before they finish, and
which of them no longer beat recomputing.

A tier's fitted speed is history: a disk that slows down after the cost model timed it keeps
being chosen until slow jobs *finish* and are timed, and a burst planned in one step queues
behind the slow one. The jobs in flight tell sooner:

- **Evidence.** A worker reports, each step, how long each load it is running has been reading
  (``LoadReading``: its own time, not the time it queued or waited for a thread) and how much
  of it is read (it reads in pieces). The oldest job (the one the tier is running: a tier's
  loads run in order) projects its whole time from that: its fitted latency, then the rest at
  the pace so far, the piece in progress counted as done (a lower bound). Once the projection
  passes ``CLIP`` times its estimate (plus a little slack), the tier is at least ``slowdown =
  projection / estimate`` times slower than fitted. A job of eight pieces whose first piece
  overruns shows it an eighth of the way in: the loads queued behind it are given up then, not
  after the first job has read for as long as they would all take.
- **Waiting.** A new job of this tier waits for those ahead of it: what is left of the oldest
  (its estimate minus its read so far; once it overran, what its projection leaves, and at
  least its piece in progress as long again: the longer a stalled piece has run, the longer it
  is likely to run), then each queued job's estimate, everything scaled by the slowdown.
- **Deadlines.** A job planned with a budget (the time recomputing its blocks would take)
  that is now predicted to finish later than recomputing from here would, is given up: the
  scheduler cancels it and its request recomputes (``overdue``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvoffload.connector.cost.cost_fit import CLIP

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
    #: The share of it read (whole pieces), the share one piece is (1: read in one go), and how
    #: long the piece in progress has been reading.
    done: float = 0.0
    piece: float = 1.0
    piece_s: float = 0.0
    #: The fitted latency part of ``own_s`` (paid before the first byte).
    latency_s: float = 0.0

    def _paces(self) -> tuple[float, float]:
        """Its whole time at the average pace so far (the fitted latency apart, the piece in
        progress counted as done), and the pieces after the one in progress at that one's pace so
        far (a device that slowed down mid-job shows in its current piece, not in the average of
        the fast pieces before it)."""
        lat = min(self.latency_s, self.read_s)
        average = lat + (self.read_s - lat) / min(1.0, self.done + self.piece)
        after = max(0.0, (1.0 - self.done) / self.piece - 1.0)
        return average, self.read_s + after * self.piece_s

    def projected_s(self) -> float:
        """A lower bound of its whole time: the slower of the two paces, the piece in progress
        ending now."""
        return max(self._paces())

    def left_s(self) -> float:
        """What is likely left of it once it overran: the rest at the slower pace, the piece in
        progress taking as long again as it has run (the longer a stalled piece has run, the
        longer it is likely to run)."""
        average, pace = self._paces()
        return max(average - self.read_s, pace - self.read_s + self.piece_s)


@dataclass(slots=True)
class LoadQueue:
    """One tier's loads in flight, in the order they were planned."""

    loads: OrderedDict[int, InFlightLoad] = field(default_factory=OrderedDict)

    def add(self, job_id: int, load: InFlightLoad) -> None:
        self.loads[job_id] = load

    def pop(self, job_id: int) -> InFlightLoad | None:
        return self.loads.pop(job_id, None)

    def reading(self, job_id: int, seconds: float, done: float = 0.0, piece: float = 1.0,
                piece_s: float | None = None) -> None:
        """A worker reports the job has been reading for ``seconds`` and has read the share
        ``done`` of it, in pieces of ``piece``, the one in progress for ``piece_s`` (None: its
        whole time); ranks: the latest report, the slowest time."""
        load = self.loads.get(job_id)
        if load is not None and seconds >= load.read_s:
            load.read_s = seconds
            load.done = min(max(done, 0.0), 1.0)
            load.piece = min(max(piece, 1e-6), 1.0)
            load.piece_s = seconds if piece_s is None else min(max(piece_s, 0.0), seconds)

    def slowdown(self) -> float:
        """How many times slower than fitted the tier has shown itself to be (1: no evidence)."""
        head = next(iter(self.loads.values()), None)
        if head is None or head.own_s is None:
            return 1.0
        projected = head.projected_s()
        if projected <= CLIP * head.own_s + SLACK_S:
            return 1.0
        head.overran = True
        return max(1.0, projected / max(head.own_s, 1e-6))

    def stalled(self) -> bool:
        """Its running job has overrun (``slowdown`` saw it): a job queued now would be given up
        before it begins (``overdue``)."""
        head = next(iter(self.loads.values()), None)
        return head is not None and head.overran

    def wait_s(self, slowdown: float) -> float:
        """Predicted seconds until the tier could start a new job."""
        wait = 0.0
        for i, load in enumerate(self.loads.values()):
            own = (load.own_s or 0.0) * slowdown
            if i == 0:
                wait += load.left_s() if load.overran else max(0.0, own - load.read_s)
            else:
                wait += own
        return wait

    def overdue(self, slowdown: float) -> list[int]:
        """Jobs predicted to finish later than recomputing their blocks from now would; taken
        out of the queue (the caller cancels them). A tier not timed yet has no estimate to
        overrun: its oldest job counts once it has read for longer than its budget.

        Once the oldest job has overrun, the jobs behind it that have not begun reading are
        given up whatever their prediction: a prediction from a job still stalled is a lower
        bound that grows with every step, and the next look comes only after a step (a
        recomputing prefill: hundreds of milliseconds), so waiting for it to pass their budget
        makes them pay that step and then recompute all the same."""
        head = next(iter(self.loads.values()), None)
        if head is None or (slowdown <= 1.0 and not (head.own_s is None and head.read_s > 0)):
            return []
        out = []
        wait = 0.0
        for i, (job_id, load) in enumerate(list(self.loads.items())):
            own = (load.own_s or 0.0) * slowdown
            left = load.left_s() if i == 0 else wait + own  # the oldest: what its projection leaves
            behind_a_stall = i > 0 and head.overran and load.read_s == 0
            if load.budget_s is not None and (left > load.budget_s or behind_a_stall):
                out.append(job_id)
                del self.loads[job_id]
                continue
            wait = left if i == 0 else wait + own
        return out
