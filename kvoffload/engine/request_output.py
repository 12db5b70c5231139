"""The output of one finished request: its tokens and text, why it finished, its n samples
or its beams (best first), and its time to first token."""

from __future__ import annotations

from kvoffload.engine.beam_search import BeamSearchController
from kvoffload.engine.outputs import RequestOutput
from kvoffload.engine.request import Request, RequestStatus
from kvoffload.engine.tokenizer import ByteTokenizer

_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


def request_output(request: Request, tokenizer: ByteTokenizer, beams: BeamSearchController,
                   children: dict[str, list[str]], finished: dict[str, Request]) -> RequestOutput:
    """``children``: the n > 1 samples forked from each request (``{rid}#k``), ``finished``
    the requests they finished as."""
    ttft = None if request.first_token_time is None else request.first_token_time - request.arrival_time
    rid = request.request_id
    tokens = list(request.output_token_ids)
    samples: list[list[int]] = []
    scores: list[float] = []
    reason = _FINISH_REASON.get(request.status, "unknown")
    if rid in beams.groups:
        best = beams.groups[rid].best()
        samples = [t for _, t, _ in best]
        scores = [s for s, _, _ in best]
        tokens = samples[0] if samples else tokens
        reason = "beam"
    elif rid in children:
        order = sorted(children[rid], key=lambda c: int(c.rsplit("#", 1)[1]))
        samples = [tokens] + [list(finished[c].output_token_ids) for c in order]
    return RequestOutput(
        request_id=rid,
        prompt_token_ids=list(request.prompt_token_ids),
        token_ids=tokens,
        text=tokenizer.decode(tokens),
        finish_reason=reason,
        num_cached_tokens=max(request.num_cached_tokens, 0),
        ttft_s=ttft,
        samples=samples,
        scores=scores,
    )
