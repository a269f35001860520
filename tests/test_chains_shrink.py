"""A ladder fitted to the barrier in both directions (``min_chains``; a Stan program's defaults):
between rounds the ladder shrinks where the barrier estimate asks for clearly fewer chains and
grows where it asks for more (:class:`nrpt.adapt.rounds.ChainsAdaptor`,
:func:`nrpt.adapt.chains.fitted_chains`).

Statistical checks at fixed seeds, tolerances from the Monte Carlo error, each with a negative
control: (a) a small known barrier shrinks and the moments and log Z still match the exact ones
(the same checks fail with the shrink disabled, with a wrong shrunk ladder, and against an
answer off by the tolerance); (b) a large barrier does not shrink; (c) an interrupted, resumed
run equals the uninterrupted one."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import nrpt
from nrpt import SamplingWarning
from nrpt.adapt.chains import fitted_chains, ladder_too_long, ladder_too_short, pairs_too_hard
from nrpt.diagnostics.roundtrips import RoundTripTracker
from nrpt.roles import SlotMap
from nrpt.run.api import run_config
from nrpt.run.config import RunConfig

#: |z| bound of the statistical checks (several coordinates / systems per check)
Z = 4.5


class TwoBumps:
    """``0.3 N((-1.5, 0), I) + 0.7 N((1.5, 0), I)`` with ``U = -log p + 1.5``: exact mean
    ``(0.6, 0)``, sd ``(1.7, 1)``, ``log Z = -1.5``.  Against a Gaussian reference fitted to
    it the barrier is small (Λ̂ ≈ 0.3)."""

    name = "two-bumps"
    dim = 2

    def energy(self, x):
        m = torch.tensor([1.5, 0.0], dtype=x.dtype)
        la = math.log(0.3) - 0.5 * ((x + m) ** 2).sum(-1)
        lb = math.log(0.7) - 0.5 * ((x - m) ** 2).sum(-1)
        return -(torch.logaddexp(la, lb) - math.log(2 * math.pi)) + 1.5

    def initial_states(self, n, generator, dtype=torch.float64):
        return 4.0 * torch.rand(n, self.dim, generator=generator, dtype=dtype) - 2.0


#: the exact answer: mean, sd, log Z
MEAN, SD, LOG_Z = np.array([0.6, 0.0]), np.array([math.sqrt(1.0 + 2.25 - 0.36), 1.0]), -1.5

OPTS = dict(rounds=9, chains="auto", min_chains=2, systems=4, explorer="mala",
            precondition="auto", reference="gaussian", figures=False, seed=0)


def run(target=None, **over):
    target = target or TwoBumps()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        return run_config(RunConfig(target=target.name, **{**OPTS, **over}), target=target)


def failures(res, mean, sd, log_z) -> list[str]:
    """What disagrees with the exact answer: slot-0 means and sds beyond ``Z`` Monte Carlo
    errors (sd / sqrt(ESS); sd / sqrt(2 ESS) for the sd), and each system's log Z beyond ``Z``
    of its reported error."""
    s0 = res.summary["slot0"]
    m, s, ess = (np.asarray(s0[k], dtype=float) for k in ("mean", "sd", "ess_bulk"))
    ess = np.maximum(ess, 1.0)
    out = []
    zm = np.abs(m - mean) / (s / np.sqrt(ess))
    zs = np.abs(s - sd) / (s / np.sqrt(2 * ess))
    lz = np.asarray(res.summary["log_normalizer"], dtype=float)
    se = np.asarray(res.summary["log_normalizer_se"], dtype=float)
    zl = np.abs(lz - log_z) / se
    for what, z in (("mean", zm), ("sd", zs), ("log Z", zl)):
        if not np.all(z < Z):
            out.append(f"{what} |z| {np.round(z, 2).tolist()}")
    return out


def shrank(res) -> bool:
    s = res.summary
    return bool(s.get("chains_shrunk")) and s["chains"] <= 3 and s["chains"] == len(s["schedule"])


def test_the_fit_and_its_margins():
    # about 1 + 2 Lambda chains, each equalized pair rejecting at most 1/2
    assert [fitted_chains(x) for x in (0.0, 0.35, 0.5, 0.6, 3.0)] == [2, 2, 2, 3, 7]
    assert fitted_chains(0.35, min_chains=3) == 3
    assert ladder_too_long(0.35, 8) and ladder_too_long(0.35, 3)  # 3 >= 1.25 x 2
    assert not ladder_too_long(0.35, 2) and not ladder_too_long(3.0, 8)  # 8 < 1.25 x 7
    # a 2-chain ladder whose one pair rejects 0.9: the old rule cannot see it, the pair rule can
    assert not ladder_too_short(0.9, 2) and pairs_too_hard(0.9, 2)
    assert not pairs_too_hard(0.5, 2)  # (the fit's own 1/2: no growth right after a shrink)


def test_slot_map_shrink_keeps_the_ends_and_folds_the_rest():
    m = SlotMap.shrink(8, 3)
    assert m.shrinks and m.source == (0, 4, 7) and m.added == ()
    assert m.primary == (0, 0, 0, 1, 1, 1, 2, 2)  # each old slot onto its nearest kept one (a
    # tie: the lower)
    with pytest.raises(ValueError, match="at least 2"):
        SlotMap.shrink(8, 1)
    with pytest.raises(ValueError, match="fewer"):
        SlotMap.shrink(3, 3)


def test_round_trip_totals_survive_a_shrink():
    t = RoundTripTracker(torch.arange(4).expand(2, 4).clone(), 4)
    for s in ([3, 2, 1, 0], [0, 1, 2, 3], [3, 2, 1, 0], [0, 1, 2, 3]):
        t.update(torch.tensor([s, s]))
    before = (t.restarts.clone(), t.round_trips.clone())
    assert int(before[0].sum()) > 0
    t.shrink([(0, 1), (2, 1)], (0, 0, 1, 1))  # (replicas 1 and 2 never restarted)
    assert torch.equal(t.restarts, before[0]) and torch.equal(t.round_trips, before[1])
    assert t.per_replica()["restarts"].shape == (2, 2)
    # negative control: the kept replicas' own counts are fewer than the totals
    assert int(t.per_replica()["restarts"].sum()) < int(before[0].sum())
    again = RoundTripTracker(torch.arange(2).expand(2, 2).clone(), 2)
    again.load_state_dict(t.state_dict())  # (the dropped counts are checkpointed)
    assert torch.equal(again.restarts, before[0])


def test_a_small_barrier_shrinks_and_the_answer_stays_exact():
    """Λ̂ ≈ 0.3 against the fitted Gaussian: from 8 chains the ladder shrinks to 2 and the
    slot-0 moments and every system's log Z agree with the exact values.  Negative controls:
    with the shrink disabled (no min_chains) the ladder keeps 8 chains (the shrink check
    fails), and the same tolerance rejects an answer off by it (moments shifted by 5 Monte Carlo
    errors, log Z by 5 of its errors)."""
    t = TwoBumps()
    res = run(t)
    assert shrank(res), res.summary.get("chains_shrunk")
    assert all(g["round"] >= 4 for g in res.summary["chains_shrunk"])  # (>= 16 iterations)
    assert np.max(res.summary["barrier"]) < 1.0
    assert failures(res, MEAN, SD, LOG_Z) == []
    assert "shrank 8 -> " in nrpt.report.summary.grown_text(res.summary)
    # the tolerance can fail: the same run against answers off by 5 errors
    s0 = res.summary["slot0"]
    mcse = np.asarray(s0["sd"]) / np.sqrt(np.asarray(s0["ess_bulk"]))
    se = np.max(res.summary["log_normalizer_se"])
    assert failures(res, MEAN + 5 * mcse, SD, LOG_Z)
    assert failures(res, MEAN, SD, LOG_Z + 5 * se)
    # the shrink can fail: without min_chains the ladder keeps its 8 chains
    kept = run(t, min_chains=None)
    assert not shrank(kept) and kept.summary["chains"] == 8


def test_a_wrong_shrunk_ladder_is_caught(monkeypatch):
    """Negative control of the check above: a shrink to a wrong ladder -- its hot end at
    beta = 0.5 instead of the reference's 0 -- gives a log Z that the same check rejects."""
    from nrpt.adapt import rounds

    right = rounds.update_schedule

    def wrong(b, rej, n_slots=None):
        new = right(b, rej, n_slots=n_slots)
        return 0.5 + 0.5 * new if n_slots is not None else new  # (from 1 down to 0.5)

    monkeypatch.setattr(rounds, "update_schedule", wrong)
    bad = run()
    assert shrank(bad) and bad.summary["schedule"][-1] >= 0.5  # (once per shrink)
    assert any(f.startswith("log Z") for f in failures(bad, MEAN, SD, LOG_Z))


