"""The slice explorer: the batched sweep against a plain per-replica loop (float64, same keyed
uniforms), invariance of every explorer's slot distribution from an exact start (KS tests with
negative controls), and the slice explorer inside PT.

Invariance design: N independent replicas start at exact draws of the slot distribution and
take a few explorer steps; an invariant kernel leaves them exactly distributed, independently
(every replica has its own keyed uniforms), so the Kolmogorov-Smirnov p-value is uniform.  A
correct kernel fails ``p > 1e-3`` with probability 1e-3 per check (seeds are fixed anyway); a
negative control (a kernel with a deliberate bug) must give ``p < 1e-6``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import nrpt
from nrpt.explorers import Density, Noise, ReplicaState, SliceSampler
from nrpt.explorers.slice import SHRINK0, _Uniforms, slot_log_density
from nrpt.paths.ladders import GeometricPath, TemperatureLadder
from nrpt.run.registry import make_explorer
from nrpt.targets import Gaussian, bimodal_1d
from nrpt.targets.gaussian_path import ScaledGaussianPath

P_OK = 1e-3
P_BAD = 1e-6


class HalfNormal:
    """N(0, 1) restricted to x > 0 (energy +inf elsewhere): a target with a hard boundary."""

    dim = 1
    name = "half-normal"

    def energy(self, x):
        e = 0.5 * x[:, 0] ** 2
        return torch.where(x[:, 0] > 0, e, torch.full_like(e, math.inf))


# ------------------------------------------------------------------ reference implementation
def reference_sweep(explorer: SliceSampler, x, b, w, density, noise):
    """Neal's Figs. 3-6 for one replica at a time, plain Python floats."""
    R, P, d = x.shape
    out = x.clone()
    for s in range(R):
        for r in range(P):
            xs = [float(v) for v in x[s, r]]
            bb, ww = float(b[s, r]), float(w[s, r])

            def f(point, bb=bb):
                v, base = density(torch.tensor([point], dtype=torch.float64))
                return float(slot_log_density(v, base, torch.tensor([bb], dtype=torch.float64)))

            for j in range(d):
                u = _Uniforms(noise, 0, j, torch.float64)
                U = lambda i: float(u(i)[s, r])  # noqa: E731, B023
                D = lambda i: float(u.doubling(i)[s, r])  # noqa: E731, B023
                at = lambda val: xs[:j] + [val] + xs[j + 1:]  # noqa: E731, B023
                x0 = xs[j]
                y = f(xs) + math.log1p(-U(0))
                lo = x0 - ww * U(1)
                hi = lo + ww
                m = explorer.max_steps
                if explorer.method == "stepping-out":
                    J = math.floor(m * U(2))
                    K = m - 1 - J
                    while J > 0 and f(at(lo)) > y:
                        lo, J = lo - ww, J - 1
                    while K > 0 and f(at(hi)) > y:
                        hi, K = hi + ww, K - 1
                else:
                    k = 0
                    while k < m and (y < f(at(lo)) or y < f(at(hi))):
                        if D(k) < 0.5:
                            lo = lo - (hi - lo)
                        else:
                            hi = hi + (hi - lo)
                        k += 1

                def acceptable(x1, lo=lo, hi=hi, x0=x0, y=y, ww=ww, at=at):
                    a, c, differ = lo, hi, False
                    while c - a > 1.1 * ww:
                        mid = 0.5 * (a + c)
                        if (x0 < mid) != (x1 < mid):
                            differ = True
                        if x1 < mid:
                            c = mid
                        else:
                            a = mid
                        if differ and y >= f(at(a)) and y >= f(at(c)):
                            return False
                    return True

                new = x0
                for i in range(explorer.max_shrink):
                    x1 = lo + U(SHRINK0 + i) * (hi - lo)
                    if f(at(x1)) > y and (explorer.method == "stepping-out" or acceptable(x1)):
                        new = x1
                        break
                    if x1 < x0:
                        lo = x1
                    else:
                        hi = x1
                xs[j] = new
            out[s, r] = torch.tensor(xs, dtype=torch.float64)
    return out


