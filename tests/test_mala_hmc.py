"""Explorer ``mala-hmc`` (:class:`nrpt.explorers.metropolis.MALAThenHMC`): MALA until slot 0's
``tail-acceptance`` check fires at the end of a round, then HMC without a metric
(:meth:`nrpt.adapt.metric.MetricAdaptor._switch`).  Why: gp_pois_regr's funnel
(docs/gaussian_reference.md).

* Each of its two kernels leaves the target invariant (:func:`nrpt.testing.check_invariance`,
  with the dense metric before the switch, without one after); negative control: the same
  check flags an HMC whose kinetic energy does not match its momentum.
* Where the check never fires it is MALA draw for draw (the Stan defaults' draws are kept);
  where it fires the draws part (negative control of the equality).
* A run interrupted before or after the switch resumes to the uninterrupted run's draws.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_precondition import METRICS, SCALED, HMCWrongKinetic
from test_tail_acceptance import Funnel

import nrpt
from nrpt.explorers.metropolis import MALAThenHMC
from nrpt.run.api import run_config
from nrpt.run.config import RunConfig
from nrpt.testing import check_invariance


@pytest.mark.parametrize("switched", [False, True])
def test_both_kernels_are_invariant(switched):
    ex = MALAThenHMC(leapfrog_steps=5)
    ex.switched = switched
    # before the switch: MALA with the dense metric; after: HMC with none (the identity)
    metric, h = (None, 0.03) if switched else (METRICS["dense"], 0.9)
    report = check_invariance(ex, SCALED, step_size=h, n_steps=300, seed=2, cross=True,
                              metric=metric)
    assert report.ok, str(report)
    assert report.moved > 0.2


def test_the_switched_check_flags_a_wrong_hmc():
    """Negative control: the same check with a broken HMC behind the switch fails."""
    ex = MALAThenHMC(leapfrog_steps=5)
    ex.hmc, ex.switched = HMCWrongKinetic(leapfrog_steps=5), True
    report = check_invariance(ex, SCALED, step_size=0.3, n_steps=300, seed=2, cross=True,
                              systems=32, metric=METRICS["dense"])
    assert not report.ok and report.moved_enough, str(report)


# Neal's funnel with a wide neck (v ~ N(0, 2^2)), the Stan defaults' path (Gaussian reference,
# Laplace start, dense metric), rounds 8: seed 3's tail-acceptance fires at the end of round 7,
# seed 1's never does (measured; ~1-3 s each)
OPTS = dict(rounds=8, chains=6, systems=2, precondition="auto", reference="gaussian",
            figures=False)


def _run(seed, explorer="mala-hmc"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_config(RunConfig(target="funnel", seed=seed, explorer=explorer, **OPTS),
                          target=Funnel(sv=2.0))


def test_without_the_evidence_it_is_mala_draw_for_draw():
    a, b = _run(1), _run(1, explorer="mala")
    assert a.summary.get("explorer_switched") is None
    assert np.array_equal(a.samples, b.samples)
    # negative control: where the check fires, the draws after the switch differ
    c, d = _run(3), _run(3, explorer="mala")
    assert "after round 7" in c.summary["explorer_switched"]
    assert not np.array_equal(c.samples, d.samples)
    # after the switch the explorer check reads HMC's target (its steps were tuned to it);
    # MALA's run keeps MALA's (the control)
    said = [w for w in c.summary["warnings"] if "acceptance is" in w]
    assert said and all("for a target of 0.65" in w for w in said), said
    assert not any("for a target of 0.65" in w for w in d.summary.get("warnings", []))


@pytest.mark.parametrize("stop", [200, 300])
def test_resume_across_the_switch_is_exact(tmp_path, stop):
    """Stopped in round 7 (before the switch, iterations 126..253) or round 8 (after it,
    254..509): the checkpoint carries the switch, the resumed run equals the whole one."""
    def run(out, **kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run_config(RunConfig(target="funnel", seed=3, explorer="mala-hmc",
                                        out=str(out), checkpoint_every=64, **OPTS),
                              target=Funnel(sv=2.0), **kw)

    full = run(tmp_path / "full")

    def interrupt(engine):
        if engine.k >= stop:
            raise KeyboardInterrupt

    part = run(tmp_path / "cut", callback=interrupt)
    assert part.summary["interrupted"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = nrpt.resume(tmp_path / "cut", target=Funnel(sv=2.0))
    assert "after round 7" in full.summary["explorer_switched"]
    # (the note is said every round from the switch on: a run resumed after it says it too)
    assert resumed.summary.get("explorer_switched") == full.summary["explorer_switched"]
    assert np.array_equal(resumed.samples, full.samples)
    # negative control: the comparison sees a run that never switched (MALA throughout)
    assert not np.array_equal(_run(3, explorer="mala").samples, full.samples)


def test_registered_with_its_options():
    from nrpt.run import registry

    e = registry.entry("explorer", "mala-hmc")
    assert {"step_size", "leapfrog_steps", "precondition"} <= set(e.options)
    assert registry.make_explorer("mala-hmc", leapfrog_steps=3).hmc.leapfrog_steps == 3


def test_rounds_without_a_preconditioner_are_refused():
    """The switch is the preconditioner's adaptor's: rounds with ``precondition = "none"``
    would be MALA throughout, so they are refused with the fix; control: ``"auto"`` builds."""
    opts = dict(target="funnel", seed=0, explorer="mala-hmc", rounds=2, chains=3, figures=False)
    with pytest.raises(ValueError, match="precondition 'auto', 'diagonal' or 'dense'"):
        run_config(RunConfig(precondition="none", **opts), target=Funnel())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_config(RunConfig(precondition="auto", **opts), target=Funnel())
    assert np.isfinite(res.samples).all()  # (it built and ran)


def _tail_stats(n, a0, n_tail, a_tail, entries=5, d=8, c=7):
    """``TailAcceptance.stats()``-shaped statistics: ``n`` slot-0 steps accepting ``a0``, and
    coordinate ``c``'s lower tail holding ``n_tail`` of them, accepting ``a_tail``."""
    nan = np.full(d, np.nan)
    n_lo, a_lo, e_lo = np.zeros(d), nan.copy(), np.zeros(d)
    n_lo[c], a_lo[c], e_lo[c] = n_tail, a_tail, entries
    return {"n": float(n), "acceptance": a0, "k": 2.0, "n_hi": np.zeros(d), "n_lo": n_lo,
            "entries_hi": np.zeros(d), "entries_lo": e_lo, "acceptance_hi": nan,
            "acceptance_lo": a_lo}


