"""Where the headline loop's microseconds go: each role's functions timed around their calls.

    OMP_NUM_THREADS=1 PYTHONPATH=TREE/src python benchmarks/headline_parts.py [--iterations N]

Runs nrpt's default headline loop (``headline.run_nrpt_loop``: eager chunks, one torch thread)
once to warm up and once timed, with ``time.perf_counter`` wrapped around every call of the
functions below that the tree has (older trees lack the array forms, newer ones may not call
the tensor forms), and prints each one's inclusive time per iteration (a function's callees
included: the oracle's figure holds the target's).  A wrapper costs ~0.2-0.3 us a call, so
the loop reads a few percent slower than unwrapped; compare shares, and trees in one window
of load.  Used for docs/benchmarks.md's "The headline loop on arrays end to end (stop 38)".
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (module, class or None, function, label) -- timed where the tree has them
PARTS = [
    ("nrpt.targets.twenty_five_modes", "TwentyFiveModes", "energy_and_grad_numpy",
     "target: energy and gradient on arrays"),
    ("nrpt.energy.estimators", "NoisyOracle", "numpy_gradients", "noisy oracle (with target)"),
    ("nrpt.explorers.sgmcmc", "SGExplorer", "_step_np", "SGD step on views (with oracle)"),
    ("nrpt.explorers.sgmcmc", "SGExplorer", "move_np", "SGD move on arrays"),
    ("nrpt.explorers.sgmcmc", None, "finite_np", "finiteness check"),
    ("nrpt.core.fused", "_HostSwaps", "swaps", "swap phase, tensor iteration (with rule)"),
    ("nrpt.core.fused", "_HostSwaps", "exchange", "swaps executed on arrays"),
    ("nrpt.swap.noisy", "Deterministic", "decide_host", "rule on views"),
    ("nrpt.swap.noisy", "Deterministic", "decide_arrays", "rule on arrays"),
    ("nrpt.core.fused", "_HostSwaps", "gate_phase", "DEO_W gate opened (tensor)"),
    ("nrpt.core.fused", "_HostSwaps", "gate_phase_a", "DEO_W gate opened (arrays)"),
    ("nrpt.core.fused", "_HostSwaps", "gate_after", "DEO_W gate closed"),
    ("nrpt.core.fused", "_HostSwaps", "indicators", "pair indicators"),
    ("nrpt.adapt.sa", "CorrectionAdaptor", "observe_block", "correction C (block form)"),
    ("nrpt.adapt.sa", "CorrectionAdaptor", "observe_arrays", "correction C (arrays)"),
    ("nrpt.adapt.sa", "LearningRateAdaptor", "observe_block", "learning rates (block form)"),
    ("nrpt.adapt.sa", "LearningRateAdaptor", "observe_arrays", "learning rates (arrays)"),
    ("nrpt.core.fused", "_HostSwaps", "__init__", "per chunk: bookkeeping set-up"),
    ("nrpt.core.fused", "Fused", "_inputs", "per chunk: draws and inputs"),
    ("nrpt.core.fused", "Fused", "run_chunk", "run_chunk (everything)"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=10000)
    args = ap.parse_args()
    import importlib

    import torch

    torch.set_num_threads(1)
    import headline as hl

    spent: collections.Counter = collections.Counter()
    clock = time.perf_counter

    def wrap(owner, name: str, label: str) -> None:
        f = getattr(owner, name)

        def timed(*a, **kw):
            t = clock()
            try:
                return f(*a, **kw)
            finally:
                spent[label] += clock() - t

        setattr(owner, name, timed)

    labels = []
    for mod, cls, fn, label in PARTS:
        m = importlib.import_module(mod)
        owner = m if cls is None else getattr(m, cls, None)
        if owner is not None and fn in vars(owner):
            wrap(owner, fn, label)
            labels.append(label)
            if cls is None and mod == "nrpt.explorers.sgmcmc":  # (fused imports it by name)
                fused = importlib.import_module("nrpt.core.fused")
                if hasattr(fused, fn):
                    setattr(fused, fn, getattr(m, fn))
    fused = importlib.import_module("nrpt.core.fused")
    body = fused.Fused._body

    def timed_body(self, U, eager=False):
        fn = body(self, U, eager)

        def run(carry, inp):
            t = clock()
            try:
                return fn(carry, inp)
            finally:
                spent["chunk body (iterations)"] += clock() - t

        return run

    fused.Fused._body = timed_body
    labels.append("chunk body (iterations)")
    hl.run_nrpt_loop(300, 99)
    spent.clear()
    K = args.iterations
    got = hl.run_nrpt_loop(K, 1)
    print(f"headline loop, {K} iterations, one thread: {got['time_s'] / K * 1e6:.1f} us an "
          f"iteration (wall_time_s, wrapped); inclusive times per iteration:")
    for label in labels:
        if spent[label]:
            print(f"  {label:44s} {spent[label] / K * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
