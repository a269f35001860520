"""Cost of one PyMC-target evaluation per state: the graph vectorized over the batch against the
per-state loop (``from_pymc(..., vectorize=False)``), at n = 64 states of a small model (and
n = 2048 prior draws: a block of the engine's reference refresh).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/pymc_batch.py

Prints microseconds per state for the log-density parts with their gradients (one compiled
call: what ``log_likelihood`` / ``reference_log_prob`` / the ``grad_*`` members use), for the
model variables (``model_variables``) and for exact reference draws (``reference_sample``: one
call of the forward-sampling graph vectorized over the draws, against one call per draw), at
n = 64 and n = 2048 draws.  Best of 5 repeats of 50 calls (10 for the draws; 2 at n = 2048).
"""

from __future__ import annotations

import time

import numpy as np
import pymc as pm
import torch

from nrpt.targets import from_pymc

N = 64
N_BLOCK = 2048


def draw(t, n: int):
    return t.reference_sample(n, torch.Generator().manual_seed(1))


def model():
    with pm.Model(coords={"k": ["a", "b", "c"]}) as m:
        p = pm.Beta("p", 2.0, 3.0)
        s = pm.HalfNormal("s", 1.5)
        mu = pm.Normal("mu", 0.0, 1.0, dims="k")
        w = pm.Dirichlet("w", np.ones(3), dims="k")
        pm.Deterministic("d", mu * s, dims="k")
        pm.Normal("y", (mu * w).sum() + p, s, observed=np.array([0.3, -0.4, 1.1, 0.8, 0.2]))
    return m


def per_state(fn, reps: int = 50, repeats: int = 5, n: int = N) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best / n * 1e6


def main() -> None:
    m = model()
    rows = []
    for vectorize in (True, False):
        t = from_pymc(m, vectorize=vectorize)
        x = t.reference_sample(N, torch.Generator().manual_seed(0)).numpy()
        logp = t._function("logp")
        rows.append(("vectorized" if vectorize else "loop",
                     per_state(lambda: logp(x)),  # noqa: B023
                     per_state(lambda: t.model_variables(x)),  # noqa: B023
                     per_state(lambda: draw(t, N), reps=10),  # noqa: B023
                     per_state(lambda: draw(t, N_BLOCK), reps=2, repeats=3,  # noqa: B023
                               n=N_BLOCK)))
    print(f"from_pymc, dim = {t.dim}, n = {N} states per call; microseconds per state")
    print(f"{'mode':<12}{'logp+grad':>12}{'variables':>12}{'prior draw':>12}"
          f"{f'draw n={N_BLOCK}':>15}")
    for name, a, b, c, d in rows:
        print(f"{name:<12}{a:>12.2f}{b:>12.2f}{c:>12.2f}{d:>15.2f}")


if __name__ == "__main__":
    main()
