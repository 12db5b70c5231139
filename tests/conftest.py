"""One torch thread for the whole suite: the tiny engine runs several times slower with
torch's default thread count whenever anything else uses the machine (CI, a second job)."""

import torch

torch.set_num_threads(1)
