"""The chaos suite: a fixed budget of random cases (configuration x fault script) per CI run.

Each case must give tokens identical to the no-offload reference in both rounds, with no
exception, no stall and no leaked fd or thread. ``kvoffload bench chaos --cases N`` runs more.
"""

import logging

import pytest
import torch

from kvoffload.testing.chaos import describe, draw_case, run_case

torch.set_num_threads(1)
REFERENCE: dict = {}


@pytest.mark.parametrize("seed", range(1000, 1060))
def test_chaos_case(seed, caplog):
    caplog.set_level(logging.ERROR, logger="kvoffload")
    result = run_case(draw_case(seed), REFERENCE)
    assert result.ok, f"seed {seed}: {describe(result.case)}\n{result.error}"


def test_cases_cover_every_axis():
    cases = [draw_case(s) for s in range(1000, 1060)]
    assert {c.tiers for c in cases} == {"cpu", "writeback", "writethrough"}
    assert {c.preemption for c in cases} == {"recompute", "swap"}
    assert {c.sampling for c in cases} == {"greedy", "n", "beam"}
    assert {c.factor for c in cases} == {1, 2, 4}
    assert {c.mutate for c in cases} == {"none", "flip", "relocate"}
    assert {c.load_mode for c in cases} == {"auto", "layerwise", "async", "never-recompute"}
    assert {c.slow for c in cases} == {"", "disk:20MB/s:5ms", "disk:2MB/s:20ms"}
    assert {c.restart for c in cases} == {"none", "clean", "kill"}
    assert any(c.faults.read_error == 1.0 for c in cases) and any(c.faults.write_error for c in cases)
    assert any(c.reuse_filter for c in cases) and len({c.policy for c in cases}) >= 5