def test_a_large_barrier_does_not_shrink():
    """Λ = 20 / sqrt(pi) = 11.3 (a shifted Gaussian from its prior): with min_chains the ladder
    only grows, and the replicas cross it.  Negative control: the same rule at the small
    barrier's Λ̂ shrinks an 8-chain ladder (test above), so "no shrink" here is the barrier's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        res = nrpt.sample("geometric-shifted-gaussian-path", target_options={"dim": 2,
                          "shift": 20.0}, chains="auto", min_chains=2, rounds=9, seed=1,
                          figures=False, progress=False)
    s = res.summary
    assert s["chains_shrunk"] == [] and s["chains_grown"] and s["chains"] >= 14
    assert all(g["to"] > g["from"] for g in s["chains_grown"])
    assert s["barrier"] > 9.0 and s["round_trips"] >= 3
    assert ladder_too_long(0.35, 8) and not ladder_too_long(s["barrier"], s["chains"])


def test_an_interrupted_run_resumes_to_the_same_draws_after_a_shrink(tmp_path):
    """Cut in round 8, after the ladder shrank (rounds 4 and 6), and resumed: the draws, the
    index process and the summary equal the uninterrupted run's."""
    full = run(out=str(tmp_path / "full"), checkpoint_every=100)

    def interrupt(engine):  # (called per chunk) in the middle of round 8 (254..509)
        if engine.k >= 300:
            raise KeyboardInterrupt

    t = TwoBumps()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        part = run_config(RunConfig(target=t.name, **{**OPTS, "out": str(tmp_path / "cut"),
                                                      "checkpoint_every": 100}),
                          target=t, callback=interrupt)
        assert part.summary["interrupted"] and part.summary["chains"] < 8  # it shrank before
        resumed = nrpt.resume(tmp_path / "cut", target=t)
    assert shrank(full) and full.summary["chains"] == resumed.summary["chains"]
    assert np.array_equal(resumed.samples, full.samples)
    assert np.array_equal(resumed.index, full.index)
    assert np.array_equal(np.load(tmp_path / "cut" / "index.npy"), full.index)
    for key in ("chains_shrunk", "chains_grown", "schedule", "step_size", "barrier",
                "log_normalizer", "restarts_total", "round_trips"):
        assert resumed.summary[key] == full.summary[key], key


class Counted(TwoBumps):
    """:class:`TwoBumps` counting the states its energy is evaluated at."""

    def __init__(self):
        self.rows = 0

    def energy(self, x):
        self.rows += int(x.reshape(-1, self.dim).shape[0])
        return super().energy(x)


def test_reference_draws_are_evaluated_as_the_rounds_reach_them(monkeypatch):
    """The Gaussian reference's draws come in blocks of up to 512 iterations, drawn anew after
    every refit; they are evaluated 64 iterations at a time, as the iterations reach them: the
    same draws as evaluating the whole block (bit for bit), at a fraction of the target
    evaluations in short rounds.  Negative control: the whole block at once (the old way)
    evaluates the target at several times as many states."""
    from nrpt.core.engine import PTEngine

    opts = dict(rounds=6, chains=4, min_chains=None)
    lazy = Counted()
    a = run(lazy, **opts)
    monkeypatch.setattr(PTEngine, "REFERENCE_ROWS", 10 ** 6)
    whole = Counted()
    b = run(whole, **opts)
    assert np.array_equal(a.samples, b.samples)
    assert a.summary["log_normalizer"] == b.summary["log_normalizer"]
    assert whole.rows > 3 * lazy.rows, (whole.rows, lazy.rows)
