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
