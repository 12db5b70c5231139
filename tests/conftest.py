"""One torch thread for the whole suite: the tiny engine runs several times slower with
torch's default thread count whenever anything else uses the machine (CI, a second job)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path_factory, monkeypatch):
    """Each test its own per-user cache directory (disk tiers without a path, weight digests):
    the suite never writes to ~/.cache, and two tests running at once (pytest -n) never contend
    for one disk tier's file. A test about the default itself sets or unsets the variables."""
    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path_factory.mktemp("kvoffload-cache")))
