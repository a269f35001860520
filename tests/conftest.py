"""Test-wide settings.

The tests run many tiny tensor ops; torch's intra-op thread pool only adds contention there
(measured: 10x slower on a loaded 2-core machine), so the suite runs single-threaded."""

import torch

torch.set_num_threads(1)
