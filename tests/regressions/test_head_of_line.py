"""Defect 2: a head request that cannot be admitted must not strand loaded requests behind it."""

from kvoffload.connector.base import KVConnectorOutput
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.engine.request import RequestStatus
from tests.engine.helpers import fake_run, make_request, make_scheduler
from tests.engine.test_connector_touchpoints import RecordingConnector


class Connector(RecordingConnector):
    def request_finished(self, request, block_ids):
        return False, None  # nothing of ours reads a finished request's blocks


def _loaded(sched, rids):
    out = ModelRunnerOutput([], [], kv_connector_output=KVConnectorOutput(finished_recving=set(rids)))
    sched.update_from_output(sched.schedule(), out)


def test_loaded_requests_run_past_a_head_that_needs_their_blocks():
    # 11 usable blocks of 4 tokens. b and c load 8 external tokens each and reserve their
    # 16-token prompts (4 blocks each): 3 blocks stay free.
    conn = Connector({"b": [(8, True)], "c": [(8, True)], "a": [(0, False)] * 50})
    sched = make_scheduler(num_blocks=12, block_size=4, connector=conn)
    b, c = make_request("b", 16, max_tokens=2, start=100), make_request("c", 16, max_tokens=2, start=200)
    sched.add_request(b)
    sched.add_request(c)
    sched.schedule()
    assert b.status == c.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 3
    # A preempted request goes back to the front: it needs 5 blocks, only 3 are free.
    a = make_request("a", 20, max_tokens=2, start=300)
    a.status = RequestStatus.PREEMPTED
    sched.requests["a"] = a
    sched.waiting.appendleft(a)
    _loaded(sched, ["b", "c"])

    so = sched.schedule()
    assert so.num_scheduled_tokens == {"b": 8, "c": 8}  # resumed behind the blocked head
    assert [r.request_id for r in sched.waiting] == ["a"]
    fake_run(sched, so)
    for _ in range(20):
        if not sched.has_unfinished_requests():
            break
        so = sched.schedule()
        fake_run(sched, so)
    assert a.is_finished and b.is_finished and c.is_finished


def test_blocked_head_keeps_fcfs_for_requests_without_blocks():
    conn = Connector({"b": [(8, True)], "a": [(0, False)] * 50, "d": [(0, False)] * 50})
    sched = make_scheduler(num_blocks=8, block_size=4, connector=conn)
    b = make_request("b", 16, max_tokens=2, start=100)
    sched.add_request(b)
    sched.schedule()
    a = make_request("a", 20, max_tokens=2, start=300)  # needs 5 blocks, 3 free
    d = make_request("d", 4, max_tokens=2, start=400)  # would fit, but must not jump the queue
    sched.add_request(a)
    sched.add_request(d)
    _loaded(sched, ["b"])
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"b": 8}
    assert [r.request_id for r in sched.waiting] == ["a", "d"]
