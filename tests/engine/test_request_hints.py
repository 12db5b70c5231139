"""Request hints on the bundled engine: ``add_request(hint=...)`` reaches the tier's policy with
the request's blocks, at its first lookup and at its finish; a tool-call token in the output is a
hint too; bad hints warn once and the request is served as without them."""

from __future__ import annotations

import logging
import time

import pytest
from kvoffload_policies.hinted import HintedCachePolicy

from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.offload import hints as hints_module
from kvoffload.offload.hints import BlockHint, RequestHint

CALLS: list[tuple[list[object], BlockHint]] = []
PROMPT = list(range(20, 20 + 52))  # 6 full blocks of 8, and a partial one
PARAMS = SamplingParams(max_tokens=20, ignore_eos=True)


class RecordingHinted(HintedCachePolicy):
    """The hinted policy, recording every hint it is given."""

    def hint(self, block_hashes, hint):  # type: ignore[no-untyped-def]
        CALLS.append((list(block_hashes), hint))
        super().hint(block_hashes, hint)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    CALLS.clear()
    monkeypatch.setattr(hints_module, "_warned", set())


def _llm(policy: str = "RecordingHinted", num_gpu_blocks: int = 64, **hints_cfg) -> LLM:
    offload = {"tiers": [{"medium": "cpu", "capacity": "16MiB", "eviction_policy": f"{__name__}:{policy}"}]}
    if hints_cfg:
        offload["hints"] = hints_cfg
    return LLM(EngineConfig(block_size=8, num_gpu_blocks=num_gpu_blocks, kv_offload=offload))


def _name(session: object) -> object:
    """A session's name as the client gave it (the scheduler half scopes it to a tenant)."""
    return session[1] if isinstance(session, tuple) else session


def _run(llm: LLM, rid: str, prompt=PROMPT, **kw) -> list[int]:
    llm.add_request(prompt, PARAMS, request_id=rid, **kw)
    while rid not in llm.step():
        pass
    return list(llm.collect(rid).token_ids)


def _policy(llm: LLM) -> RecordingHinted:
    sched = llm.scheduler_connector.connector_scheduler  # type: ignore[union-attr]
    policy = sched.manager.primary.index.policy
    assert isinstance(policy, RecordingHinted)
    return policy


def test_a_hint_reaches_the_policy_with_the_prompt_blocks_then_all_blocks_at_finish():
    with _llm(max_priority=2) as llm:
        plain = _run(llm, "plain")
        assert CALLS == []  # no hint, no tool-call tokens configured: the policy hears nothing
        hinted = _run(llm, "hinted", prompt=PROMPT + [7], hint={"session": "s1", "expect_return_s": 5, "priority": 2})
        stats = llm.stats()["connector"]
    assert len(plain) == len(hinted) == 20
    assert len(CALLS) == 2
    (at_lookup, h1), (at_finish, h2) = CALLS
    # The prompt's 6 full blocks at the first lookup (53 tokens); at the finish the 72 of its 73
    # tokens whose KV was computed (the last sampled token never ran): 9 blocks.
    assert len(at_lookup) == 6 and len(at_finish) == 9 and at_finish[:6] == at_lookup
    assert (_name(h1.session), h1.priority, h1.lease_until) == ("s1", 2, None)
    assert h1.session == h2.session and h1.session[0] != b""  # scoped to the request's tenant
    assert h1.return_at == pytest.approx(h1.now + 5.0) and h2.return_at == pytest.approx(h2.now + 5.0)
    assert h2.now >= h1.now
    assert stats["hinted_requests"] == 1 and stats["hints_given"] == 2 and stats["tool_call_finishes"] == 0


def test_hinted_blocks_belong_to_the_session_in_the_policy():
    with _llm() as llm:
        _run(llm, "a", hint={"session": "chat-1", "expect_return_s": 3})
        policy = _policy(llm)
        session = policy.sessions[CALLS[-1][1].session]
        assert _name(session.name) == "chat-1"
        keys = CALLS[-1][0]
        # The blocks it stored are the session's (in the tier, not pending a store).
        assert session.blocks == len(keys) and all(policy.owner[k] is session for k in keys)
        assert not any(k in policy.pending for k in keys)


