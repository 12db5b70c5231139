"""Workloads of the serving benchmark, as sessions of turns in token ids (no tokenizer).

A session is a conversation: its first prompt is ``prefix + turns[0]``, every later prompt is
the previous prompt, the model's answer to it and the next turn (a replayed agent trace gives
each turn's whole prompt instead: ``whole``). Single-turn workloads are sessions of one turn.
Sessions start at ``start_s`` (trace replay) or as soon as a client is free, and wait
``think_s`` between turns (or each turn its own ``thinks``). A turn may carry the caller's hint
for kvoffload (``hints``: ``kv_transfer_params["kvoffload"]``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    prefix: tuple[int, ...]
    turns: tuple[tuple[int, ...], ...]
    start_s: float = 0.0
    think_s: float = 0.0
    #: Each turn is its whole prompt (not history + turn): a replayed trace says what was sent.
    whole: bool = False
    #: Per turn, the wait before it (empty: ``think_s`` between turns).
    thinks: tuple[float, ...] = ()
    #: Per turn, the caller's hint for kvoffload (empty: none).
    hints: tuple[dict[str, Any] | None, ...] = ()
    #: A workload run in rounds (``Workload.rounds``): the round of this session's first turn
    #: (turn t runs in round ``round + t``); ``start_s`` is then its delay within each round.
    round: int = 0

    def prompt(self, turn: int, history: list[int]) -> list[int]:
        """The prompt of ``turn``, after ``history`` (the previous prompt and its answer)."""
        return list(self.turns[turn]) if self.whole else history + list(self.turns[turn])

    def think_before(self, turn: int) -> float:
        return self.thinks[turn] if self.thinks else (self.think_s if turn else 0.0)

    def hint(self, turn: int) -> dict[str, Any] | None:
        return self.hints[turn] if self.hints else None


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    max_tokens: int
    #: Sessions in flight at once (chat: every conversation; others: the client count).
    concurrency: int
    #: Tokens every session's history can reach: sizes the device cache and max_model_len.
    max_context: int
    #: Distinct tokens the workload's prompts cover (its working set).
    working_set_tokens: int
    #: Run in this many rounds, each starting once the last has finished (0: sessions run freely).
    rounds: int = 0
    #: What the reader changed or found that the user should see before the run (one line).
    note: str = ""

    def round_of(self, r: int, histories: dict[str, list[int]]) -> tuple[Workload, dict[str, int]]:
        """Round ``r`` as a workload of its own: one request per session with a turn in it (its
        whole prompt, after ``histories``: each session's last prompt and answer), sent
        ``start_s`` into the round; and the turn each session runs in it."""
        sessions, turn_of = [], {}
        for s in self.sessions:
            t = r - s.round
            if 0 <= t < len(s.turns):
                turn_of[s.sid] = t
                sessions.append(Session(s.sid, (), (tuple(s.prompt(t, histories.get(s.sid, list(s.prefix)))),),
                                        start_s=s.start_s, whole=True, hints=(s.hint(t),) if s.hints else ()))
        return replace(self, sessions=tuple(sessions), concurrency=max(1, len(sessions)), rounds=0), turn_of


def _tokens(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(1, vocab) for _ in range(n))


def chat(conversations: int = 16, turns: int = 4, context: int = 1024, user: int = 128, max_tokens: int = 16,
         think_s: float = 0.5, vocab: int = 32000, seed: int = 0) -> Workload:
    """Multi-turn chat: each conversation opens on its own ``context`` tokens (a system prompt
    and documents) and adds ``user`` tokens a turn; returning turns reuse everything before."""
    rng = random.Random(seed)
    sessions = tuple(Session(f"c{c}", _tokens(rng, context, vocab),
                             tuple(_tokens(rng, user, vocab) for _ in range(turns)), think_s=think_s)
                     for c in range(conversations))
    final = context + turns * (user + max_tokens)
    return Workload("chat", sessions, max_tokens, conversations, final, conversations * final)


def mix(conversations: int = 6, fresh: int = 3, rounds: int = 4, context: int = 640, user: int = 64,
        fresh_tokens: int = 1024, max_tokens: int = 16, first: str = "turns", vocab: int = 32000,
        seed: int = 0) -> Workload:
    """Returning chat turns batched with fresh long prompts: round 0 opens ``conversations``
    chats on ``context`` tokens each; every later round sends each chat's next turn (``user``
    tokens more) together with ``fresh`` new prompts of ``fresh_tokens``, the group named by
    ``first`` ("turns" or "fresh") 50 ms before the other. A round starts when the last one
    has finished. The turns find their context in a tier when the fresh prompts pushed it out
    of the device cache: what loading a hit costs on a busy step, in both arrival orders."""
    if first not in ("turns", "fresh"):
        raise ValueError(f"--first {first!r}: use turns or fresh")
    rng = random.Random(seed)
    lag_turns, lag_fresh = (0.0, 0.05) if first == "turns" else (0.05, 0.0)
    chats = [Session(f"c{c}", _tokens(rng, context - user, vocab), tuple(_tokens(rng, user, vocab)
                     for _ in range(rounds + 1)), start_s=lag_turns) for c in range(conversations)]
    news = [Session(f"f{r}.{i}", (), (_tokens(rng, fresh_tokens, vocab),), start_s=lag_fresh, round=r)
            for r in range(1, rounds + 1) for i in range(fresh)]
    final = context + rounds * (user + max_tokens) + max_tokens
    ws = conversations * final + rounds * fresh * fresh_tokens
    return Workload(f"mix-{first}-first", (*chats, *news), max_tokens, conversations + fresh,
                    max(final, fresh_tokens + max_tokens), ws, rounds=rounds + 1)


def rag(documents: int = 8, requests: int = 48, doc_tokens: int = 1024, question: int = 64, max_tokens: int = 16,
        zipf: float = 1.1, clients: int = 4, vocab: int = 32000, seed: int = 0) -> Workload:
    """Shared long prefixes (system prompts, RAG documents) with Zipf popularity, each request
    a unique question after one of them."""
    rng = random.Random(seed)
    docs = [_tokens(rng, doc_tokens, vocab) for _ in range(documents)]
    weights = [1.0 / (i + 1) ** zipf for i in range(documents)]
    sessions = tuple(Session(f"r{i}", rng.choices(docs, weights)[0], (_tokens(rng, question, vocab),))
                     for i in range(requests))
    ctx = doc_tokens + question + max_tokens
    return Workload("rag", sessions, max_tokens, clients, ctx, documents * doc_tokens + requests * question)


def noreuse(requests: int = 48, prompt: int = 1024, max_tokens: int = 16, clients: int = 4, vocab: int = 32000,
            seed: int = 0) -> Workload:
    """Unique prompts: nothing to reuse, what offloading costs when it cannot help."""
    rng = random.Random(seed)
    sessions = tuple(Session(f"u{i}", (), (_tokens(rng, prompt, vocab),)) for i in range(requests))
    return Workload("noreuse", sessions, max_tokens, clients, prompt + max_tokens, requests * prompt)


def trace(path: str | Path, requests: int = 64, block_tokens: int = 32, max_blocks: int = 48, max_tokens: int = 16,
          time_scale: float = 0.05, clients: int = 8, vocab: int = 32000) -> Workload:
    """Mooncake conversation trace replay: each ``hash_id`` (a 512-token block of the trace,
    chained over its prefix) becomes ``block_tokens`` tokens drawn from the id, so equal ids give
    equal tokens and shared prefixes stay shared; prompts are cut to ``max_blocks`` blocks and
    arrivals are the trace's timestamps times ``time_scale``."""
    import gzip
    import json

    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    sessions: list[Session] = []
    seen: set[int] = set()
    with opener(p, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            ids = rec["hash_ids"][:max_blocks]
            seen.update(ids)
            tokens = tuple(t for h in ids for t in _tokens(random.Random(h), block_tokens, vocab))
            sessions.append(Session(f"t{len(sessions)}", (), (tokens,), start_s=rec["timestamp"] / 1000 * time_scale))
            if len(sessions) >= requests:
                break
    ctx = max_blocks * block_tokens + max_tokens
    return Workload("trace", tuple(sessions), max_tokens, clients, ctx, len(seen) * block_tokens)


def weka(path: str | Path, conversations: int = 16, turns: int = 12, block_tokens: int = 1, max_blocks: int = 2048,
         time_scale: float = 0.05, max_tokens: int = 8, vocab: int = 32000) -> Workload:
    """WEKA's Claude Code conversations replayed with their callers' hints: the first
    ``conversations`` conversations (in the trace's interleaving, ``kvoffload.traces``) with at
    least two requests, each its first ``turns`` requests. Each 64-token block of the trace
    becomes ``block_tokens`` tokens drawn from the block's id (equal blocks, equal tokens; shared
    prefixes stay shared), a prompt keeps its first ``max_blocks`` blocks, and times are the
    trace's times ``time_scale``. Each request carries the hint its caller had when the response
    ended (``kvoffload_policies.session_hints``, honest): its conversation as the session, and a
    return within the tool step where it ended in a tool call, in trace seconds (the servers'
    ``hints.clock_speed`` is ``1 / time_scale``)."""
    from kvoffload_policies.session_hints import CONTINUES, TOOL_RETURN_S

    from kvoffload.traces import load_weka_requests

    by_session: dict[str, list[Any]] = {}
    for r in load_weka_requests(path, limit=500 * conversations):  # enough for the first conversations
        by_session.setdefault(r.session, []).append(r)
    chosen = [reqs[:turns] for reqs in by_session.values() if len(reqs) >= 2][:conversations]
    if not chosen:
        raise ValueError(f"--trace {path}: no WEKA conversation of two requests or more")
    t0 = min(reqs[0].t for reqs in chosen)
    sessions: list[Session] = []
    seen: set[int] = set()
    longest = 0
    for k, reqs in enumerate(chosen):
        prompts = []
        for r in reqs:
            blocks = r.blocks[:max_blocks]
            seen.update(blocks)
            prompts.append(tuple(t for b in blocks for t in _tokens(random.Random(b), block_tokens, vocab)))
            longest = max(longest, len(prompts[-1]))
        thinks = (0.0, *(max(0.0, (b.t - a.t) * time_scale) for a, b in itertools.pairwise(reqs)))
        hints = tuple({"session": f"weka-{k}", **({"expect_return_s": TOOL_RETURN_S} if r.stop in CONTINUES else {})}
                      for r in reqs)
        sessions.append(Session(f"w{k}", (), tuple(prompts), start_s=(reqs[0].t - t0) * time_scale, whole=True,
                                thinks=thinks, hints=hints))
    return Workload("weka", tuple(sessions), max_tokens, len(sessions), longest + max_tokens,
                    len(seen) * block_tokens)


def request_log(path: str | Path, clients: int = 4, max_tokens: int = 16, time_scale: float = 1.0,
                vocab: int = 32000, limit: int | None = None) -> Workload:
    """A user's own request log (``kvoffload.plan.request_log``: OpenAI-style JSONL) replayed:
    the requests of one ``session`` (or ``user``) are one conversation's turns, each sent as
    logged (its whole prompt) at its logged time ``time_scale`` (no timestamps: as soon as one of
    ``clients`` is free); a request without a session is a conversation of its own."""
    from kvoffload.plan.request_log import read_request_log

    longest = MAX_IDLE_S / time_scale if time_scale > 0 else 0.0
    reqs, note = cut_idle_gaps(read_request_log(path, vocab, limit), longest, time_scale)
    by_session: dict[str, list[Any]] = {}
    for r in reqs:
        by_session.setdefault(r.session if r.session is not None else f"line{r.line}", []).append(r)
    timed = any(r.t > 0 for r in reqs)
    sessions = tuple(
        Session(f"s{k}", (), tuple(r.tokens for r in rs), start_s=rs[0].t * time_scale, whole=True,
                thinks=(0.0, *(max(0.0, (b.t - a.t) * time_scale) for a, b in itertools.pairwise(rs))))
        for k, rs in enumerate(by_session.values()))
    blocks: set[int] = set()
    for r in reqs:  # distinct 16-token blocks, each keyed by its whole prefix
        h = 0
        for i in range(0, len(r.tokens) - 15, 16):
            h = hash((h, r.tokens[i : i + 16]))
            blocks.add(h)
    longest = max(len(r.tokens) for r in reqs)
    return Workload("log", sessions, max_tokens, len(sessions) if timed else clients, longest + max_tokens,
                    max(len(blocks) * 16, longest), note=note)


#: The longest pause a replay sits through (seconds of replay): a log with one epoch timestamp
#: among relative ones would otherwise sleep for years.
MAX_IDLE_S = 60.0


def cut_idle_gaps(reqs: list[Any], longest: float, time_scale: float = 1.0) -> tuple[list[Any], str]:
    """``reqs`` (in arrival order) with every pause between two requests longer than ``longest``
    seconds of the log cut to it, and a line saying the replay's span and what was cut."""
    if not reqs:
        return reqs, ""
    out = [reqs[0]]
    cut, worst, worst_line = 0, 0.0, 0
    shift = 0.0
    for a, b in itertools.pairwise(reqs):
        gap = b.t - a.t
        if gap > longest > 0:
            cut += 1
            if gap > worst:
                worst, worst_line = gap, b.line
            shift += gap - longest
        out.append(replace(b, t=b.t - shift))
    span = (out[-1].t - out[0].t) * time_scale
    note = f"the replay spans {span:,.1f} s ({len(out):,} requests)"
    if cut:
        note += (f"; {cut:,} pause(s) between requests longer than {longest * time_scale:g} s of replay were cut to "
                 f"it (the longest, {worst:,.0f} s of the log, before line {worst_line:,}: a timestamp in another "
                 "unit or clock?)")
    return out, note


def in_rounds(wl: Workload, run: Callable[[Workload], tuple[list[tuple[str, int, Any]], float]]
              ) -> tuple[list[tuple[str, int, Any]], float]:
    """Run a workload of ``rounds`` round by round with ``run`` (one round's workload -> its
    (session id, 0, completion) results and wall time): each session's history carries its
    answers into its next round; results come back with each request's own turn."""
    histories = {s.sid: list(s.prefix) for s in wl.sessions}
    results: list[tuple[str, int, Any]] = []
    wall = 0.0
    for r in range(wl.rounds):
        sub, turn_of = wl.round_of(r, histories)
        if not sub.sessions:
            continue
        prompts = {s.sid: list(s.turns[0]) for s in sub.sessions}
        done, seconds = run(sub)
        wall += seconds
        for sid, _, completion in done:
            results.append((sid, turn_of[sid], completion))
            histories[sid] = prompts[sid] + completion.tokens.get(0, [])
    return results, wall
