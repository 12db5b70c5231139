"""Every log form a plan reads, as blocks hashed the engine's way, and their malformed lines."""

from __future__ import annotations

import gzip
import json

import pytest

from kvoffload.engine.hashing import hash_request_blocks
from kvoffload.plan.log_reader import detect_form, read_log
from kvoffload.plan.request_log import RequestLogError
from tests.weka_traces import write_weka_tar


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_token_logs_hash_as_the_engine_does_and_replies_reach_the_next_turn(tmp_path):
    a = list(range(10, 50))  # 40 tokens: 2 full blocks of 16
    reply = list(range(100, 120))  # 20 tokens
    b = a + reply + list(range(60, 70))  # the next turn: 70 tokens
    path = write(tmp_path / "log.jsonl", [
        {"prompt_token_ids": a, "session": "s", "timestamp": 1.0, "max_tokens": 20},
        {"prompt_token_ids": b, "session": "s", "timestamp": 3.0},
        {"prompt_token_ids": list(range(200, 240)), "session": "t", "timestamp": 2.0},
    ])
    log = read_log(path, 16, vocab=300)
    assert log.form == "openai" and log.block_tokens == 16 and not log.stand_in
    first, other, second = log.requests
    assert (first.t, other.t, second.t) == (0.0, 1.0, 2.0)
    assert first.blocks == hash_request_blocks(a, 16) and first.prompt_tokens == 40
    assert len(second.blocks) == 4 and len(second.stored) == 4  # 70 tokens: (70 - 1) // 16 and 70 // 16
    # The engine computes 40 + 20 - 1 = 59 tokens of the first turn: 3 full blocks, the third
    # one the next turn's.
    assert first.stored == hash_request_blocks(b, 16)[:3]
    assert second.stored == second.blocks == hash_request_blocks(b, 16)
    aligned = read_log(write(tmp_path / "a.jsonl", [{"prompt_token_ids": list(range(10, 58))}]), 16, 300).requests[0]
    assert len(aligned.blocks) == 2 and len(aligned.stored) == 3  # 48 tokens: the last block is recomputed
    assert other.stored == other.blocks  # no later turn


def test_a_turn_sent_after_its_answer_waited_for_it(tmp_path):
    path = write(tmp_path / "log.jsonl", [
        {"prompt_token_ids": [11] * 20, "session": "s", "timestamp": 0.0, "duration_s": 0.5},
        {"prompt_token_ids": [11] * 30, "session": "s", "timestamp": 0.75, "duration_s": 0.2},
        {"prompt_token_ids": [11] * 40, "session": "s", "timestamp": 0.8},  # sent before the answer came
        {"prompt_token_ids": [12] * 20, "session": "t", "timestamp": 0.1},
    ])
    reqs = read_log(path, 16, vocab=300).requests
    assert [(r.after, r.think_s) for r in reqs] == [(-1, 0.0), (-1, 0.0), (0, pytest.approx(0.25)), (-1, 0.0)]


def test_a_rewritten_history_is_not_a_continuation(tmp_path):
    a = list(range(10, 60))
    path = write(tmp_path / "log.jsonl", [
        {"prompt_token_ids": a, "session": "s", "max_tokens": 64},
        {"prompt_token_ids": [11] + a[1:] + list(range(60, 140)), "session": "s"},
    ])
    first = read_log(path, 16, vocab=300).requests[0]
    assert first.stored == first.blocks


def test_text_logs_go_through_the_stand_in(tmp_path):
    path = write(tmp_path / "log.jsonl", [{"messages": [{"role": "user", "content": "word " * 40}]}])
    log = read_log(path, 16)
    assert log.stand_in and log.requests[0].prompt_tokens == 43  # "<user>" is three: < user >


def test_mooncake_traces(tmp_path):
    rows = [{"timestamp": 5000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
            {"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [0, 7]}]
    p = tmp_path / "trace.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    assert detect_form(p) == "mooncake"
    log = read_log(p, 16)
    assert log.block_tokens == 512 and log.form == "mooncake"
    assert [(r.t, r.blocks, r.prompt_tokens) for r in log.requests] == [(0.0, [0], 600), (3.0, [0, 1], 1100)]


def test_a_malformed_mooncake_line(tmp_path):
    p = write(tmp_path / "trace.jsonl", [{"timestamp": 1, "input_length": 5, "hash_ids": [1]},
                                         {"timestamp": 2, "input_length": 5, "hash_ids": "x"}])
    with pytest.raises(RequestLogError, match="line 2: a Mooncake trace line needs hash_ids"):
        read_log(p, 16)


def test_weka_traces(tmp_path):
    p = tmp_path / "w.tar.gz"
    write_weka_tar(p, [{"id": "c1", "block_size": 64, "requests": [
        {"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 3]},
        {"t": 4.0, "type": "n", "in": 300, "out": 5, "hash_ids": [1, 2, 3, 4]}]}])
    log = read_log(p, 16)
    assert log.form == "weka" and log.block_tokens == 64
    first, second = log.requests
    assert second.blocks[:3] == first.blocks and second.session == first.session == "c1" and second.t == 4.0


@pytest.mark.parametrize(("line", "words"), [
    ("{not json", "line 2: not JSON"),
    ('{"prompt_token_ids": [1, -2]}', "line 2: prompt_token_ids must be a non-empty list of ints"),
    ('{"messages": []}', "line 2: messages must be a non-empty list"),
    ('{"prompt": "hi", "timestamp": "noon"}', "line 2: timestamp must be a finite number"),
    ('{"max_tokens": 3}', "line 2: no prompt"),
])
def test_a_malformed_line_is_named(tmp_path, line, words):
    p = tmp_path / "log.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(RequestLogError, match=words):
        read_log(p, 16)


def test_the_shipped_sample_and_a_missing_file(tmp_path):
    log = read_log("sample", 16, vocab=258)
    assert len(log.requests) == 24 and log.stand_in and {r.session for r in log.requests} == {
        f"chat-{c}" for c in range(8)}
    with pytest.raises(RequestLogError, match="no such file"):
        read_log(tmp_path / "none.jsonl", 16)