class Wavy:
    """A 2-D energy with two wells, a forbidden strip and ripples along x1: stepping-out and
    doubling both meet several slice pieces and a boundary.  The ripples cut a slice into many
    short pieces, so a doubled interval often holds points from which doubling would have
    stopped earlier: Neal's Fig. 6 test turns such candidates down (several times per sweep
    below, which the doubling comparison asserts)."""

    dim = 2

    def energy(self, x):
        e = (x[:, 0] ** 2 - 1.0) ** 2 * 3.0 + 0.5 * (x[:, 1] - 0.5 * x[:, 0]) ** 2
        e = e + 10.0 * torch.sin(8.0 * x[:, 1]) ** 2
        return torch.where(x[:, 1] > -2.5, e, torch.full_like(e, math.inf))


class CountingSlice(SliceSampler):
    """Counts the candidates that Neal's doubling acceptance test turned down."""

    turned_down = 0

    def _accept_doubling(self, x0, x1, y, left, right, w, evaluate, active):
        ok = super()._accept_doubling(x0, x1, y, left, right, w, evaluate, active)
        self.turned_down += int((active & ~ok).sum())
        return ok


@pytest.mark.parametrize("method", ["stepping-out", "doubling"])
def test_batched_sweep_matches_per_replica_reference(method):
    target = Wavy()
    path = TemperatureLadder([1.0, 3.0, 9.0])
    density = Density(target, path)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 6, 2, generator=g, dtype=torch.float64)
    b = torch.tensor([[1.0, 1 / 3, 1 / 9, 1.0, 1 / 3, 1 / 9],
                      [1 / 9, 1.0, 1 / 3, 1 / 9, 1.0, 1 / 3]], dtype=torch.float64)
    w = torch.tensor([[0.3, 1.0, 2.5, 0.5, 0.15, 1.5],
                      [0.1, 0.7, 4.0, 0.4, 2.0, 0.05]], dtype=torch.float64)
    if method == "doubling":
        w = 0.2 * w  # narrow initial intervals: many doublings, and the acceptance test bites
    explorer = CountingSlice(method, max_steps=5 if method == "stepping-out" else 6)
    for k in range(6):
        noise = Noise(11, k, 2, 6, torch.device("cpu"))
        expected = reference_sweep(explorer, x, b, w, density, noise)
        v, base = density(x)
        new, info = explorer.step(ReplicaState(x, v, base), b, w, density, noise)
        torch.testing.assert_close(new.x, expected, rtol=0, atol=1e-12)
        v2, base2 = density(new.x)
        torch.testing.assert_close(new.v, v2)
        torch.testing.assert_close(new.base, base2)
        assert info.accepted.any()
        x = new.x
    if method == "doubling":
        assert explorer.turned_down > 0  # the comparison covered Neal's Fig. 6 test


def test_slice_arguments_are_checked():
    with pytest.raises(ValueError, match="slice method must be one of"):
        SliceSampler("bracketing")
    with pytest.raises(ValueError, match=r"max_steps must be an integer in \[1, 10000\]"):
        SliceSampler(max_steps=0)
    with pytest.raises(ValueError, match=r"max_shrink must be an integer in \[1, 10000\]"):
        SliceSampler(max_shrink=2.5)
    # unbounded caps are refused (the old code accepted them, and with max_shrink > 1021 its
    # shrinkage columns ran into the doubling columns)
    for bad in (10_001, 10**9, math.inf, math.nan, "64", True):
        with pytest.raises(ValueError, match="max_shrink must be an integer in"):
            SliceSampler(max_shrink=bad)
        with pytest.raises(ValueError, match="max_steps must be an integer in"):
            SliceSampler("doubling", max_steps=bad)
    assert SliceSampler(max_shrink=10_000, max_steps=10_000).max_shrink == 10_000
    assert SliceSampler(max_shrink=np.int64(7)).max_shrink == 7
    assert make_explorer("slice", method="doubling").method == "doubling"


