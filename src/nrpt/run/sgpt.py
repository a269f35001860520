"""Stochastic-gradient parallel tempering (DEO*-SGD, Deng et al. 2023, Algorithm 1; reSGLD):
the headline preset, the no-swap baselines (parallel SGLD, cyclical SGLD) and histogram
errors against an exact density.  SG runs themselves are built by
:func:`nrpt.run.build.build` (explorers tagged ``sg`` in :mod:`nrpt.run.registry`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nrpt.core.engine import PTEngine
from nrpt.core.loop import Plan, Run, execute
from nrpt.diagnostics.density import grid_errors, iid_floor
from nrpt.explorers import Explorer
from nrpt.paths.ladders import NoiseLadder
from nrpt.recorders.draws import Draws
from nrpt.swap import Metropolis, NoSwap

__all__ = ["HEADLINE", "run_chains", "grid_errors", "iid_floor"]

#: the paper's headline run (Sec. 5.1): DEO*-SGD x P16 on the 25-mode target with a noisy oracle
HEADLINE: dict[str, Any] = {
    "target": "twenty-five-modes", "target_options": {"penalty": True}, "chains": 16,
    "iterations": 20_000, "scheme": "deo-w", "window": "swap-rate", "explorer": "sgd",
    "noise_sd": 2.0, "lr_min": 0.003, "lr_max": 0.6, "swap_rate": 0.4, "correction": 4.0,
    "swap_rule": "deterministic", "adapt": True, "bottom_temperature": 1.0,
}


# ------------------------------------------------------------------------ no-swap baselines
def run_chains(target, explorer: Explorer, *, chains: int, iterations: int, step_size,
               seed: int = 0, systems: int = 1, temperature: float = 1.0, keep=None,
               burn_in: int = 0, initial_states: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float64) -> np.ndarray:
    """Independent chains without swaps (parallel SGLD x P, or one cyclical chain), run by the
    one loop with scheme ``none`` (the same keyed noise as any run).

    ``step_size`` is a number or ``[chains]`` learning rates; ``keep(k) -> bool`` selects the
    recorded iterations (default: all after ``burn_in``).  Returns ``[systems, n_kept * chains,
    dim]`` (the draws of all chains of a system pooled, chain-major within each iteration)."""
    from nrpt.run.build import initial_states as initial

    R, n, d = int(systems), int(chains), int(target.dim)
    path = NoiseLadder([temperature] * n, min_slots=1)
    if initial_states is None:
        x0, _ = initial(target, path, R, n, seed, dtype, "cpu")
    else:
        x0 = torch.as_tensor(initial_states, dtype=dtype).reshape(R, n, d)
    step = [float(step_size)] * n if np.ndim(step_size) == 0 else list(step_size)
    engine = PTEngine(target, path, explorer, NoSwap(), Metropolis(), step_size=step,
                      systems=R, seed=seed, dtype=dtype, initial_states=x0)
    draws = Draws(int(iterations), R, n, d, slots="all",
                  dtype=np.float64 if dtype == torch.float64 else np.float32)
    execute(Run(engine, [], {"draws": draws}, Plan.fixed(iterations)))
    keep = keep or (lambda k: k >= burn_in)
    kept = [k for k in range(int(iterations)) if keep(k)]
    if not kept:
        return np.zeros((R, 0, d))
    xs = np.asarray(draws.samples).reshape(R, int(iterations), n, d)[:, kept]
    return xs.reshape(R, -1, d)
