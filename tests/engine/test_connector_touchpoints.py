"""The scheduler consults a connector at exactly its five touchpoints."""

from kvoffload.connector.base import KVConnectorBase, KVConnectorMetadata, KVConnectorOutput, KVConnectorRole
from kvoffload.engine.outputs import ModelRunnerOutput
from kvoffload.engine.request import RequestStatus
from tests.engine.helpers import fake_run, make_request, make_scheduler


class RecordingConnector(KVConnectorBase):
    def __init__(self, answers):
        super().__init__(None, KVConnectorRole.SCHEDULER)
        self.answers = answers  # request id -> list of (tokens|None, async)
        self.calls = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.calls.append(("match", request.request_id, num_computed_tokens))
        return self.answers[request.request_id].pop(0)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.calls.append(("alloc", request.request_id, blocks.get_block_ids(), num_external_tokens))

    def build_connector_meta(self, scheduler_output):
        self.calls.append(("meta", sorted(scheduler_output.num_scheduled_tokens)))
        return KVConnectorMetadata()

    def update_connector_output(self, connector_output):
        self.calls.append(("output", sorted(connector_output.finished_recving), sorted(connector_output.finished_sending)))

    def request_finished(self, request, block_ids):
        self.calls.append(("finished", request.request_id, block_ids))
        return True, None


def test_async_load_then_resume_and_delayed_free():
    conn = RecordingConnector({"a": [(None, False), (8, True)]})
    sched = make_scheduler(block_size=4, connector=conn)
    req = make_request("a", 14, max_tokens=1)
    sched.add_request(req)

    so = sched.schedule()  # connector says "ask later": request skipped this step
    assert so.num_scheduled_tokens == {} and req.status == RequestStatus.WAITING
    assert conn.calls == [("match", "a", 0), ("meta", [])]

    so = sched.schedule()  # 8 external tokens, loaded asynchronously
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert so.num_scheduled_tokens == {}
    # The load covers 8 tokens; the rest of the prompt is reserved up front (no hold-and-wait).
    assert conn.calls[2:] == [("match", "a", 0), ("alloc", "a", ([1, 2, 3, 4],), 8), ("meta", [])]
    assert sched.schedule().num_scheduled_tokens == {}  # load not finished yet

    out = ModelRunnerOutput([], [], kv_connector_output=KVConnectorOutput(finished_recving={"a"}))
    sched.update_from_output(so, out)
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 6}  # 14 - 8 external tokens
    assert so.scheduled_new_reqs[0].num_computed_tokens == 8
    assert so.scheduled_new_reqs[0].block_ids == ([1, 2, 3, 4],)
    fake_run(sched, so)
    assert req.is_finished
    assert conn.calls[-1] == ("finished", "a", ([1, 2, 3, 4],))
    # Blocks are held until the connector reports the send finished.
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 59
    sched.update_from_output(sched.schedule(), ModelRunnerOutput([], [], kv_connector_output=KVConnectorOutput(finished_sending={"a"})))
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 63
    assert "a" not in sched.requests


def test_failed_load_is_recomputed():
    conn = RecordingConnector({"a": [(8, True), (0, False)]})
    sched = make_scheduler(block_size=4, connector=conn)
    req = make_request("a", 10, max_tokens=1)
    sched.add_request(req)
    so = sched.schedule()
    sched.update_from_output(so, ModelRunnerOutput([], [], kv_connector_output=KVConnectorOutput(failed_recving={"a"})))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 10}
    assert sched.stats.failed_loads == 1
