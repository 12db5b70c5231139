"""Greedy beam search on shared blocks: beams are forked requests (copy-on-write).

Each step every live beam reports its top candidates; the best ``width`` (beam, token)
continuations survive. A beam chosen several times is forked (its blocks shared, the partial
last block copied on the first write), a beam chosen never is aborted (its blocks freed).
Scores are length-normalised log-probabilities; an end-of-sequence continuation ranked
within the top ``width`` ends a hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.engine.request import Request
from kvoffload.engine.scheduler import Scheduler


@dataclass(slots=True)
class Beam:
    request: Request
    logprob: float = 0.0


@dataclass(slots=True)
class BeamGroup:
    root_id: str
    width: int
    live: list[Beam]
    finished: list[tuple[float, list[int], float]] = field(default_factory=list)  # (score, tokens, logprob)
    pending: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    forks: int = 0

    def best(self) -> list[tuple[float, list[int], float]]:
        return sorted(self.finished, key=lambda f: -f[0])


def _score(logprob: float, length: int) -> float:
    return logprob / max(1, length)


class BeamSearchController:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.groups: dict[str, BeamGroup] = {}
        self._beam_group: dict[str, str] = {}
        scheduler.group_of = self.group_of

    def add(self, root: Request) -> None:
        group = BeamGroup(root.request_id, root.sampling_params.beam_width, [Beam(root)])
        self.groups[root.request_id] = group
        self._beam_group[root.request_id] = root.request_id

    def group_of(self, request_id: str) -> str:
        """The beam group a request advances with (its own id outside beam search)."""
        return self._beam_group.get(request_id, request_id)

    def forget(self, root_id: str) -> None:
        """Drop a collected group and its members' ids."""
        if self.groups.pop(root_id, None) is not None:
            self._beam_group = {rid: root for rid, root in self._beam_group.items() if root != root_id}

    def is_beam(self, request_id: str) -> bool:
        return request_id in self._beam_group

    def on_step(self, candidates: dict[str, list[tuple[int, float]]]) -> list[str]:
        """Advance every group whose live beams all reported; returns the groups now done."""
        for rid, cands in candidates.items():
            root = self._beam_group.get(rid)
            if root is not None:
                self.groups[root].pending[rid] = cands
        done = []
        for root, group in list(self.groups.items()):
            if group.live and len(group.pending) == len(group.live):
                self._advance(group)
            if not group.live:
                done.append(root)
        return done

    def _advance(self, group: BeamGroup) -> None:
        sched = self.scheduler
        pool = []
        for beam in group.live:
            for token, lp in group.pending[beam.request.request_id]:
                pool.append((beam.logprob + lp, beam, token))
        group.pending.clear()
        pool.sort(key=lambda x: -x[0])
        chosen: dict[str, list[tuple[int, float]]] = {}
        kept = 0
        for rank, (total, beam, token) in enumerate(pool):
            if kept >= group.width:
                break
            req = beam.request
            if token == req.eos_token_id and not req.sampling_params.ignore_eos:
                if rank < group.width:
                    tokens = req.output_token_ids + [token]
                    group.finished.append((_score(total, len(tokens)), tokens, total))
                continue
            chosen.setdefault(req.request_id, []).append((token, total))
            kept += 1
        new_live: list[Beam] = []
        for beam in group.live:
            picks = chosen.get(beam.request.request_id, [])
            if not picks:
                sched.abort_request(beam.request.request_id)
                continue
            targets = [beam.request]
            for _ in picks[1:]:  # fork before the parent gets its own next token
                group.forks += 1
                child_id = f"{group.root_id}@{group.forks}"
                targets.append(sched.fork_request(beam.request, child_id))
                self._beam_group[child_id] = group.root_id
            for req, (token, total) in zip(targets, picks):
                if sched.append_token(req, token):  # reached max_tokens
                    group.finished.append((_score(total, req.num_output_tokens), list(req.output_token_ids), total))
                else:
                    new_live.append(Beam(req, total))
        group.live = new_live
        if len(group.finished) >= group.width:
            for beam in group.live:
                sched.abort_request(beam.request.request_id)
            group.live = []
