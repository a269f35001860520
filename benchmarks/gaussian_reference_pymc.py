"""log Z of a PyMC model two ways (issue 25, item 1): ``from_pymc(model)`` with its prior as
the reference, and ``from_pymc(model, path="temperature")`` (the joint density only, as a Stan
program is) with ``reference="gaussian"``; both estimate log p(y).  Eight schools, non-centred.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/gaussian_reference_pymc.py"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import pymc as pm

import nrpt
from nrpt.targets import from_pymc

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def model():
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfCauchy("tau", 5)
        eta = pm.Normal("eta", 0, 1, shape=8)
        pm.Normal("y", mu + tau * eta, SIGMA, observed=Y)
    return m


def main(argv=None):
    rounds = int((argv or sys.argv[1:] or ["10"])[0])
    m = model()
    opts = dict(rounds=rounds, chains=8, systems=2, explorer="mala", progress=False,
                threads=1, figures=False)
    for label, target, ref in (("prior reference", from_pymc(m), "prior"),
                               ("gaussian reference", from_pymc(m, path="temperature"),
                                "gaussian")):
        for seed in (1, 2):
            t0 = time.time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = nrpt.sample(target, reference=ref, seed=seed, **opts)
            s = r.summary
            print(f"{label:19} seed {seed}: log Z {np.round(s['log_normalizer'], 3)} ± "
                  f"{np.round(s['log_normalizer_se'], 3)}, Λ {np.round(s['barrier'], 2)}, "
                  f"round trips {s['round_trips']}, {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
