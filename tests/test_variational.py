"""The variational reference (issue 11, item 3; :mod:`nrpt.paths.variational`).

Statistical checks with fixed seeds on conjugate Gaussians whose posterior sits far from the
prior (exact mean, covariance and log Z), tolerances from the Monte Carlo error, and negative
controls: a deliberately bad q must leave the stabilized run correct, and the comparisons
must be able to fail."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt.paths import variational as va
from nrpt.roles import Update
from nrpt.run.api import run_config
from nrpt.run.config import RunConfig


class ConjugateGaussian:
    """Prior N(0, I_d); log-likelihood -(x - y)^T A (x - y) / 2 with A = c * C^-1, C the
    equicorrelation matrix of correlation ``rho``; ``y = shift * (1, ..., 1) / sqrt(d)``.
    Posterior N(mu, S) with S = (I + A)^-1, mu = S A y; Z = (2 pi)^(d/2) |A|^(-1/2)
    N(y; 0, I + A^-1)."""

    reference_is_normalized = True

    def __init__(self, dim=3, rho=0.0, c=4.0, shift=6.0, name="conjugate-gaussian"):
        self.dim, self.name = dim, name
        C = (1 - rho) * torch.eye(dim, dtype=torch.float64) + rho
        self.A = c * torch.linalg.inv(C)
        self.y = torch.full((dim,), shift / math.sqrt(dim), dtype=torch.float64)
        eye = torch.eye(dim, dtype=torch.float64)
        self.cov = torch.linalg.inv(eye + self.A)
        self.mean = self.cov @ self.A @ self.y
        marg = torch.distributions.MultivariateNormal(torch.zeros(dim, dtype=torch.float64),
                                                      eye + torch.linalg.inv(self.A))
        self.log_normalizer = float(0.5 * dim * math.log(2 * math.pi)
                                    - 0.5 * torch.logdet(self.A) + marg.log_prob(self.y))

    def log_likelihood(self, x):
        r = x - self.y.to(x)
        return -0.5 * ((r @ self.A.to(x)) * r).sum(-1)

    def reference_log_prob(self, x):
        return -0.5 * (x * x).sum(-1) - 0.5 * self.dim * math.log(2 * math.pi)

    def reference_sample(self, n, generator):
        return torch.randn(n, self.dim, generator=generator, dtype=torch.float64)


OPTS = dict(rounds=10, chains=8, explorer="rwmh", figures=False)


def run(target, **over):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs: ESS warnings are not under test
        return nrpt.sample(target, **{**OPTS, **over})


@pytest.fixture(scope="module")
def far():
    """A 3-D posterior some 5 prior sds from the prior, 4 systems, full-rank q."""
    t = ConjugateGaussian(dim=3, rho=0.5, shift=8.0)
    return t, run(t, reference="variational", systems=4, seed=3)


def test_q_recovers_the_posterior_and_the_variational_leg_has_no_barrier(far):
    t, res = far
    s = res.summary
    mean, cov = np.array(s["variational_mean"]), np.array(s["variational_cov"])  # [4, d(, d)]
    sd = t.cov.diagonal().sqrt().numpy()
    # q is fitted to the 2 x 256 pooled slot-0 draws of round 9: the error of a mean is about
    # sd / sqrt(ESS); ESS >= 50 is conservative for rwmh here -> 5 MC errors = 0.7 sd
    assert np.all(np.abs(mean - t.mean.numpy()) < 0.7 * sd)
    corr = cov / np.outer(sd, sd)
    exact = (t.cov / torch.outer(t.cov.diagonal().sqrt(), t.cov.diagonal().sqrt())).numpy()
    assert np.all(np.abs(corr - exact) < 0.4)  # sd of a covariance ~ sqrt(2 / ESS) = 0.2
    prior, var = np.array(s["barrier_prior_leg"]), np.array(s["barrier_variational_leg"])
    assert prior.mean() > 2.0  # the prior is far away: a real barrier
    assert var.mean() < 0.3 and var.mean() < 0.1 * prior.mean()
    assert np.all(np.array(s["variational_refits"]) >= 8)  # round 1 has too few draws
    # the bridge ran on every odd iteration (pair (0, 1) resting under DEO)
    assert s["bridges"] == 4 * (s["n_iterations"] // 2)  # (counted over the 4 systems)


def test_both_legs_estimate_log_z(far):
    t, res = far
    s = res.summary
    for leg in ("prior", "variational"):
        est = np.array(s[f"log_normalizer_{leg}_leg"])
        err = est.std(ddof=1) / math.sqrt(len(est))
        # 4 MC errors, plus a floor for the rare seed whose systems happen to agree closely
        assert abs(est.mean() - t.log_normalizer) < 4 * err + 0.05, (leg, est)
    var = np.array(s["log_normalizer_variational_leg"])
    assert var.std() < np.array(s["log_normalizer_prior_leg"]).std() + 0.05
    # each leg's halves agree within their errors, and so do the legs: no log Z warning
    assert not [w for w in s["warnings"] if "log Z" in w]
    assert np.all(np.abs(s["log_normalizer_legs_z"]) < 4)


def test_target_moments_of_the_samples(far):
    t, res = far
    x = res.samples  # [R, n, d]: the prior leg's slot 0 of each system
    assert x.shape == (4, 1024, 3)
    sd = t.cov.diagonal().sqrt().numpy()
    assert np.all(np.abs(x.mean((0, 1)) - t.mean.numpy()) < 0.25 * sd)


def test_a_bad_q_leaves_the_stabilized_run_correct(monkeypatch):
    """Negative control: q forced to a narrow Gaussian far from the posterior."""
    t = ConjugateGaussian(dim=3, rho=0.5, shift=8.0)

    def bad(self, view):
        if view.last:
            return None
        R = view.schedule.shape[0] // 2
        q = va.GaussianReference(torch.full((R, 3), -20.0, dtype=torch.float64),
                                 0.05 * torch.eye(3, dtype=torch.float64).expand(R, 3, 3))
        return Update(reference=(q, torch.ones(R, dtype=torch.bool)))

    monkeypatch.setattr(va.VariationalRefit, "end_segment", bad)
    res = run(t, reference="variational", systems=4, seed=3)
    s = res.summary
    assert np.array(s["barrier_variational_leg"]).mean() > 5  # the leg is useless ...
    sd = t.cov.diagonal().sqrt().numpy()
    x = res.samples
    assert np.all(np.abs(x.mean((0, 1)) - t.mean.numpy()) < 0.25 * sd)  # ... the target is not
    assert np.all(np.abs(x.std((0, 1)) / sd - 1) < 0.25)
    est = np.array(s["log_normalizer_prior_leg"])
    assert abs(est.mean() - t.log_normalizer) < 4 * est.std(ddof=1) / 2 + 0.05
    # the bad q really was in use: the variational leg's hot end sits at -20
    assert np.allclose(s["variational_mean"], -20.0)
    # issue 21: its log Z is nonsense (halves of -2000 and +50000), and the run says so, twice
    # (the halves of -2000 and +50000 are shown beside the overlap warning, no longer alone)
    assert any("overlap too little for the log Z bridge" in w and "variational leg" in w
               and "stepping-stone halves" in w for w in s["warnings"])
    assert any("two legs' log Z disagree" in w for w in s["warnings"])


def test_full_rank_beats_mean_field_on_a_correlated_target():
    t = ConjugateGaussian(dim=4, rho=0.95, c=4.0, shift=6.0)
    full = run(t, reference="variational", systems=2, seed=4, rounds=9)
    mf = run(t, reference="variational-meanfield", systems=2, seed=4, rounds=9)
    b_full = np.mean(full.summary["barrier_variational_leg"])
    b_mf = np.mean(mf.summary["barrier_variational_leg"])
    assert b_full < 0.5 * b_mf, (b_full, b_mf)
    chol_mf = mf.engine.q.chol
    assert torch.all(chol_mf[:, 0, 1:] == 0)  # mean-field: a diagonal q
    assert "variational_cov" not in mf.summary  # ... reported by its variances alone
    assert np.allclose(mf.summary["variational_var"], (chol_mf ** 2).sum(-1).numpy())


def test_resume_mid_round_is_bit_for_bit(tmp_path):
    t = ConjugateGaussian(dim=2, rho=0.3, shift=5.0)
    opts = dict(rounds=8, chains=5, seed=9, explorer="mala", reference="variational",
                figures=False, checkpoint_every=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = run_config(RunConfig(target=t.name, out=str(tmp_path / "full"), **opts), target=t)

        def interrupt(engine):  # iteration 256 is in the middle of round 8 (255..510)
            if engine.k == 256:
                raise KeyboardInterrupt

        part = run_config(RunConfig(target=t.name, out=str(tmp_path / "cut"), **opts),
                          target=t, callback=interrupt)
        assert part.summary["interrupted"] and part.summary["n_iterations"] == 256
        resumed = nrpt.resume(tmp_path / "cut", target=t)
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.energies, full.energies)
    assert np.array_equal(resumed.index, full.index)
    for key in ("variational_mean", "variational_cov", "barrier_variational_leg",
                "log_normalizer_variational_leg", "log_normalizer", "schedule_variational_leg",
                "bridges", "restarts"):
        assert resumed.summary[key] == full.summary[key], key
    # negative control: the comparison sees a different seed
    other = run_config(RunConfig(target=t.name, **{**opts, "seed": 10}), target=t)
    assert not np.array_equal(other.samples, full.samples)


@pytest.mark.parametrize("over, message", [
    (dict(reference="bogus"), "reference must be one of prior, variational"),
    (dict(reference="variational", rounds=None, iterations=100), "needs rounds"),
    (dict(reference="variational", explorer="sgld", rounds=None, iterations=100),
     "reference 'variational'"),
    (dict(reference="variational-meanfield", compile=True), "compile"),
    (dict(reference="variational", scheme="adj"), "use scheme 'deo', 'deo-w', 'seo'"),
])
def test_bad_settings_are_refused(over, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(target="geometric-gaussian-path", **{**OPTS, **over})


def test_an_energy_target_or_a_ladder_short_of_the_prior_is_refused():
    with pytest.raises(ValueError, match="needs a geometric target"):
        run("twenty-five-modes", reference="variational", rounds=2)
    t = ConjugateGaussian()
    with pytest.raises(ValueError, match="betas ending at 0"):
        run(t, reference="variational", rounds=2, chains=3, betas=[1.0, 0.5, 0.1],
            adapt_schedule=False)


def test_a_plain_run_has_no_reference_to_change():
    t = ConjugateGaussian()
    res = run(t, rounds=3, reference="prior")
    assert type(res.engine).__name__ == "PTEngine" and "barrier_variational_leg" not in \
        res.summary
    with pytest.raises(ValueError, match="reference 'prior'"):
        res.engine.apply(Update(reference=(None, None)))


def test_cli_offers_the_reference_flag(tmp_path, capsys):
    from nrpt.run.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--rounds", "3", "--reference", "bogus", "--out", str(tmp_path / "a")])
    assert "invalid choice" in capsys.readouterr().err


def test_benchmark_runs_end_to_end(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "variational.py"
    spec = importlib.util.spec_from_file_location("bench_variational", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--rounds", "3", "--systems", "2", "--chains", "3", "--n", "40", "--dim", "2",
                 "--explorer", "rwmh"])
    out = capsys.readouterr().out
    assert out.count("variational") >= 2 and "prior" in out


# ------------------------------------------------------------------ one object (issue 22, item 3)
#: names of the two-leg reference's parts; ``[0::2]`` / ``[1::2]`` next to a leg name is the
#: row slicing that only :class:`~nrpt.paths.variational.TwoLeg` may do
_TWO_LEG = r"TwoLeg|fitted_reference|leg_summary|legs_findings|\"legs\"|nrpt\.paths\.variational"
#: who may name it: the object itself; the builder, which makes the run's parts through it; the
#: ``reference`` option's declaration and validation (run/config.py, run/cli.py); the one-leg
#: Gaussian reference of density-only targets, which reuses the fitted-Gaussian machinery
#: (GaussianReference, fit_gaussian, TargetMoments), not the legs
_MAY_NAME = {"paths/variational.py", "paths/gaussian_reference.py", "run/build.py",
             "run/config.py", "run/cli.py"}


def _naming_two_leg(files: dict[str, str]) -> list[str]:
    import re

    return sorted(name for name, text in files.items()
                  if name not in _MAY_NAME and re.search(_TWO_LEG, text))


def test_the_two_leg_reference_is_one_object():
    """No module but the object (and its builder and option) names the two-leg reference or its
    row layout; the outputs ask the run's ``row_map`` (a :class:`nrpt.roles.RowMap`)."""
    from pathlib import Path

    from nrpt.roles import RowMap

    root = Path(nrpt.__file__).parent
    files = {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*.py")}
    assert _naming_two_leg(files) == []
    # negative control: the check sees a module that slices the legs itself
    planted = {**files, "report/summary.py": files["report/summary.py"] +
               "\nfrom nrpt.paths.variational import leg_summary\n"}
    assert _naming_two_leg(planted) == ["report/summary.py"]
    res = run(ConjugateGaussian(), reference="variational", systems=2, rounds=3)
    row_map = res.export["row_map"]
    assert isinstance(row_map, RowMap) and isinstance(row_map, va.TwoLeg)
    assert res.samples.shape[0] == 2 and res.index.shape[1] == 2  # the user's systems
    assert res.summary["engine_systems"] == 4 and "legs " in str(res)
