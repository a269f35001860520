# %% [markdown]
# # A PyMC model you already have, sampled by nrpt
#
# Two models a statistician might already have written in PyMC: a two-component mixture whose
# posterior has two label-switched modes, and the eight-schools hierarchical model.  For each we
#
# 1. hand the `pm.Model` to nrpt (`nrpt.targets.from_pymc`): the prior is the reference, sampled
#    exactly, and the path tempers the likelihood on the model's unconstrained space;
# 2. read the run's `posterior.nc` with ArviZ, in the model's own variables (`az.summary`,
#    `az.plot_trace`);
# 3. look at the barrier plot that nrpt wrote;
# 4. compare nrpt's log Z with PyMC's SMC estimate and with the exact value (both models have
#    one: `benchmarks/pymc_models.py`), and NUTS's trace of the mixture, which stays in one mode.
#
# Run it with `python docs/examples/pymc_workflow.py [OUT]` (a few minutes on one core; the
# figures and tables go to `OUT`, default `runs/pymc-workflow`).  Needs `pip install nrpt[pymc]`.

# %%
import sys
import warnings
from pathlib import Path

import arviz as az
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402

import nrpt  # noqa: E402
from nrpt.targets import from_pymc  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pymc_models  # noqa: E402  (the two models below, with their exact log Z)

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/pymc-workflow")
OUT.mkdir(parents=True, exist_ok=True)
warnings.filterwarnings("ignore", category=FutureWarning)

# %% [markdown]
# ## The models, as a user would have them
#
# `mixture`: y_i ~ ½ N(mu_0, 1) + ½ N(mu_1, 1), mu_k ~ N(0, 5²).  Swapping the labels leaves the
# posterior unchanged, so it has two modes, (−2, 2) and (2, −2).
#
# `hierarchical`: the eight schools, non-centred (mu, tau > 0, eta[school], theta = mu + tau eta).

# %%
mixture, mixture_log_z, _ = pymc_models.mixture()
schools, schools_log_z, _ = pymc_models.hierarchical()
print(mixture.str_repr())
print(schools.str_repr())

# %% [markdown]
# ## nrpt on the PyMC models
#
# Adaptive NRPT: 10 rounds of doubling length (2046 iterations), 8 slots, 4 independent PT systems
# (the 4 chains of the ArviZ output), MALA as the explorer (PyTensor gives the gradients).  The
# eight schools also get the variational reference: a second leg of 8 slots annealed from a
# Gaussian fitted to the posterior between rounds, joined to the prior leg at the target.  The
# run folders hold `posterior.nc`, `summary.json`, and the figures, among them
# `local_barrier.png` (the local barrier lambda(beta)) and `schedules.png`.

# %%
runs = {"mixture": (mixture, "prior", "log_normalizer"),
        "hierarchical": (schools, "variational", "log_normalizer_variational_leg")}
results = {}
for name, (model, reference, key) in runs.items():
    res = nrpt.sample(from_pymc(model), rounds=10, chains=8, systems=4, explorer="mala",
                      reference=reference, seed=1, out=OUT / name, overwrite=True)
    results[name] = float(np.mean(res.summary[key]))
    legs = ("_prior_leg", "_variational_leg") if reference != "prior" else ("",)
    barriers = ", ".join(f"barrier{leg} {np.round(res.summary['barrier' + leg], 2)}"
                         for leg in legs)
    print(f"{name} ({reference} reference): log Z = {results[name]:.3f} (mean of 4 systems); "
          f"{barriers}")
    print("  figures:", ", ".join(res.summary.get("figures") or []))

# %% [markdown]
# ## The posterior in the model's variables

# %%
idata = az.from_netcdf(OUT / "mixture" / "posterior.nc")
print(az.summary(idata, kind="stats"))
az.plot_trace(idata, var_names=["mu"])
plt.savefig(OUT / "mixture_trace_nrpt.png", dpi=80)
plt.close("all")

idata_schools = az.from_netcdf(OUT / "hierarchical" / "posterior.nc")
print(az.summary(idata_schools, var_names=["mu", "tau", "theta"]))

# %% [markdown]
# ## log Z beside PyMC's SMC, and NUTS on the mixture

# %%
rows = []
for name, model, exact in (("mixture", mixture, mixture_log_z),
                           ("hierarchical", schools, schools_log_z)):
    with model:
        smc = pm.sample_smc(draws=2000, chains=4, cores=1, random_seed=1, progressbar=False,
                            compute_convergence_checks=False)
    lml = smc.sample_stats["log_marginal_likelihood"].values
    smc_log_z = [float(np.asarray(c[-1] if np.ndim(c) else c, dtype=float)) for c in lml[:, -1]]
    rows.append((name, exact, results[name], float(np.mean(smc_log_z))))
print(f"{'model':<14}{'exact':>10}{'nrpt':>10}{'SMC':>10}")
for name, exact, ours, theirs in rows:
    print(f"{name:<14}{exact:>10.3f}{ours:>10.3f}{theirs:>10.3f}")

with mixture:
    nuts = pm.sample(draws=1000, tune=1000, chains=2, cores=1, random_seed=1,
                     progressbar=False, compute_convergence_checks=False)
az.plot_trace(nuts, var_names=["mu"])
plt.savefig(OUT / "mixture_trace_nuts.png", dpi=80)
plt.close("all")
# each NUTS chain stays in the mode it started in: the sign of mu_0 never changes within a chain
signs = np.sign(nuts.posterior["mu"].values[..., 0])
print("NUTS chains that visited both modes:", int((np.abs(signs.mean(axis=1)) < 1).sum()),
      "of", signs.shape[0])
ours = np.sign(idata.posterior["mu"].values[..., 0])
print("nrpt chains that visited both modes:", int((np.abs(ours.mean(axis=1)) < 1).sum()),
      "of", ours.shape[0])
