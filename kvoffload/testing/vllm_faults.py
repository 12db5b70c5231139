"""Negative control for the spec route (vLLM's own OffloadingConnector with KVOffloadSpec):
the same spec, whose worker flips the bytes of every block it loads. Name it with
``"spec_name": "FaultyKVOffloadSpec", "spec_module_path": "kvoffload.testing.vllm_faults"``."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvoffload.integrations.vllm_spec import KVOffloadSpec
from kvoffload.integrations.vllm_worker import KVOffloadWorker
from kvoffload.testing.faults import corrupt_landed_loads


class CorruptingKVOffloadWorker(KVOffloadWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loads: dict[int, np.ndarray] = {}

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        self._loads[job_id] = self._rows(dst_spec, src_spec)[0]
        return super().submit_load(job_id, src_spec, dst_spec)

    def get_finished(self) -> list:
        results = super().get_finished()
        corrupt_landed_loads(self._loads, self.kv, results)
        return results


class FaultyKVOffloadSpec(KVOffloadSpec):
    def get_worker(self, kv_caches: Any) -> KVOffloadWorker:
        if self._worker is None:
            transfer = self.offload_config.transfer
            self._worker = CorruptingKVOffloadWorker(kv_caches, self.blocks_per_chunk, self.num_chunks,
                                                     transfer.backend, transfer.num_streams)
        return self._worker