def test_shrink_and_doubling_uniforms_never_coincide_whatever_the_caps():
    # Every column the largest allowed caps can touch: the main stream (level, offset, split and
    # SHRINK0 + i for i < max_shrink) and the doubling stream (i < max_steps).  Two uses of one
    # keyed number would show as two identical [R, P] columns (distinct draws of a continuous
    # law never coincide).  The old layout (doubling side i = main column 1024 + i) fails here:
    # shrinkage proposal 1021 + i reused doubling side i.
    cap = SliceSampler(max_shrink=10_000, max_steps=10_000)
    u = _Uniforms(Noise(3, 7, 2, 3, torch.device("cpu")), 0, 1, torch.float64)
    main = [u(i) for i in range(SHRINK0 + cap.max_shrink)]
    sides = [u.doubling(i) for i in range(cap.max_steps)]
    seen = {tuple(col.flatten().tolist()) for col in main + sides}
    assert len(seen) == len(main) + len(sides)
    # and the streams are keyed per coordinate and per step (sub)
    other = [_Uniforms(Noise(3, 7, 2, 3, torch.device("cpu")), sub, j, torch.float64)
             for sub, j in ((0, 0), (1, 1))]
    for o in other:
        assert not torch.equal(o(0), u(0)) and not torch.equal(o.doubling(0), u.doubling(0))


@pytest.mark.parametrize("method", ["stepping-out", "doubling"])
def test_large_caps_run_and_match_the_reference(method):
    # A width 1e4 times the scale of the target: hundreds of shrinkage proposals per coordinate
    # (past the old overlap at 1021 for some replicas is not needed: the layout test above covers
    # that); the sweep still agrees with the per-replica reference.
    target = Gaussian([0.0], [[1.0]])
    density = Density(target, TemperatureLadder([1.0, 2.0]))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 1, generator=g, dtype=torch.float64)
    b = torch.ones(1, 4, dtype=torch.float64)
    w = torch.full((1, 4), 1e4, dtype=torch.float64)
    explorer = SliceSampler(method, max_shrink=2000, max_steps=3)
    noise = Noise(5, 0, 1, 4, torch.device("cpu"))
    v, base = density(x)
    new, info = explorer.step(ReplicaState(x, v, base), b, w, density, noise)
    torch.testing.assert_close(new.x, reference_sweep(explorer, x, b, w, density, noise),
                               rtol=0, atol=1e-12)
    assert info.accepted.all()  # no replica ran out of shrinkage proposals


# ------------------------------------------------------------------ invariance from exact draws
def run_from_exact(explorer, target, path, b_value, x0, step, steps=3, seed=3):
    """``steps`` explorer steps of N replicas (one system, P = N) at coefficient ``b_value``."""
    n = x0.shape[0]
    density = Density(target, path)
    x = x0.reshape(1, n, -1).to(torch.float64)
    v, base = density(x)
    state = ReplicaState(x, v, base)
    b = torch.full((1, n), float(b_value), dtype=torch.float64)
    h = torch.full((1, n), float(step), dtype=torch.float64)
    nonfinite = torch.zeros(1, n, dtype=torch.bool)
    for k in range(steps):
        state, info = explorer.step(state, b, h, density, Noise(seed, k, 1, n, "cpu"))
        nonfinite |= info.nonfinite
    return state.x[0].numpy(), nonfinite


class WrongLevel(SliceSampler):
    """Negative control: the slice level is drawn at the wrong density, base - 2 b v."""

    def _coordinate(self, x, j, v0, base0, f0, b, w, density, u):
        return super()._coordinate(x, j, v0, base0, 2.0 * f0 - base0, b, w, density, u)


class OneSidedSteppingOut(SliceSampler):
    """Negative control: the stepping-out budget all goes to the left (J = m - 1, K = 0)."""

    def _step_out(self, left, right, y, w, u, evaluate):
        return super()._step_out(left, right, y, w, lambda i: torch.full_like(u(i), 0.9999999)
                                 if i == 2 else u(i), evaluate)


N = 3000
G = torch.Generator().manual_seed(2024)


def _bimodal_case():
    t = bimodal_1d()
    return t, TemperatureLadder([1.0, 2.0]), 1.0, t.sample(N, G), 1.0, [t.cdf]