def test_tokens_are_identical_with_and_without_hints():
    with _llm() as llm:
        a = _run(llm, "a")
        llm.reset_prefix_cache()
        b = _run(llm, "b", prompt=PROMPT + [9, 9])
    with _llm() as llm:
        ha = _run(llm, "a", hint={"session": "x", "expect_return_s": 1, "lease_s": 60})
        llm.reset_prefix_cache()  # the device forgets: the prefix comes back from the tier
        hb = _run(llm, "b", prompt=PROMPT + [9, 9], hint=RequestHint(session="x", priority=-3))
        hit = llm.stats()["connector"]["hit_tokens_by_tier"]
    assert (a, b) == (ha, hb)
    assert hit.get("cpu", 0) > 0  # the second request's prefix came back from the tier


def test_a_tool_call_token_in_the_output_is_a_hint(caplog):
    with _llm() as llm:
        out = _run(llm, "probe")
    tool = out[3]  # a token this greedy model will generate for PROMPT
    other = next(t for t in range(256) if t not in out)
    with _llm(tool_call_token_ids=[tool], tool_return_s=7.5) as llm:
        _run(llm, "tool")  # no hint of its own: the finish alone says "back within 7.5 s"
        _run(llm, "told", prompt=PROMPT + [1], hint={"session": "t", "expect_return_s": 2})
        stats = llm.stats()["connector"]
    assert [len(c) for c, _ in CALLS] == [8, 6, 9]  # 71 tokens computed; 53 looked up; 72 computed
    tool_hint, told_hint = CALLS[0][1], CALLS[2][1]
    assert tool_hint.session is None and tool_hint.return_at == pytest.approx(tool_hint.now + 7.5)
    assert _name(told_hint.session) == "t" and told_hint.return_at == pytest.approx(told_hint.now + 2.0)  # the caller knows
    assert stats["tool_call_finishes"] == 2 and stats["hinted_requests"] == 1
    CALLS.clear()
    with _llm(tool_call_token_ids=[other]) as llm:
        _run(llm, "no-tool")
        assert llm.stats()["connector"]["tool_call_finishes"] == 0
    assert CALLS == []


@pytest.mark.parametrize("bad, warned", [
    ({"session": "", "expect_return_s": -1, "colour": "red"}, ["session=''", "expect_return_s=-1", "'colour'"]),
    ("s1", ["hint 's1'"]),
    ({"priority": True, "lease_s": float("nan")}, ["priority=True", "lease_s=nan"]),
])
def test_a_bad_hint_warns_once_and_the_request_is_served_as_without_it(bad, warned, caplog):
    with _llm() as llm:
        want = _run(llm, "plain")
    with _llm() as llm, caplog.at_level(logging.WARNING, logger="kvoffload"):
        got = [_run(llm, f"bad-{i}", hint=bad) for i in range(3)]
        stats = llm.stats()["connector"]
    assert got == [want] * 3
    assert CALLS == [] and stats["hinted_requests"] == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "kvoffload"]
    assert len(lines) == len(warned)  # each problem once, however many requests repeat it
    for text in warned:
        assert sum(text in line for line in lines) == 1, (text, lines)


def test_requests_leave_no_hint_behind_when_aborted_or_forked():
    with _llm(tool_call_token_ids=[1]) as llm:
        llm.add_request(PROMPT, PARAMS, request_id="gone", hint={"session": "s"})
        llm.step()
        llm.scheduler.abort_request("gone")
        llm.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True, n=3, temperature=0.9, seed=1),
                        request_id="forked", hint={"session": "f", "expect_return_s": 4})
        while "forked" not in llm.step():
            pass
        while llm.scheduler.has_unfinished_requests() or llm.scheduler_connector.has_pending_work():  # type: ignore[union-attr]
            llm.step()
        assert llm.scheduler_connector.connector_scheduler.records.requests == {}  # type: ignore[union-attr]
        sessions = {_name(h.session) for _, h in CALLS}
    assert sessions == {"s", "f"}
    # The aborted request's lookup and finish; the group's lookup, and each of 3 samples' finish.
    assert sum(_name(h.session) == "s" for _, h in CALLS) == 2
    assert sum(_name(h.session) == "f" for _, h in CALLS) == 4


