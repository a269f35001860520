"""SWAG math (nrpt.deep.swag): moments against numpy, the sampled covariance against the analytic
one within Monte Carlo error (with a negative control), state round trip, errors."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from nrpt.deep.swag import SWAG

F64 = torch.float64


def _iterates(n: int, d: int, seed: int) -> torch.Tensor:
    """A correlated walk: the later coordinates follow the first, so D̂ has off-diagonal mass."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 1, generator=gen, dtype=F64)
    mix = torch.linspace(1.0, -0.5, d, dtype=F64)
    return 2.0 + base * mix + 0.3 * torch.randn(n, d, generator=gen, dtype=F64)


def test_moments_and_deviations_match_numpy():
    thetas = _iterates(30, 4, seed=1)
    swag = SWAG(4, rank=5)
    for t in thetas:
        swag.collect(t)
    a = thetas.numpy()
    assert swag.n_collected == 30 and swag.n_deviations == 5
    np.testing.assert_allclose(swag.mean.numpy(), a.mean(0), rtol=0, atol=1e-13)
    np.testing.assert_allclose(swag.variance_diag.numpy(), a.var(0), rtol=0, atol=1e-12)
    # columns: theta_i minus the running mean after update i, for the last 5 iterates
    running = np.cumsum(a, axis=0) / np.arange(1, 31)[:, None]
    expect = (a - running)[-5:].T
    np.testing.assert_allclose(swag.deviations.numpy(), expect, rtol=0, atol=1e-13)
    # fewer iterates than rank: all of them, oldest first
    few = SWAG(4, rank=5)
    for t in thetas[:3]:
        few.collect(t)
    np.testing.assert_allclose(few.deviations.numpy(), (a - running)[:3].T, atol=1e-13)


def _cov_check(samples: torch.Tensor, cov: torch.Tensor, k: float = 5.0) -> torch.Tensor:
    """|empirical − analytic| in units of the Monte Carlo sd of each covariance entry.

    For S Gaussian draws the sample covariance ŝ_ij has variance (Σ_ii Σ_jj + Σ_ij²) / S
    (Wishart moments; the mean's estimation adds O(1/S²)); returns the z-scores."""
    s = samples.shape[0]
    emp = torch.cov(samples.T)
    sd = ((torch.outer(cov.diagonal(), cov.diagonal()) + cov ** 2) / s).sqrt()
    return (emp - cov).abs() / sd


def test_samples_have_the_analytic_covariance_and_diag_only_misses_it():
    swag = SWAG(3, rank=4)
    for t in _iterates(40, 3, seed=2):
        swag.collect(t)
    d = swag.deviations
    analytic = 0.5 * (torch.diag(swag.variance_diag) + d @ d.T / 3)
    assert torch.allclose(swag.covariance(), analytic, atol=1e-14)
    samples = swag.sample(torch.Generator().manual_seed(3), num_samples=100_000)
    assert samples.shape == (100_000, 3) and samples.dtype == F64
    # 5 sd per entry (9 entries, 6 distinct): a false alarm has probability < 1e-5
    assert _cov_check(samples, analytic).max() < 5.0
    mean_sd = (analytic.diagonal() / 100_000).sqrt()
    assert ((samples.mean(0) - swag.mean).abs() / mean_sd).max() < 5.0
    # scale multiplies the covariance
    big = swag.sample(torch.Generator().manual_seed(4), scale=2.0, num_samples=100_000)
    assert _cov_check(big, 4 * analytic).max() < 5.0
    # negative control: diag-only samples have the diagonal part only, and the full
    # covariance's off-diagonal entries are then many sd away
    diag = swag.sample(torch.Generator().manual_seed(5), diag_only=True, num_samples=100_000)
    assert _cov_check(diag, swag.covariance(diag_only=True)).max() < 5.0
    z = _cov_check(diag, analytic)
    assert z[0, 1] > 20 and z[0, 2] > 20, z


def test_single_sample_is_keyed_by_the_generator():
    swag = SWAG(3, rank=4)
    for t in _iterates(10, 3, seed=6):
        swag.collect(t)
    x = swag.sample(torch.Generator().manual_seed(0))
    y = swag.sample(torch.Generator().manual_seed(0))
    z = swag.sample(torch.Generator().manual_seed(1))
    assert x.shape == (3,) and torch.equal(x, y) and not torch.equal(x, z)
    # the formula by hand: z1 first, then z2
    gen = torch.Generator().manual_seed(0)
    z1 = torch.randn(3, generator=gen, dtype=F64)
    z2 = torch.randn(4, generator=gen, dtype=F64)
    by_hand = swag.mean + math.sqrt(0.5) * (swag.variance_diag.sqrt() * z1
                                            + swag.deviations @ z2 / math.sqrt(3))
    assert torch.allclose(x, by_hand, atol=1e-14)


def test_state_dict_roundtrip_weights_only_and_resume():
    thetas = _iterates(12, 3, seed=7)
    whole, first = SWAG(3, rank=5), SWAG(3, rank=5)
    for t in thetas:
        whole.collect(t)
    for t in thetas[:7]:
        first.collect(t)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = SWAG(3, rank=5)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    for t in thetas[7:]:
        resumed.collect(t)
    assert resumed.n_collected == 12
    assert torch.equal(resumed.mean, whole.mean)
    assert torch.equal(resumed.variance_diag, whole.variance_diag)
    assert torch.equal(resumed.deviations, whole.deviations)
    with pytest.raises(ValueError, match="dim=3, rank=5"):
        SWAG(3, rank=4).load_state_dict(whole.state_dict())


def test_rank_zero_is_swag_diagonal():
    swag = SWAG(2, rank=0)
    for t in _iterates(5, 2, seed=8):
        swag.collect(t)
    assert swag.deviations.shape == (2, 0)
    full = swag.sample(torch.Generator().manual_seed(0))
    diag = swag.sample(torch.Generator().manual_seed(0), diag_only=True)
    assert torch.equal(full, diag)


def test_errors():
    swag = SWAG(3)
    with pytest.raises(RuntimeError, match="at least 2 collected"):
        swag.sample(torch.Generator())
    with pytest.raises(ValueError, match="theta must be a 1-D tensor of length dim=3"):
        swag.collect(torch.zeros(4))
    with pytest.raises(ValueError, match="theta must be finite"):
        swag.collect(torch.tensor([0.0, float("nan"), 1.0]))
    swag.collect(torch.zeros(3))
    swag.collect(torch.ones(3))
    with pytest.raises(ValueError, match="scale must be a finite number >= 0"):
        swag.sample(torch.Generator(), scale=-1.0)
    with pytest.raises(ValueError, match="dim must be a positive integer"):
        SWAG(0)
    with pytest.raises(ValueError, match="rank must be a non-negative integer"):
        SWAG(3, rank=-1)
