"""Test-wide settings.

The tests run many tiny tensor ops; torch's intra-op thread pool only adds contention there
(measured: 10x slower on a loaded 2-core machine), so the suite runs single-threaded.

PyTensor (the PyMC tests) runs its graphs with its Python implementations (``cxx=``) unless
``PYTENSOR_FLAGS`` says otherwise: compiling its C code costs minutes on a fresh machine (the
suite took 494 s from a cold cache against 347 s warm), the tests' models are small, and the
values are the same either way.  ``PYTENSOR_FLAGS= make test`` runs them with the C linker."""

import os

import torch

os.environ.setdefault("PYTENSOR_FLAGS", "cxx=")
# nrpt.deep.fit's strategy="auto" probes in every test (a decision remembered from an earlier
# test, or from another run on this machine, would skip a probe a test watches)
os.environ.setdefault("NRPT_DEEP_STRATEGY_CACHE", "0")
torch.set_num_threads(1)
