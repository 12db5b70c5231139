"""A user's OpenAI-style JSONL request log: every form a line takes, what a bad line is told,
and the replay it becomes (``bench serve --workload log``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.bench.serve_workloads import request_log
from kvoffload.plan.request_log import FIRST_ID, RequestLogError, read_request_log, stand_in_tokens


def write(tmp_path, lines) -> str:
    p = tmp_path / "log.jsonl"
    p.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(p)


def test_every_form_of_a_line_and_arrival_order(tmp_path):
    path = write(tmp_path, [
        {"prompt_token_ids": [11, 12, 13], "timestamp": 1_700_000_002_500, "session": "a"},  # milliseconds
        {"prompt": "Hello there, world", "timestamp": 1_700_000_001_000, "user": "u1", "max_tokens": 7},
        "",
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "timestamp": 1_700_000_000_000},
        {"custom_id": "x", "body": {"messages": [{"role": "user", "content": "Hi"}], "user": "b"}},
    ])
    reqs = read_request_log(path, vocab=1000)
    assert [r.line for r in reqs] == [4, 5, 2, 1]  # by time (the untimed line arrives with line 4)
    assert [r.t for r in reqs] == [0.0, 0.0, 1.0, 2.5]  # seconds from the first request
    by_line = {r.line: r for r in reqs}
    assert by_line[1].tokens == (11, 12, 13) and not by_line[1].from_text and by_line[1].session == "a"
    assert by_line[2].session == "u1" and by_line[2].max_tokens == 7 and by_line[2].from_text
    assert by_line[2].tokens == stand_in_tokens("Hello there, world", 1000) and len(by_line[2].tokens) == 4
    assert by_line[5].session == "b" and by_line[5].tokens == stand_in_tokens("<user> Hi", 1000)
    assert all(FIRST_ID <= t < 1000 for r in reqs for t in r.tokens)


def test_the_stand_in_tokenizer_keeps_shared_prefixes_shared():
    first = stand_in_tokens("<system> You are a careful assistant.\n<user> What is KV caching?", 32000)
    later = stand_in_tokens("<system> You are a careful assistant.\n<user> What is KV caching?\n"
                            "<assistant> A cache of attention keys.\n<user> And offloading?", 32000)
    assert later[: len(first)] == first and len(later) > len(first)
    assert stand_in_tokens("other words", 32000)[:1] != first[:1]


@pytest.mark.parametrize("line, message", [
    ("{not json", r"line 1: not JSON at column 2 \(Expecting property name .*\); one object a line"),
    ('{"timestamp": 1, "prompt_tok', r"line 1: not JSON at column 18 \(Unterminated string starting\); one object a line"),
    ("[1, 2]", "line 1: a request must be a JSON object, got list"),
    ({"model": "m"}, "line 1: no prompt: give prompt_token_ids, prompt \\(text\\) or messages"),
    ({"prompt_token_ids": [1, -2]}, r"line 1: prompt_token_ids must be a non-empty list of ints in \[0, 1000\)"),
    ({"prompt_token_ids": [1, 5000]}, r"pass --vocab to match the model's"),
    ({"prompt_token_ids": [True]}, "prompt_token_ids must be"),
    ({"messages": []}, "line 1: messages must be a non-empty list"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
     r"line 1: messages\[0\] needs a string content .* flatten it to text"),
    ({"prompt": "   "}, "line 1: no prompt"),
    ({"prompt": "!?"} | {"timestamp": "noon"}, r"line 1: timestamp must be a finite number in \[0, 1e\+14\], got 'noon'"),
    ('{"prompt": "hi", "timestamp": NaN}', r"line 1: timestamp must be a finite number in \[0, 1e\+14\], got nan"),
    ({"prompt": "hi", "max_tokens": -1}, r"line 1: max_tokens must be a finite number in \[0, 1e\+07\], got -1"),
    ({"prompt": "hi", "session": {"id": 1}}, "line 1: session must be a string of at most 1000 characters, got {'id': 1}"),
])
def test_a_bad_line_is_told_its_number_field_and_fix(tmp_path, line, message):
    with pytest.raises(RequestLogError, match=message):
        read_request_log(write(tmp_path, [line]), vocab=1000)


def test_an_empty_or_missing_log_is_refused(tmp_path):
    with pytest.raises(RequestLogError, match="no requests in it"):
        read_request_log(write(tmp_path, ["", "  "]))
    with pytest.raises(RequestLogError, match="no such file"):
        read_request_log(tmp_path / "nope.jsonl")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
                     | st.lists(st.integers(-5, 600), max_size=4)  # token ids, some out of range
                     | st.lists(st.fixed_dictionaries({"role": st.text(max_size=4), "content": st.text(max_size=8)}),
                                max_size=3),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
                     max_leaves=12)
_fields = st.dictionaries(st.sampled_from(["prompt", "prompt_token_ids", "messages", "timestamp", "session", "user",
                                           "max_tokens", "body"]), _json, max_size=5)


@settings(max_examples=200, deadline=None)
@given(st.lists(_fields, min_size=1, max_size=4))
def test_any_line_is_read_or_refused_in_one_line(tmp_path_factory, lines):
    path = write(tmp_path_factory.mktemp("log"), lines)
    try:
        reqs = read_request_log(path, vocab=500)
    except RequestLogError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(("line ", "--log "))
        return
    assert len(reqs) == len(lines) and all(r.tokens and all(0 <= t < 500 for t in r.tokens) for r in reqs)


def test_a_log_becomes_conversations_replayed_at_their_times(tmp_path):
    path = write(tmp_path, [
        {"prompt_token_ids": [20, 21, 22], "timestamp": 100.0, "session": "c"},
        {"prompt_token_ids": [30, 31], "timestamp": 101.0},
        {"prompt_token_ids": [20, 21, 22, 40, 41], "timestamp": 104.0, "session": "c"},
    ])
    wl = request_log(path, clients=2, max_tokens=3, time_scale=0.5, vocab=100)
    assert wl.name == "log" and wl.concurrency == 2  # timed: every conversation may be in flight
    c, single = wl.sessions
    assert c.turns == ((20, 21, 22), (20, 21, 22, 40, 41)) and c.whole and c.start_s == 0.0
    assert c.think_before(1) == 2.0  # 4 s apart in the log, replayed at half time
    assert single.turns == ((30, 31),) and single.start_s == 0.5
    assert wl.max_context == 5 + 3


def test_bench_serve_replays_a_chat_log_on_the_bundled_engine(tmp_path, capsys):
    from kvoffload.bench import serve_bench

    system = "You are a careful assistant who answers in one short sentence. " * 6
    lines, history = [], []
    for turn in range(3):  # two users each sending their whole conversation every turn, text only
        for user in ("ann", "bob"):
            history_u = [m for u, m in history if u == user]
            msgs = [{"role": "system", "content": system}, *history_u,
                    {"role": "user", "content": f"question {turn} from {user} about caching"}]
            lines.append({"messages": msgs, "user": user, "timestamp": turn * 0.2})
            history.append((user, {"role": "user", "content": f"question {turn} from {user} about caching"}))
            history.append((user, {"role": "assistant", "content": f"answer {turn}"}))
    path = write(tmp_path, lines)
    out = tmp_path / "r.json"
    rc = serve_bench.main(["--engine", "bundled", "--workload", "log", "--log", path, "--time-scale", "1",
                           "--max-tokens", "2", "--configs", "plain,cpu", "--cpu", "16MiB", "--reps", "1",
                           "--json", str(out), "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                           "--vocab", "500"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "workload log on the bundled engine: 2 sessions, 6 requests" in text
    assert "tokens identical to plain engine cpu: 1/1 runs" in text
    assert json.loads(out.read_text())["configs"]["cpu"]["hit_tokens_per_run"]["device"] > 0  # shared prefixes hit
    with pytest.raises(SystemExit) as exc:
        serve_bench.main(["--engine", "bundled", "--workload", "log", "--log", write(tmp_path, ["{"])])
    assert exc.value.code == 2 and "line 1: not JSON" in capsys.readouterr().err


def test_bad_lines_are_skipped_up_to_the_bound_counted_and_the_first_named(tmp_path):
    from kvoffload.plan.log_reader import read_log
    from kvoffload.plan.request_log import BadLines

    log = tmp_path / "live.jsonl"
    good = '{"timestamp": %d, "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9], "max_tokens": 4}\n'
    log.write_text(good % 1 + '{"timestamp": 2, "prompt_token_ids": "x"}\n' + good % 3 + '{"timestamp": 4, "prom')
    bad = BadLines(2)
    assert len(read_log(log, 4, bad=bad).requests) == 2
    assert len(bad.skipped) == 2 and bad.skipped[0].startswith("line 2: prompt_token_ids must be")
    assert bad.note() == f"note: skipped 2 bad line(s) (--skip-bad-lines); the first: {bad.skipped[0]}"
    with pytest.raises(RequestLogError, match=r"^line 4: not JSON .* \(bad line 2: past --skip-bad-lines 1\)$"):
        read_log(log, 4, bad=BadLines(1))
    with pytest.raises(RequestLogError, match=r"^line 2: .* \(or --skip-bad-lines N skips up to N bad lines\)$"):
        read_log(log, 4, bad=BadLines(0))
    with pytest.raises(RequestLogError, match=r"^line 2: prompt_token_ids must be [^(]*$"):
        read_log(log, 4)  # a caller without the option: the error names none