def test_a_replay_at_20x_runs_the_hints_clock_20_times_faster():
    with _llm(clock_speed=20) as llm:
        before = time.monotonic()
        _run(llm, "a", hint={"session": "s", "expect_return_s": 10})
        after = time.monotonic()
    (_, first), (_, last) = CALLS
    assert 20 * before <= first.now <= last.now <= 20 * after
    assert first.return_at == pytest.approx(first.now + 10)  # trace seconds, as the caller sent them


def test_preempted_hinted_requests_give_one_lookup_hint_and_one_finish_hint_each():
    """A device cache too small for four requests at once preempts them; a preempted request is
    looked up again when it resumes, which is not news: each still gives its hint twice (its
    prompt's blocks, then all it computed), and generates what it generates unhinted and roomy."""
    prompts = {f"r{i}": [i + 1] + PROMPT[:40] for i in range(4)}  # 41 tokens: 5 full blocks each

    def serve(num_gpu_blocks: int, hinted: bool) -> tuple[dict[str, list[int]], int]:
        with _llm(num_gpu_blocks=num_gpu_blocks) as llm:
            for rid, prompt in prompts.items():
                llm.add_request(prompt, PARAMS, request_id=rid,
                                hint={"session": rid, "expect_return_s": 3} if hinted else None)
            # Until the stores land too: a finished request's record stays while they are in flight
            # (CI once checked the records a step before the last store landed).
            while llm.scheduler.has_unfinished_requests() or llm.scheduler_connector.has_pending_work():  # type: ignore[union-attr]
                llm.step()
            out = {rid: list(llm.collect(rid).token_ids) for rid in prompts}
            assert llm.scheduler_connector.connector_scheduler.records.requests == {}  # type: ignore[union-attr]
            return out, llm.stats()["preemptions"]

    roomy, _ = serve(128, hinted=False)
    CALLS.clear()
    tight, preemptions = serve(16, hinted=True)
    assert preemptions > 0 and tight == roomy
    for rid in prompts:
        given = [keys for keys, h in CALLS if _name(h.session) == rid]
        # 5 prompt blocks at the first lookup; at the finish 60 of its 61 tokens computed: 7.
        assert [len(k) for k in given] == [5, 7], (rid, [len(k) for k in given])
        assert given[1][:5] == given[0]


class RaisingHinted(RecordingHinted):
    """A user's policy with a bug in ``hint``."""

    def hint(self, block_hashes, hint):  # type: ignore[no-untyped-def]
        super().hint(block_hashes, hint)
        raise KeyError("session table")


def test_a_policy_whose_hint_raises_is_logged_once_and_requests_are_served(caplog):
    with _llm() as llm:
        want = [_run(llm, f"plain-{i}") for i in range(2)]
    with _llm(policy="RaisingHinted") as llm, caplog.at_level(logging.WARNING, logger="kvoffload"):
        got = [_run(llm, f"h-{i}", hint={"session": "s", "expect_return_s": 2}) for i in range(2)]
        llm.reset_prefix_cache()
        again = _run(llm, "again", hint={"session": "s"})  # its prefix comes back from the tier
        hit = llm.stats()["connector"]["hit_tokens_by_tier"]
    assert got == want and again == want[0]
    assert hit.get("cpu", 0) > 0
    assert len(CALLS) == 1  # the first hint raised: the tier gave the policy no more
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "RaisingHinted raised in hint()" in errors[0].getMessage() and "CPU tier" in errors[0].getMessage()
    assert errors[0].exc_info is not None and errors[0].exc_info[0] is KeyError