def test_the_switch_needs_a_significant_deficit():
    """The switch (``metric._neck``) reads the ratio check and, besides, the binomial evidence
    of the tail's deficit (``NECK_MAX_P``).  Measured cases (rounds 10, 4 systems): mesquite
    seed 1's round 6 -- one tail of 14 draws accepting 0.067 against 0.324 -- fires the
    summary's ratio check but not the switch (it switched there before, falsely);
    gp_pois_regr seed 2's round 6 -- 69 draws accepting 0.136 against 0.507 -- fires both.
    Negative control: mesquite's tail with 10x its draws at the same acceptances switches."""
    from types import SimpleNamespace

    from nrpt.adapt import metric
    from nrpt.report import health

    def neck(stats):
        rec = SimpleNamespace(stats=lambda: stats)
        return metric._neck(SimpleNamespace(recorders={"tail_acceptance": rec}))

    mesquite = _tail_stats(256, 0.324, 14, 0.067)
    gp = _tail_stats(256, 0.507, 69, 0.136, entries=7, d=13, c=1)
    assert health.check_tails(mesquite) and health.check_tails(gp)
    assert not neck(mesquite)
    assert neck(gp)
    assert neck(_tail_stats(2560, 0.324, 140, 0.067))  # negative control
    # the floor of steps still holds: gp's tail on 64 steps does not switch
    assert not neck(_tail_stats(64, 0.507, 17, 0.136, entries=7, d=13, c=1))


def test_tail_deficit_p_is_the_binomial_tail_and_a_valid_level():
    """At whole counts :func:`health.tail_deficit_p` is the binomial CDF (known answer,
    scipy.stats.binom); fed tails that accept like the chain (independent Bernoulli(0.4),
    20 draws, 20000 replicates) it falls below 0.02 at most 2 % of the time (plus 4 Monte-Carlo
    sd).  Negative control: tails accepting 0.1 fall below it in most replicates."""
    from scipy import stats

    from nrpt.report import health

    n = np.array([14.0, 20.0, 69.0, 5.0])
    k = np.array([1.0, 3.0, 9.0, 0.0])
    p0 = 0.4
    np.testing.assert_allclose(health.tail_deficit_p(k / n, n, p0), stats.binom.cdf(k, n, p0),
                               rtol=1e-10)
    assert health.tail_deficit_p(0.5, 20.0, p0) == 1.0  # no deficit
    assert health.tail_deficit_p(np.nan, 0.0, p0) == 1.0  # no draws
    rng = np.random.default_rng(5)
    null = rng.binomial(20, p0, size=20000) / 20.0
    rate = float((health.tail_deficit_p(null, 20.0, p0) < 0.02).mean())
    assert rate <= 0.02 + 4 * np.sqrt(0.02 * 0.98 / 20000), rate
    low = rng.binomial(20, 0.1, size=2000) / 20.0
    assert float((health.tail_deficit_p(low, 20.0, p0) < 0.02).mean()) > 0.8