def _tempered_gaussian_case():
    # N(m, cov) at b = 0.4 is N(m, cov / 0.4)
    t = Gaussian([1.0, -1.0], [[1.0, 0.8], [0.8, 1.5]])
    sd = torch.sqrt(torch.diagonal(t.cov) / 0.4).numpy()
    x = t.mean + (t.sample(N, G) - t.mean) / math.sqrt(0.4)
    cdfs = [stats.norm(t.mean[i].item(), sd[i]).cdf for i in range(2)]
    return t, TemperatureLadder([1.0, 2.5]), 0.4, x, 1.5, cdfs


def _half_normal_case():
    x = torch.randn(N, 1, generator=G, dtype=torch.float64).abs()
    return HalfNormal(), TemperatureLadder([1.0, 2.0]), 1.0, x, 0.8, [stats.halfnorm.cdf]


def _geometric_slot_case():
    t = ScaledGaussianPath(dim=3, c=9.0)
    beta = 0.4
    sd = 1 / math.sqrt(1 + 9.0 * beta)
    cdfs = [stats.norm(0, sd).cdf] * 3
    return t, GeometricPath([1.0, beta, 0.0]), beta, t.sample_at(beta, N, G), 1.0, cdfs


CASES = {"bimodal": _bimodal_case, "tempered-gaussian": _tempered_gaussian_case,
         "half-normal": _half_normal_case, "geometric-slot": _geometric_slot_case}


def ks_pvalues(x, cdfs):
    return [stats.kstest(x[:, i], cdf).pvalue for i, cdf in enumerate(cdfs)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", ["stepping-out", "doubling"])
def test_slice_leaves_its_slot_distribution_invariant(case, method):
    target, path, b, x0, w, cdfs = CASES[case]()
    x, nonfinite = run_from_exact(SliceSampler(method), target, path, b, x0, w)
    p = ks_pvalues(x, cdfs)
    assert min(p) > P_OK, p
    # the draws moved (a kernel that never moves is trivially invariant)
    assert np.mean(np.abs(x - x0.numpy()) > 1e-9) > 0.9
    if case == "half-normal":
        assert (x > 0).all() and nonfinite.any()  # the boundary was met and respected


@pytest.mark.parametrize("explorer,step", [("rwmh", 1.5), ("mala", 0.9), ("hmc", 0.3)])
@pytest.mark.parametrize("case", ["tempered-gaussian", "geometric-slot", "half-normal"])
def test_every_explorer_leaves_its_slot_distribution_invariant(explorer, step, case):
    target, path, b, x0, _, cdfs = CASES[case]()
    ex = make_explorer(explorer, **({"leapfrog_steps": 4} if explorer == "hmc" else {}))
    x, _ = run_from_exact(ex, target, path, b, x0, step, steps=4)
    assert min(ks_pvalues(x, cdfs)) > P_OK


@pytest.mark.parametrize("bad", [WrongLevel, OneSidedSteppingOut])
def test_negative_controls_broken_slice_samplers_are_detected(bad):
    target, path, b, x0, w, cdfs = CASES["tempered-gaussian"]()
    x, _ = run_from_exact(bad(), target, path, b, x0, w)
    assert min(ks_pvalues(x, cdfs)) < P_BAD


def test_slice_explorer_in_pt_samples_the_bimodal_target():
    # As tests/test_invariance.py: 16 independent PT systems give the standard error of
    # P(x > 0); |estimate - truth| < 4.5 se (a t_15 tail of ~1e-3).
    t = bimodal_1d()
    res = nrpt.sample(t, chains=4, max_temperature=30.0, iterations=1000, systems=16,
                      explorer="slice", step_size=2.0, seed=8)
    kept = res.samples[:, 100:, 0]
    per_system = (kept > 0).mean(1)
    se = per_system.std(ddof=1) / math.sqrt(16)
    assert abs(per_system.mean() - 0.7) < 4.5 * se
    assert (per_system > 0.4).all() and (per_system < 0.95).all()  # both modes in every system
