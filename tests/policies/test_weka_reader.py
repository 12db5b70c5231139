"""The WEKA reader places a sub-agent's requests at the sub-agent's start plus their own times
(theirs count from the sub-agent's start), nested sub-agents too, and interleaves conversations
by those times."""

from __future__ import annotations

from kvoffload.traces import load_weka_requests
from tests.weka_traces import write_weka_tar


def test_sub_agent_requests_run_at_their_parents_time_plus_their_own(tmp_path):
    path = tmp_path / "weka.tar.gz"
    write_weka_tar(path, [
        {"id": "main", "requests": [
            {"t": 0.0, "hash_ids": [1], "stop": "tool_use"},
            {"t": 400.0, "type": "subagent", "requests": [
                {"t": 0.0, "hash_ids": [10], "stop": "tool_use"},
                {"t": 5.0, "hash_ids": [10, 11], "stop": "tool_use"},
                {"t": 20.0, "type": "subagent", "requests": [{"t": 3.0, "hash_ids": [20], "stop": "end_turn"}]}]},
            {"t": 450.0, "hash_ids": [1, 2], "stop": "end_turn"}]},
        {"id": "other", "requests": [{"t": 410.0, "hash_ids": [1], "stop": "end_turn"}]},
    ])
    got = [(r.t, r.session, len(r.blocks)) for r in load_weka_requests(path)]
    # "other" starts 30 s after "main" (the reader's gap): its request lands at 440, between the
    # sub-agent's and the parent's; the nested sub-agent's at 400 + 20 + 3.
    assert got == [(0.0, "main", 1), (400.0, "main", 1), (405.0, "main", 2), (423.0, "main", 1),
                   (440.0, "other", 1), (450.0, "main", 2)]