def test_the_switch_hands_hmc_a_step_from_malas():
    """At the switch (:meth:`MetricAdaptor._switch`) each slot's MALA step ``h`` (whitened)
    becomes HMC's ``HMC_FROM_MALA h^(3/2)`` times the shortest old unit step in x (the
    smallest sd of a diagonal metric, here 0.01); the tuner then aims at HMC's target and
    order, and moves acceptance ~0 by 10x in the first HMC round only.  Known answers by
    hand; negative control: the rule before (the longest sd to the power 1/2, on MALA's
    step) hands a step ~170x larger (measured on gp_pois_regr: acceptance 0 at every slot
    for the next 2-3 rounds)."""
    from types import SimpleNamespace

    import torch

    from nrpt.adapt.metric import MetricAdaptor
    from nrpt.adapt.rounds import HMC_FROM_MALA, StepSizeAdaptor
    from nrpt.explorers.metropolis import HMC

    ex = MALAThenHMC()
    ma = MetricAdaptor("diagonal", switch=ex)
    sd = torch.tensor([0.01, 1.0, 3.0], dtype=torch.float64)
    h = torch.tensor([[0.3, 0.5]], dtype=torch.float64)  # one system, two slots
    acc = torch.tensor([[0.574, 0.574]], dtype=torch.float64)  # at MALA's target
    view = SimpleNamespace(index=4, last=False, name="round", step_size=h,
                           metric=sd.expand(1, 2, 3).clone(),
                           recorders={"swaps": SimpleNamespace(
                               explorer_acceptance=lambda: acc)})
    up = ma._switch(view)
    assert ex.switched and torch.equal(up.metric, torch.ones(1, 2, 3, dtype=torch.float64))
    np.testing.assert_allclose(ma.changed[1].numpy(), 0.01)
    sa = StepSizeAdaptor(ex)
    sa.metric_from = ma
    new = sa.end_segment(view).step_size.numpy()
    np.testing.assert_allclose(new, HMC_FROM_MALA * np.array([[0.3, 0.5]]) ** 1.5 * 0.01,
                               rtol=1e-12)
    assert (sa.target, sa.order) == (HMC.target_acceptance, HMC.acceptance_order)
    old_rule = np.array([[0.3, 0.5]]) * np.sqrt(3.0)  # negative control
    assert (old_rule / new > 100).all()
    # the first HMC round: acceptance 0 -> 10x down, 1 -> 10x up; the next round: the model's
    view2 = SimpleNamespace(index=5, last=False, name="round",
                            step_size=torch.as_tensor(new),
                            recorders={"swaps": SimpleNamespace(explorer_acceptance=lambda:
                                       torch.tensor([[0.0, 1.0]], dtype=torch.float64))})
    new2 = sa.end_segment(view2).step_size.numpy()
    np.testing.assert_allclose(new2, new * np.array([[0.1, 10.0]]), rtol=1e-12)
    view3 = SimpleNamespace(index=6, last=False, name="round",
                            step_size=torch.tensor([[1e-3, 1e-3]], dtype=torch.float64),
                            recorders={"swaps": SimpleNamespace(explorer_acceptance=lambda:
                                       torch.tensor([[0.3, 0.3]], dtype=torch.float64))})
    f = sa.end_segment(view3).step_size.numpy() / 1e-3
    assert (f > 0.4).all() and (f < 1.0).all()  # (not 10x: fast was the first round's only)
    # the checkpoint carries HMC's target and order
    sb = StepSizeAdaptor(MALAThenHMC())
    sb.load_state_dict(sa.state_dict())
    assert (sb.target, sb.order, sb.hmc_fast) == (sa.target, sa.order, False)
