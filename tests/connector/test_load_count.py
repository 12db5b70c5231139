"""A request's loads are counted on its record: ``loading`` (which keeps its blocks) clears
when its own last load lands, whatever other requests still load."""

from types import SimpleNamespace

from kvoffload.config import OffloadConfig
from kvoffload.connector.jobs import JobKind
from kvoffload.connector.scheduler.offloading_scheduler import OffloadingConnectorScheduler
from kvoffload.offload.mediums import GPULoadStoreSpec
from kvoffload.offload.spec import EngineKVInfo, OffloadingSpecFactory
from kvoffload.transfer.result import TransferResult


def _sched():
    cfg = OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": 8 * 100}]})
    info = EngineKVInfo(block_size=4, block_bytes=100, num_device_blocks=16)
    return OffloadingConnectorScheduler(OffloadingSpecFactory.create_spec(cfg, info))


def _landed(sched, job, ok=True):
    sched.update_connector_output([TransferResult(job.job_id, ok, 100 if ok else 0, 0.001, "host_to_device")])


def test_loading_clears_when_the_requests_own_last_load_lands():
    sched = _sched()
    sched.manager.prepare_store([1, 2, 3])
    sched.manager.complete_store([1, 2, 3])
    jobs = {}
    for rid, hashes in (("r", [1, 2]), ("s", [3])):
        sched.records.state(rid).loading = list(hashes)
        for k, h in enumerate(hashes):
            jobs[rid, h] = sched.records.new_job(JobKind.LOAD, rid, [h], sched.manager.prepare_load([h]), GPULoadStoreSpec([k]))
    r, s = sched.records.requests["r"], sched.records.requests["s"]
    assert (r.loads_in_flight, s.loads_in_flight) == (2, 1)

    _landed(sched, jobs["s", 3])
    assert s.loading is None and s.loads_in_flight == 0
    _landed(sched, jobs["r", 1])
    assert r.loading == [1, 2] and r.loads_in_flight == 1  # its second segment is still in flight

    # Finished by the engine meanwhile: kept (its blocks are being written) until the last load lands.
    delay, _ = sched.request_finished(SimpleNamespace(request_id="r", kv_transfer_params=None, cache_salt=None, output_token_ids=[]), ([0, 1],))
    assert delay and "r" not in sched.records.next_step.await_finish  # the finished-receiving report frees it, not await_finish
    _landed(sched, jobs["r", 2], ok=False)
    assert "r" not in sched.records.requests
    assert sched.stats.failed_load_blocks == 1 and sched.stats.loaded_blocks == 2
    assert sched.manager.report().tiers[0].pinned_blocks == 0  # every load unpinned what it read
